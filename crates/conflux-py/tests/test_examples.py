"""The HCCL-style torch examples under examples/torch run through `conflux run` with the
"conflux" backend, each checking its own result."""

import pytest

from conftest import REPO, launch, ok

EXAMPLES = sorted(p.stem for p in (REPO / "examples" / "torch").glob("*.py"))
RUNS = [(name, 3) for name in EXAMPLES] + [("pipeline", 2), ("all_to_all", 2), ("new_group", 4)]


def test_every_example_is_run():
    assert len(EXAMPLES) >= 9, EXAMPLES


@pytest.mark.parametrize("name,n", RUNS)
def test_example(name, n):
    out = ok(launch(REPO / "examples" / "torch" / f"{name}.py", n))
    assert f"{name} ok" in out, out


def test_the_ladder_runs_every_rung_to_the_same_loss(tmp_path):
    """scripts/ladder on this host (2 ranks, a few steps): every rung and gloo's three train
    the same model to the same loss, and each conflux rung's trace gives its comm share."""
    import json
    import os
    import subprocess
    import sys

    from conftest import conflux_bin
    out = tmp_path / "ladder.json"
    env = dict(os.environ, CONFLUX_BIN=conflux_bin(), PYTHON=sys.executable)
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "ladder"), "--local", "--nodes", "1", "--nproc", "2",
                        "--steps", "5", "--json", str(out), "--svg", str(tmp_path / "l.svg")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r["name"] for r in res["rungs"]] == ["baseline", "fusion", "link", "async", "sched"]
    assert [r["name"] for r in res["gloo"]] == ["baseline", "fusion", "async"]
    assert res["loss_spread"] <= 1e-3, res
    for r in res["rungs"]:
        assert r["samples_per_s"] > 0 and 0 <= r["comm_share"] <= 1 and 0 <= r["compute_util"] <= 1, r
    assert (tmp_path / "l.svg").read_text().startswith("<svg")


def test_the_ladder_starts_buckets_held_early_then_in_forward_order():
    """Rung 5's bucket order (examples/ladder/train.py issue_order): every bucket exactly once;
    the first --hold-mb of what backward makes go last, the next --early-mb first, the rest
    in the order the next forward needs them (highest index first)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("ladder_train", REPO / "examples" / "ladder" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    mb = [2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]  # bucket sizes, in the order backward makes them
    buckets = [[torch.zeros(int(m * 250_000))] for m in mb]  # float32: 4 bytes an element
    assert train.issue_order(buckets, hold_mb=2.0, early_mb=2.0) == [1, 2, 6, 5, 4, 3, 0]
    assert train.issue_order(buckets, hold_mb=0, early_mb=0) == [6, 5, 4, 3, 2, 1, 0]
    assert train.issue_order(buckets, hold_mb=1.9, early_mb=100) == [0, 1, 2, 3, 4, 5, 6]
