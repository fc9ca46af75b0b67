"""reduce_scatter (a list of inputs) and reduce_scatter_tensor (one flat input).

Rank r holds one chunk destined for every rank p; rank p ends up with the SUM over
all ranks of the chunks destined for it, checked against a locally computed reference.
"""
import torch
import torch.distributed as dist


def chunk(r, p):
    """What rank r contributes to rank p's result."""
    return torch.arange(4, dtype=torch.float32) + 10 * r + p


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = sum(chunk(r, rank) for r in range(world))

    # 1. List input: inputs[p] goes to rank p.
    out = torch.empty(4)
    dist.reduce_scatter(out, [chunk(rank, p) for p in range(world)])
    assert torch.equal(out, expected), f"reduce_scatter on rank {rank}: {out} != {expected}"

    # 2. Tensor input: world*4 elements, rank p gets the p-th slice of 4.
    flat = torch.cat([chunk(rank, p) for p in range(world)])
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, flat, op=dist.ReduceOp.SUM)
    assert torch.equal(out, expected), f"reduce_scatter_tensor on rank {rank}: {out}"

    if rank == 0:
        print("reduce_scatter ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
