"""init_process_group with init_method="tcp://" (argv[1] is the port), RANK and WORLD_SIZE from
the environment; several groups in one process; destroy_process_group; CONFLUX_TRANSPORT may
force TCP links. Prints "tcp_init ok" on every rank."""

import os
import sys

import torch
import torch.distributed as dist


def main():
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("conflux", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank, world_size=n)
    t = torch.full((1 << 18,), float(rank))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(n))), t[:4]
    groups = [dist.new_group(list(range(n))) for _ in range(3)]
    for k, g in enumerate(groups):
        x = torch.tensor([float(k + rank)])
        dist.all_reduce(x, group=g, op=dist.ReduceOp.MAX)
        assert x.item() == k + n - 1, (k, x)
    for g in groups:
        dist.destroy_process_group(g)
    dist.barrier()
    dist.destroy_process_group()
    print("tcp_init ok", flush=True)


if __name__ == "__main__":
    main()
