"""Per-communicator options and link health from Python (argv[1]: "numpy" or "torch").

Every rank runs on this host, so the environment's links are shared memory; a group made with
Options(transport="tcp") must use TCP for every pair (its link health says so) and still
compute right; a mismatched or malformed option must fail with a typed error, on every rank.
Prints "options ok" on every rank."""

import sys
from datetime import timedelta

import numpy as np

import conflux


def kinds_of(health, n):
    """The set of link kinds used off the diagonal, checking the matrices' shape on the way."""
    assert len(health.kinds) == n and all(len(row) == n for row in health.kinds), health.kinds
    assert all(health.kinds[i][i] is None for i in range(n))
    assert all(health.latency_us[i][j] > 0 and health.gbps[i][j] > 0 for i in range(n) for j in range(n) if i != j)
    return {health.kinds[i][j] for i in range(n) for j in range(n) if i != j}


def expect(error, call):
    try:
        call()
    except error as e:
        return str(e)
    raise AssertionError(f"expected {error.__name__}")


def numpy_front():
    comm = conflux.init()
    rank, n = comm.rank, comm.size
    assert kinds_of(comm.check_link_health(bytes=1 << 16, iters=3), n) == {"shm"}

    tcp = comm.new_group(range(n), options=conflux.Options(transport="tcp", timeout=30, traffic_class="af41"))
    assert tcp.timeout == 30.0, tcp.timeout
    assert kinds_of(tcp.check_link_health(bytes=1 << 16, iters=3), n) == {"tcp"}
    x = np.arange(1 << 16, dtype=np.float32) * (rank + 1)
    tcp.all_reduce(x)
    assert np.array_equal(x, np.arange(1 << 16, dtype=np.float32) * (n * (n + 1) // 2))

    # A split whose halves use forced algorithms and TCP; the same options on every rank.
    half = comm.split(rank % 2, options=conflux.Options(transport="tcp", algorithm="ring"))
    y = np.full(1000, float(rank), dtype=np.float64)
    half.all_reduce(y)
    assert np.all(y == sum(r for r in range(n) if r % 2 == rank % 2)), y[:3]

    # Ranks disagreeing on a group's options fail together, naming the call.
    mine = conflux.Options(transport="tcp" if rank == 0 else "auto")
    msg = expect(conflux.MismatchError, lambda: comm.new_group(range(n), options=mine))
    assert "transport=tcp" in msg, msg
    # Malformed options are refused before anything collective happens.
    for bad in (conflux.Options(transport="rdma"), conflux.Options(algorithm="nope"),
                conflux.Options(timeout=0), conflux.Options(traffic_class=64), conflux.Options(traffic_class="af5")):
        expect(conflux.InvalidArgument, lambda b=bad: comm.new_group(range(n), options=b))
    expect(conflux.InvalidArgument, lambda: comm.new_group(range(n), options={"transport": "tcp"}))
    comm.barrier()
    comm.shutdown()


def torch_front():
    import torch
    import torch.distributed as dist
    import conflux.torch as ct

    opts = ct.Options(transport="tcp", timeout=timedelta(seconds=45))
    dist.init_process_group("conflux", pg_options=opts)
    rank, n = dist.get_rank(), dist.get_world_size()
    assert ct._backend(None).comm.timeout == 45.0  # the options' timeout wins over the group's
    assert kinds_of(ct.check_link_health(bytes=1 << 16, iters=3), n) == {"tcp"}
    t = torch.arange(1000, dtype=torch.float32) + rank
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * n + sum(range(n)))

    shm = dist.new_group(list(range(n)), pg_options=ct.Options(transport="shm", algorithm="all_reduce:ring"))
    assert kinds_of(ct.check_link_health(group=shm, bytes=1 << 16, iters=3), n) == {"shm"}
    u = torch.full((4096,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(u, group=shm, op=dist.ReduceOp.MAX)
    assert torch.all(u == n), u[:3]
    plain = dist.new_group(list(range(n)))
    assert kinds_of(ct.check_link_health(group=plain, bytes=1 << 16, iters=3), n) == {"shm"}

    try:
        dist.new_group(list(range(n)), pg_options={"transport": "tcp"})
    except Exception as e:  # noqa: BLE001 - torch may wrap the creator's error
        assert "conflux.torch.Options" in str(e), e
    else:
        raise AssertionError("a dict as pg_options was accepted")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    {"numpy": numpy_front, "torch": torch_front}[sys.argv[1]]()
    print("options ok", flush=True)
