"""A torch job across hosts (started by torchrun on each netns node): rank r is on node
r // LOCAL_WORLD_SIZE, so pairs on one node must use shared memory and the others TCP, which
link health shows; an all_reduce and an all_gather give exact results. Prints "nodes ok"."""

import os

import torch
import torch.distributed as dist

import conflux.torch as ct


def main():
    dist.init_process_group("conflux")
    rank, n = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    t = torch.arange(1 << 16, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(1 << 16, dtype=torch.float64) * (n * (n + 1) // 2))
    got = [torch.empty(3, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(got, torch.tensor([rank, rank * 2, rank * 3]))
    assert all(torch.equal(g, torch.tensor([r, r * 2, r * 3])) for r, g in enumerate(got)), got
    kinds = ct.check_link_health(bytes=1 << 16, iters=3).kinds
    for a in range(n):
        for b in range(n):
            want = None if a == b else ("shm" if a // per_node == b // per_node else "tcp")
            assert kinds[a][b] == want, (a, b, kinds)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: nodes ok", flush=True)


if __name__ == "__main__":
    main()
