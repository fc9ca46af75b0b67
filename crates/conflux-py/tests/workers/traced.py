"""A traced job through both fronts; argv[1] is "torch" or "numpy", argv[2] the directory for
rank 0's torch.profiler trace (torch only). CONFLUX_TRACE comes from the environment.

torch: DDP on the "conflux" backend, a sub-group made with new_group, steps marked by the
optimizer hook conflux.torch.mark_steps, and torch.profiler on rank 0, which must see
conflux:all_reduce ranges. numpy: conflux.init() with conflux.mark_step() each step."""

import json
import sys

import numpy as np

import conflux


def with_torch(prof_dir):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import conflux.torch as ct

    dist.init_process_group(backend="conflux")
    rank, n = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ct.mark_steps(opt)
    conflux.mark_step()

    def step(i):
        g = torch.Generator().manual_seed(1000 * i + rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(torch.randn(32, 16, generator=g)), torch.randn(32, 4, generator=g))
        loss.backward()
        if rank < 2:
            t = torch.full((8,), float(rank + 1))
            dist.all_reduce(t, group=pair)
            assert t.tolist() == [3.0] * 8, t
        opt.step()

    for i in range(6):
        step(i)
    if rank == 0:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for i in range(6, 9):
                step(i)
        names = {e.name for e in p.events()}
        assert "conflux:all_reduce" in names, sorted(n for n in names if "conflux" in n or "c10d" in n)
        print("profiler saw", json.dumps(sorted(n for n in names if n.startswith("conflux:"))), flush=True)
    else:
        for i in range(6, 9):
            step(i)
    dist.destroy_process_group()


def with_numpy():
    comm = conflux.init()
    conflux.mark_step()
    for i in range(10):
        buf = np.full(1024, comm.rank + 1, np.float32)
        w = comm.all_reduce(buf, async_op=True)
        w.wait()
        assert (buf == comm.size * (comm.size + 1) / 2).all()
        assert comm.mark_step() == i + 1
    comm.shutdown()


if __name__ == "__main__":
    with_torch(sys.argv[2]) if sys.argv[1] == "torch" else with_numpy()
    print("traced ok", flush=True)
