"""all_reduce with SUM, AVG and MAX on the "conflux" backend.

Every rank contributes a tensor built from its rank; each rank checks the result
against the value computed from the known inputs of all ranks.
"""
import torch
import torch.distributed as dist


def contribution(r):
    return torch.arange(8, dtype=torch.float32) * (r + 1) + r


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = torch.stack([contribution(r) for r in range(world)])

    for op, expected in [(dist.ReduceOp.SUM, everyone.sum(0)),
                         (dist.ReduceOp.AVG, everyone.mean(0)),
                         (dist.ReduceOp.MAX, everyone.max(0).values)]:
        t = contribution(rank)
        dist.all_reduce(t, op=op)
        assert torch.allclose(t, expected), f"{op}: rank {rank} got {t}, expected {expected}"

    # Integer tensors reduce exactly.
    t = torch.full((4,), rank + 1, dtype=torch.int64)
    dist.all_reduce(t)  # SUM is the default op
    assert torch.equal(t, torch.full((4,), world * (world + 1) // 2, dtype=torch.int64)), t

    if rank == 0:
        print("all_reduce ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
