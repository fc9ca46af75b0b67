"""A wait on a torch Work, made inside the C++ backend where conflux cannot see it, reaches
the trace (CONFLUX_TRACE): rank 1 joins an all_reduce 0.5 s late, rank 0 waits on the Work.
Prints "traced wait ok" on every rank."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("conflux")
    rank = dist.get_rank()
    dist.barrier()
    t = torch.ones(1 << 10)
    if rank == 1:
        time.sleep(0.5)
    dist.all_reduce(t, async_op=True).wait()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: traced wait ok", flush=True)


if __name__ == "__main__":
    main()
