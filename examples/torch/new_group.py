"""Sub-groups with dist.new_group: one of the even ranks, one of the odd ranks.

Every rank calls new_group for both groups (torch requires all ranks to take part in
creating every group), then all_reduces only within the group it belongs to.
"""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()

    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    groups = {0: dist.new_group(ranks=evens), 1: dist.new_group(ranks=odds)}
    members = evens if rank % 2 == 0 else odds
    group = groups[rank % 2]

    assert dist.get_world_size(group) == len(members)
    assert dist.get_rank(group) == members.index(rank)

    t = torch.tensor([float(rank), 1.0])
    dist.all_reduce(t, group=group)
    expected = torch.tensor([float(sum(members)), float(len(members))])
    assert torch.equal(t, expected), f"rank {rank} in {members}: {t} != {expected}"

    # The default group still spans everyone.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world

    if rank == 0:
        print("new_group ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
