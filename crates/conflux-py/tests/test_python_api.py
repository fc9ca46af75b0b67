"""The Python package on numpy arrays and buffer-protocol objects, at several world sizes."""

import pytest

from conftest import WORKERS, launch, ok, spawn


@pytest.mark.parametrize("n", [1, 2, 3])
def test_numpy_and_buffers(n):
    out = ok(launch(WORKERS / "numpy_api.py", n))
    assert out.count("checks passed") == n


def test_completion_callbacks_run_once_on_the_thread_that_is_in_the_call():
    out = ok(launch(WORKERS / "callbacks.py", 2, timeout=120))
    assert out.count("checks passed") == 2


@pytest.mark.parametrize("n,transport", [(2, "auto"), (3, "tcp")])
def test_asynchronous_calls_waited_on_in_random_ways_all_complete_right(n, transport):
    # Caught the Python API's reduce_scatter returning from wait() before its copy-out ran
    # (40 of 67252 checks failed in 30 s before callback.rs).
    out = ok(launch(WORKERS / "async_soak.py", n, 8, 7, env={"CONFLUX_TRANSPORT": transport}, timeout=180))
    assert out.count("checks passed") == n


def test_per_communicator_options_and_link_health():
    # The environment gives shared memory; Options(transport="tcp") must give TCP, per group.
    out = ok(launch(WORKERS / "options.py", 3, "numpy", timeout=120))
    assert out.count("options ok") == 3


def test_survivors_shrink_and_go_on_after_a_rank_dies():
    procs = spawn(WORKERS / "shrink.py", 3)
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[2].returncode == 3, outs[2]
    for r in (0, 1):
        assert procs[r].returncode == 0 and "shrink ok" in outs[r][0], outs[r]


def test_the_native_stubs_name_every_method_and_ship_with_py_typed():
    import ast
    from pathlib import Path

    import conflux
    from conflux import _native

    pkg = Path(conflux.__file__).parent
    assert (pkg / "py.typed").exists()
    tree = ast.parse((pkg / "_native.pyi").read_text())
    stubbed = {c.name: {f.name for f in c.body if isinstance(f, ast.FunctionDef)}
               for c in tree.body if isinstance(c, ast.ClassDef)}
    for cls in ("Comm", "Work"):
        public = {m for m in dir(getattr(_native, cls)) if not m.startswith("_")}
        assert public == stubbed[cls], (cls, public ^ stubbed[cls])
