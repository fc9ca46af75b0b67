"""all_to_all with lists of tensors, and all_to_all_single with uneven split sizes.

In the uneven case rank r sends r+p+1 rows to rank p, so every rank receives a
different number of rows from every peer; each rank checks what arrived from whom.
"""
import torch
import torch.distributed as dist


def rows(src, dst, n):
    """n rows of width 2 that rank src sends to rank dst."""
    return torch.arange(n * 2, dtype=torch.float32).view(n, 2) + 1000 * src + 10 * dst


def main():
    dist.init_process_group(backend="conflux")
    rank, world = dist.get_rank(), dist.get_world_size()

    # 1. Lists: inputs[p] goes to rank p, outputs[s] comes from rank s.
    inputs = [rows(rank, p, 3) for p in range(world)]
    outputs = [torch.empty(3, 2) for _ in range(world)]
    dist.all_to_all(outputs, inputs)
    for s, o in enumerate(outputs):
        assert torch.equal(o, rows(s, rank, 3)), f"all_to_all: from {s} on rank {rank}: {o}"

    # 2. One tensor each way, uneven: rank r sends r+p+1 rows to rank p.
    send_sizes = [rank + p + 1 for p in range(world)]
    recv_sizes = [s + rank + 1 for s in range(world)]
    send = torch.cat([rows(rank, p, n) for p, n in enumerate(send_sizes)])
    recv = torch.empty(sum(recv_sizes), 2)
    dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
    expected = torch.cat([rows(s, rank, n) for s, n in enumerate(recv_sizes)])
    assert torch.equal(recv, expected), f"all_to_all_single on rank {rank}: {recv}"

    if rank == 0:
        print("all_to_all ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
