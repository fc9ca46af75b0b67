"""One rank fails after the first barrier (argv[1]: "raise", "kill", or "stall": it sleeps
past the others' timeout; "kill_irecv": killed while the others wait on an irecv from it, and
on that receive's future; argv[2]: its rank); the others, already in an all_reduce (or the
receive), must get a conflux exception naming it: within seconds when it dies (timeout 60 s), at their timeout
(argv[3] seconds) when it stalls. Each survivor prints: RESULT <class> <blamed rank> <seconds>."""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    mode, victim = sys.argv[1], int(sys.argv[2])
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    dist.init_process_group(backend="conflux", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    dist.barrier()
    if rank == victim:
        if mode in ("kill", "kill_irecv"):
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "stall":
            time.sleep(timeout + 10)
            os._exit(3)
        raise RuntimeError("this rank fails on purpose")
    t = torch.ones(1 << 16)
    start = time.monotonic()
    try:
        if mode == "kill_irecv":
            work = dist.irecv(t, victim)
            future = work.get_future()
            try:
                work.wait()
            finally:
                # The Work itself tells the failure too (a C++ backend's Work can; see README).
                if os.environ.get("CONFLUX_TORCH_BACKEND", "auto") != "python":
                    print(f"WORK completed={work.is_completed()} success={work.is_success()} "
                          f"exception={work.exception() is not None}", flush=True)
                # The receive's future carries the same failure, once the wait has returned.
                if not future.done():
                    print("FUTURE not done after wait() raised", flush=True)
                    os._exit(1)
                try:
                    future.wait()
                    print("FUTURE completed without an error", flush=True)
                    os._exit(1)
                except Exception as e:  # noqa: BLE001
                    print(f"FUTURE {type(e).__name__}", flush=True)
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
