"""Data-parallel gradient averaging, the way DDP does it by hand.

Each rank computes gradients of a tiny nn.Linear on its own shard of a batch, the
gradients are all_reduced (SUM) and divided by the world size, and the result must
equal the gradient computed locally on the full batch.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

PER_RANK = 4


def model():
    torch.manual_seed(0)  # same initial weights on every rank
    return nn.Linear(5, 3)


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1234)  # the full batch, known to every rank
    x, y = torch.randn(PER_RANK * world, 5, generator=g), torch.randn(PER_RANK * world, 3, generator=g)
    loss_fn = nn.MSELoss()

    net = model()
    shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    loss_fn(net(x[shard]), y[shard]).backward()
    for p in net.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= world

    reference = model()
    loss_fn(reference(x), y).backward()
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), f"rank {rank}: {name} grad {p.grad} != {q.grad}"

    if rank == 0:
        print("gradient_averaging ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
