"""A two-stage pipeline over point-to-point send/recv.

Even rank r (stage 0) sends micro-batch activations to rank r+1 (stage 1), which
applies its function and checks; the activations go by blocking send/recv, and a
returned acknowledgement by isend/irecv. With an odd world size the last rank idles.
"""
import torch
import torch.distributed as dist

MICRO_BATCHES, SHAPE = 4, (8, 16)


def activations(r, i):
    return torch.arange(8 * 16, dtype=torch.float32).view(SHAPE) * (i + 1) + r


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()

    if rank % 2 == 0 and rank + 1 < world:  # stage 0
        for i in range(MICRO_BATCHES):
            dist.send(activations(rank, i), dst=rank + 1)
        ack = torch.empty(MICRO_BATCHES)
        dist.irecv(ack, src=rank + 1).wait()
        expected = torch.stack([torch.relu(activations(rank, i) * 2).sum() for i in range(MICRO_BATCHES)])
        assert torch.equal(ack, expected), f"rank {rank} got ack {ack}"
    elif rank % 2 == 1:  # stage 1
        sums = []
        for i in range(MICRO_BATCHES):
            x = torch.empty(SHAPE)
            dist.recv(x, src=rank - 1)
            assert torch.equal(x, activations(rank - 1, i)), f"rank {rank}: micro-batch {i} wrong"
            sums.append(torch.relu(x * 2).sum())  # the stage's "function"
        dist.isend(torch.stack(sums), dst=rank - 1).wait()
    # else: the last rank of an odd world has no partner and idles.

    dist.barrier()
    if rank == 0:
        print("pipeline ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
