"""One rank fails after the first barrier (argv[1]: "raise" or "kill"; argv[2]: its rank);
the others, already in an all_reduce, must get a conflux exception naming it, long before
the 60 s timeout. Each survivor prints one line: RESULT <class> <blamed rank> <seconds>."""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    mode, victim = sys.argv[1], int(sys.argv[2])
    dist.init_process_group(backend="conflux", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    dist.barrier()
    if rank == victim:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("this rank fails on purpose")
    t = torch.ones(1 << 16)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the test inspects what arrived
        took = time.monotonic() - start
        print(f"RESULT {type(e).__module__}.{type(e).__name__} {getattr(e, 'rank', None)} {took:.3f}", flush=True)
        print(f"MESSAGE {e}", flush=True)
        os._exit(0)
    print("RESULT none None 0", flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()
