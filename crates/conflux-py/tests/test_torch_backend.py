"""The torch.distributed backend "conflux": every method, dtype and op against torch-computed
references, DDP against gloo, failures named on the surviving ranks."""

import time

import pytest
import torch

from conftest import WORKERS, launch, ok, spawn


@pytest.mark.parametrize("n,quick", [(1, False), (2, False), (3, False), (4, True)])
def test_every_method_dtype_and_op(n, quick):
    out = ok(launch(WORKERS / "torch_methods.py", n, *(["--quick"] if quick else [])))
    assert out.count("checks passed") == n


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_gloo(tmp_path, n):
    params = {}
    for backend in ["conflux", "gloo"]:
        ok(launch(WORKERS / "ddp.py", n, backend, tmp_path / f"{backend}.pt"))
        params[backend] = torch.load(tmp_path / f"{backend}.pt")
    worst, moved = 0.0, 0.0
    for name, mine in params["conflux"]["final"].items():
        ref = params["gloo"]["final"][name]
        # Relative to the tensor's scale: ranks sum in a different order than gloo when n > 2.
        worst = max(worst, ((mine - ref).abs().max() / ref.abs().max()).item())
        moved = max(moved, (ref - params["gloo"]["init"][name]).abs().max().item())
    assert moved > 1e-3, "training did not change the parameters: the comparison would prove nothing"
    assert worst <= 1e-6, f"largest relative difference from gloo: {worst}"


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_failed_rank_is_named_on_the_others(mode):
    n, victim = 3, 1
    procs = spawn(WORKERS / "failure.py", n, mode, victim)
    start = time.monotonic()
    outs = [p.communicate(timeout=90) for p in procs]
    wall = time.monotonic() - start
    assert procs[victim].returncode != 0
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        if r == victim:
            continue
        line = next((x for x in out.splitlines() if x.startswith("RESULT")), None)
        assert line, f"rank {r} printed no result\n{out}\n{err[-3000:]}"
        _, cls, blamed, secs = line.split()
        assert cls.startswith("conflux.errors."), line
        assert blamed == str(victim), f"rank {r}: {line}\n{out}"
        assert float(secs) < 10, f"rank {r} took {secs}s to notice (timeout is 60 s)"
    assert wall < 60
