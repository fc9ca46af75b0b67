"""What the C++ backend answers that a Python backend could not (issue: "torch backend in
C++"): run under `conflux run` at 2+ ranks. Prints "cpp backend ok" on every rank.

- the group's backend is the C++ one (unless CONFLUX_TORCH_BACKEND=python asks otherwise);
- dist.recv(t) without src returns the rank that sent;
- a Work's is_completed() turns True when the call completes, with nobody waiting;
- DDP's logging data names the backend "conflux";
- torch.profiler shows each collective as "conflux:<op>"."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import conflux.torch as ct
from conflux.errors import CommTimeout


def main():
    dist.init_process_group("conflux")
    rank, n = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    if os.environ.get("CONFLUX_TORCH_BACKEND", "auto") != "python":
        assert type(backend).__module__ == "conflux._c10d", f"not the C++ backend: {type(backend)}"

    # recv without src: every other rank sends its rank to rank 0, which learns who sent.
    if rank == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.zeros(3, dtype=torch.int64)
            src = dist.recv(t)
            assert torch.equal(t, torch.full((3,), 10 * src)), (src, t)
            senders.append(src)
        assert sorted(senders) == list(range(1, n)), senders
    else:
        dist.send(torch.full((3,), 10 * rank, dtype=torch.int64), 0)

    # is_completed() by polling alone; is_success() once it is.
    t = torch.ones(1 << 12)
    w = dist.all_reduce(t, async_op=True)
    deadline = time.monotonic() + 30
    while not w.is_completed() and time.monotonic() < deadline:
        time.sleep(0.0001)
    assert w.is_completed() and w.is_success() and w.exception() is None
    assert torch.all(t == n)

    # DDP names the backend.
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
    name = model._get_ddp_logging_data().get("backend_name")
    assert name == "conflux", name

    # The profiler sees collectives as gloo's: one range per call, named after the operation.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(8))
        dist.broadcast(torch.ones(8), 0)
    names = {e.name for e in prof.events()}
    assert {"conflux:all_reduce", "conflux:broadcast"} <= names, sorted(x for x in names if "conflux" in x)

    # torch's flight recorder has them too, under the backend's name (as gloo's under "gloo").
    import json
    from torch._C import _distributed_c10d as c10d
    recorded = json.loads(c10d._dump_fr_trace_json(True, False, "conflux")).get("entries", [])
    names = [e.get("profiling_name") for e in recorded]
    assert "conflux:all_reduce" in names and "conflux:broadcast" in names, names

    # Status of every rank, from this one's view.
    st = ct.status()
    assert [s["alive"] for s in st] == [True] * n and [s["rank"] for s in st] == list(range(n)), st
    assert all(s["links"] == ("self" if s["rank"] == rank else "shm") for s in st), st
    assert all(s["last_call"] and s["last_call"].startswith("#") for s in st), st

    # Link health of the default group, through the backend's communicator.
    kinds = ct.check_link_health(bytes=1 << 12, iters=2).kinds
    assert all(kinds[i][j] == ("shm" if i != j else None) for i in range(n) for j in range(n)), kinds
    # A per-call timeout (torch's opts.timeout) bounds that call alone: rank 0 calls on a group
    # where nobody else does, and fails after 1 s instead of the group's 10 minutes.
    if os.environ.get("CONFLUX_TORCH_BACKEND", "auto") != "python":
        lonely = dist.new_group(list(range(n)))
        if rank == 0:
            opts = dist.AllreduceOptions()
            opts.timeout = timedelta(seconds=1)
            start = time.monotonic()
            try:
                lonely.allreduce([torch.ones(4)], opts).wait()
                raise AssertionError("an all_reduce nobody else joined completed")
            except CommTimeout:
                took = time.monotonic() - start
                assert 0.9 < took < 10, took
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: cpp backend ok", flush=True)


if __name__ == "__main__":
    main()
