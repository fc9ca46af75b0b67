"""DDP training, traced: where each step's time goes, and who the others wait for.

    CONFLUX_TRACE=/tmp/trace conflux run -n 4 examples/torch/traced_ddp.py
    conflux trace report /tmp/trace --svg steps.svg      # tables, straggler, a picture
    conflux trace merge /tmp/trace -o trace.json         # open in Perfetto / chrome://tracing

One line marks the steps: ``conflux.torch.mark_steps(optimizer)``. Without CONFLUX_TRACE it
costs nothing and the job runs as usual.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import conflux.torch

STEPS = 30


def main():
    dist.init_process_group(backend="conflux")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(512, 10)), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    conflux.torch.mark_steps(opt)  # a step boundary each time opt.step() finishes
    conflux.mark_step()  # and the first step's start
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"traced_ddp: loss {loss.item():.4f} after {STEPS} steps")
        print("traced_ddp ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
