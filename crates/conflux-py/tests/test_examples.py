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
