"""all_gather into a list of tensors, and all_gather_into_tensor into one buffer.

Rank r contributes a 2x3 tensor filled from r; every rank checks that it received
every rank's block, in rank order.
"""
import torch
import torch.distributed as dist


def block(r):
    return torch.arange(6, dtype=torch.float32).view(2, 3) + 100 * r


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = block(rank)

    # 1. Into a list: one output tensor per rank.
    outs = [torch.empty(2, 3) for _ in range(world)]
    dist.all_gather(outs, mine)
    for r, o in enumerate(outs):
        assert torch.equal(o, block(r)), f"all_gather: block {r} on rank {rank} is {o}"

    # 2. Into one tensor: blocks concatenated along dim 0 (world*2 x 3).
    out = torch.empty(world * 2, 3)
    dist.all_gather_into_tensor(out, mine)
    expected = torch.cat([block(r) for r in range(world)])
    assert torch.equal(out, expected), f"all_gather_into_tensor on rank {rank}: {out}"

    if rank == 0:
        print("all_gather ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
