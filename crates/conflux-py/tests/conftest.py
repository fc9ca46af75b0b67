"""Helpers that start real rank processes: through `conflux run`, as users do, or one by one
with torchrun's environment, when a test needs to watch a rank die without the launcher
stopping the others."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WORKERS = Path(__file__).resolve().parent / "workers"


def conflux_bin():
    path = Path(os.environ.get("CONFLUX_BIN", REPO / "target" / "release" / "conflux"))
    if not path.exists():
        pytest.fail(f"{path} is missing: build it first (cargo build --release)")
    return str(path)


def launch(script, n, *args, timeout=300, env=None):
    """Runs `script` at `n` ranks with `conflux run`; returns the CompletedProcess."""
    e = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    cmd = [conflux_bin(), "run", "-n", str(n), str(script), *map(str, args)]
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(script, n, *args, env=None):
    """Starts `n` ranks of `script` directly, with torchrun's variables; returns the Popens."""
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **(env or {}))
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def ok(proc):
    """Asserts a launched job succeeded, showing its output when it did not."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc.stdout
