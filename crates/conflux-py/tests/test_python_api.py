"""The Python package on numpy arrays and buffer-protocol objects, at several world sizes."""

import pytest

from conftest import WORKERS, launch, ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_numpy_and_buffers(n):
    out = ok(launch(WORKERS / "numpy_api.py", n))
    assert out.count("checks passed") == n
