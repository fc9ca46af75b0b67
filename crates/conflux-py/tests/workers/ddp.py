"""DistributedDataParallel trains a small model for 20 steps under the backend given in argv[1];
rank 0 saves the initial and final parameters to argv[2]. Run under "conflux" and "gloo" and compared."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    backend, out = sys.argv[1], sys.argv[2]
    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts it)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # A tiny bucket cap: several buckets, each all-reduced asynchronously during backward.
    ddp = DDP(model, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(20):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = torch.randn(32, 4, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    if rank == 0:
        final = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save({"init": init, "final": final}, out)
        print(f"{backend}: final loss {loss.item():.6f}", flush=True)
    if backend == "gloo":
        # The reference run only has to produce its parameters: gloo's teardown has been seen
        # to abort ("terminate called without an active exception") on this 2-core machine.
        dist.barrier()
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
