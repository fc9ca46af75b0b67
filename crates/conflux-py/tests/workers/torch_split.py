"""torch's split_group and shrink_group on conflux groups, at 4 ranks started one process per
rank (rank 3 dies on purpose, which `conflux run` would answer by stopping the job).

1. split_group([[0, 1], [2, 3]]): each pair sums on its own group.
2. split_group([[2, 0]]): ranks 1 and 3 are no member; 2 and 0 (group ranks 0 and 1, in
   that order) gather their world ranks.
3. shrink_group([1]) on the pairs' group of ranks 0 and 1 is refused on rank 1 (it is
   excluded); rank 0 alone shrinks it to a group of one.
4. Rank 3 dies; the others' all_reduce fails naming it; shrink_group([3], SHRINK_ABORT) makes
   a default group of 0, 1, 2 that computes right.
Prints "split ok" on ranks 0-2."""

import os
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import SHRINK_ABORT

import conflux.torch  # noqa: F401  (registers the backend)
from conflux.errors import PeerError


def main():
    dist.init_process_group("conflux")
    rank = dist.get_rank()
    assert dist.get_world_size() == 4

    pairs = dist.split_group(split_ranks=[[0, 1], [2, 3]])
    assert pairs is not None and pairs.size() == 2 and pairs.rank() == rank % 2, (pairs, rank)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=pairs)
    want = 3.0 if rank < 2 else 7.0
    assert t.item() == want, (rank, t)

    # Group ranks follow the list's order; the others are no member.
    odd = dist.split_group(split_ranks=[[2, 0]])
    if rank in (1, 3):
        assert odd is dist.GroupMember.NON_GROUP_MEMBER, odd
    else:
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        dist.all_gather(out, torch.tensor([rank]), group=odd)
        assert [int(x) for x in out] == [2, 0], out
        assert odd.rank() == (0 if rank == 2 else 1), odd.rank()

    if rank < 2:
        if rank == 1:
            try:
                dist.shrink_group([1], group=pairs)
                raise AssertionError("an excluded rank's shrink_group succeeded")
            except (RuntimeError, ValueError) as e:
                assert "exclude" in str(e).lower(), e
        else:
            alone = dist.shrink_group([1], group=pairs)
            assert alone.size() == 1 and alone.rank() == 0
            t = torch.tensor([5.0])
            dist.all_reduce(t, group=alone)
            assert t.item() == 5.0

    dist.barrier()
    if rank == 3:
        os._exit(3)  # dies without a goodbye
    try:
        dist.all_reduce(torch.ones(1 << 16))
        raise AssertionError("the all_reduce with a dead rank succeeded")
    except PeerError as e:
        assert e.rank == 3, (e.rank, str(e))
    small = dist.shrink_group([3], shrink_flags=SHRINK_ABORT)
    assert (small.rank(), small.size()) == (rank, 3), (small.rank(), small.size())
    assert dist.get_world_size() == 3  # the shrunk group is the default one now
    # torch aborted the other groups (the pairs, [2, 0]) as it finished the shrink. Those
    # aborts must not fail the new group: rank 0 comes late, so the others wait long enough to
    # hear from the store.
    if rank == 0:
        time.sleep(0.5)
    y = torch.arange(100, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(y)
    assert torch.equal(y, torch.arange(100, dtype=torch.float32) * 6)
    print(f"rank {rank}: split ok", flush=True)
    dist.destroy_process_group()
    os._exit(0)  # the dead rank's goodbye never comes


if __name__ == "__main__":
    main()
