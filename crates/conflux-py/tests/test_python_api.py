"""The Python package on numpy arrays and buffer-protocol objects, at several world sizes."""

import pytest

from conftest import WORKERS, launch, ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_numpy_and_buffers(n):
    out = ok(launch(WORKERS / "numpy_api.py", n))
    assert out.count("checks passed") == n


def test_completion_callbacks_run_once_on_the_thread_that_is_in_the_call():
    out = ok(launch(WORKERS / "callbacks.py", 2, timeout=120))
    assert out.count("checks passed") == 2
