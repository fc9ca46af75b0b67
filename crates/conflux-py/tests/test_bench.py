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
