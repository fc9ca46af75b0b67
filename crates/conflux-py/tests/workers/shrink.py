"""Shrink from Python, 3 ranks. First by choice: callers that disagree on the ranks to leave
out all get a MismatchError; then ranks 0 and 1 leave rank 2 (alive, not calling) out and
compute on the two of them. Then after a failure: the last rank dies after an all_reduce; the
others see a PeerError naming it, shrink to the survivors and go on computing right.
Started one process per rank (not by `conflux run`, which would stop the job). Prints
"shrink ok" on each survivor."""

import os

import numpy as np

import conflux


def main():
    comm = conflux.init(timeout=30)
    rank, n = comm.rank, comm.size
    x = np.full(8, float(rank))
    comm.all_reduce(x)
    assert np.all(x == sum(range(n)))

    try:
        comm.shrink(exclude=[n - 1] if rank == 0 else [])
        raise AssertionError("a shrink with different exclusions succeeded")
    except conflux.MismatchError as e:
        assert "exclude" in str(e), e
    if rank < n - 1:
        pair = comm.shrink(exclude=[n - 1])
        assert (pair.rank, pair.size) == (rank, n - 1), (pair.rank, pair.size)
        z = np.full(4, rank + 1.0)
        pair.all_reduce(z)
        assert np.all(z == sum(r + 1 for r in range(n - 1))), z
        pair.shutdown()

    if rank == n - 1:
        os._exit(3)  # dies without a goodbye
    try:
        comm.all_reduce(np.ones(1 << 16))
        raise AssertionError("the all_reduce with a dead rank succeeded")
    except conflux.PeerError as e:
        assert e.rank == n - 1, (e.rank, str(e))
    # Status names the dead rank without waiting for it, and where everybody last was.
    st = comm.status()
    assert [s["rank"] for s in st] == list(range(n)), st
    assert [s["alive"] for s in st] == [True] * (n - 1) + [False], st
    assert [s["links"] for s in st] == ["self" if r == rank else "shm" for r in range(n)], st
    assert st[n - 1]["last_call"].startswith("#1 all_reduce(double x 8,"), st  # the one it joined
    assert st[rank]["last_call"].startswith("#2 all_reduce(double x 65536,"), st
    small = comm.shrink()
    assert (small.rank, small.size) == (rank, n - 1), (small.rank, small.size)
    y = np.arange(100, dtype=np.float32) * (rank + 1)
    small.all_reduce(y)
    assert np.array_equal(y, np.arange(100, dtype=np.float32) * sum(r + 1 for r in range(n - 1)))
    small.shutdown()
    print(f"rank {rank}: shrink ok", flush=True)
    os._exit(0)  # the job's first communicator still waits for the dead rank's goodbye


if __name__ == "__main__":
    main()
