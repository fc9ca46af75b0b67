"""Overlapping communication with compute through async_op=True.

all_reduce of a large tensor starts, a matmul runs while it is in flight, then
work.wait() makes the result available; a second all_reduce is awaited via its future.
"""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()

    big = torch.full((4_000_000,), float(rank + 1))
    work = dist.all_reduce(big, async_op=True)

    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    product = a @ a  # compute that overlaps the all_reduce

    work.wait()
    assert torch.all(big == world * (world + 1) / 2), f"rank {rank}: {big[:4]}"
    assert product.shape == (256, 256)

    # The same through the Work's future: its value is the list of output tensors.
    t = torch.arange(5, dtype=torch.float64) * (rank + 1)
    fut = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).get_future()
    (result,) = fut.wait()
    expected = torch.arange(5, dtype=torch.float64) * world
    assert torch.equal(result, expected) and torch.equal(t, expected), f"rank {rank}: {result}"

    if rank == 0:
        print("async_overlap ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
