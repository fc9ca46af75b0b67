"""Gradient fusion: flatten several tensors into one buffer, all_reduce once, split back.

One large all_reduce is cheaper than many small ones. The gradients have different
shapes; after torch.split + view_as each must equal the sum over ranks.
"""
import torch
import torch.distributed as dist

SHAPES = [(4, 3), (3,), (2, 2, 5), (1,)]


def grads(r):
    g = torch.Generator().manual_seed(r)
    return [torch.randn(s, generator=g) for s in SHAPES]


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = grads(rank)

    flat = torch.cat([g.reshape(-1) for g in mine])
    dist.all_reduce(flat)
    reduced = [piece.view_as(g) for piece, g in zip(torch.split(flat, [g.numel() for g in mine]), mine)]

    everyone = [grads(r) for r in range(world)]
    for i, got in enumerate(reduced):
        expected = sum(ranks_grads[i] for ranks_grads in everyone)
        assert got.shape == SHAPES[i], f"gradient {i} has shape {got.shape}"
        assert torch.allclose(got, expected, atol=1e-6), f"gradient {i} on rank {rank}: {got}"

    if rank == 0:
        print("fused_gradients ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
