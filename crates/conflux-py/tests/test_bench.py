"""`python -m conflux.bench` times torch.distributed over conflux beside gloo; with --check every
operation's result is compared with the exact one on both backends."""

import sys

import conflux.bench

from conftest import launch, ok


def test_every_operation_agrees_with_gloo_and_the_exact_result():
    # As a module, as its users run it: run as a file, its folder would shadow torch.
    out = ok(launch(sys.executable, 3, "-m", "conflux.bench", "--op", "all", "-b", "8", "-e", "2K", "-f", "256",
                    "--iters", "5", "--check"))
    text = out.replace("[0]: ", "")
    for op in conflux.bench.OPS:
        assert f"# {op}\n" in text, (op, out)
    assert "check: all results agree" in text, out


def test_overhead_times_every_layer_beside_torchs_own_floor():
    """`--overhead` puts a number on each layer of an 8-byte call, torch's no-op backend among
    them, so that what conflux adds over torch itself is measured in the same run."""
    out = ok(launch(sys.executable, 2, "-m", "conflux.bench", "--overhead", "--rounds", "1", "--iters", "200",
                    "--no-rust"))
    text = out.replace("[0]: ", "")
    rows = {}
    for line in text.splitlines():
        parts = line.rsplit(None, 4)
        if len(parts) == 5 and not line.startswith("#"):
            rows[parts[0].strip()] = float(parts[1])
    for name in ("torch.distributed, backend conflux", conflux.bench.FAKE_ROW, conflux.bench.BACKEND_ROW,
                 conflux.bench.FAKE_BACKEND_ROW, "conflux._native.Comm.all_reduce (raw triple)"):
        assert name in rows and rows[name] > 0, (name, out)
    assert "conflux's backend over fake's, both called directly" in text, out
