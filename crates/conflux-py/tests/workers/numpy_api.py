"""The plain Python API on numpy arrays and buffer-protocol objects, checked against numpy
references computed from every rank's (known) input. Launched per rank by `conflux run`."""

import array
from functools import reduce

import numpy as np

import conflux
from report import finish

failures, checks = [], 0


def check(what, got, want):
    global checks
    checks += 1
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == np.float16:
        same = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3)
    else:
        same = got.dtype == want.dtype and np.array_equal(got, want)
    if not same:
        failures.append(f"{what}: got {got.ravel()[:6]} ({got.dtype}) want {want.ravel()[:6]} ({want.dtype})")


def inp(dtype, op, rank, count, salt=0):
    i = np.arange(count) + salt
    if dtype == np.bool_:
        return (i + rank) % 3 == 0
    v = np.array([1, 2, -1])[(i + rank) % 3] if op == "prod" else (i * 7 + rank * 5) % 11 - 5
    return (np.abs(v) if dtype == np.uint8 else v).astype(dtype)


def ref(dtype, op, xs, n):
    if dtype == np.bool_:
        f = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or, "prod": np.logical_and,
             "min": np.logical_and, "band": np.logical_and, "bxor": np.logical_xor}[op]
        return reduce(f, xs)
    wide = np.float64 if np.issubdtype(dtype, np.floating) else np.int64
    s = np.stack(xs).astype(wide)
    if op == "avg":
        out = s.sum(0) / n if wide == np.float64 else np.trunc(s.sum(0) / n).astype(np.int64)
    else:
        f = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
             "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        out = f.reduce(s, axis=0)
    return out.astype(dtype)


FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int8, np.uint8, np.int16, np.int32, np.int64]


def main():
    c = conflux.init(timeout=60)
    rank, n = c.rank, c.size
    for dtype in FLOATS + INTS + [np.bool_]:
        ops = ["sum", "prod", "min", "max"] + (["band", "bor", "bxor"] if dtype not in FLOATS else [])
        ops += ["avg"] if dtype != np.bool_ else []
        for op in ops:
            for count in [1, 1000]:
                xs = [inp(dtype, op, r, count) for r in range(n)]
                a = xs[rank].copy()
                c.all_reduce(a, op=op)
                check(f"all_reduce {dtype.__name__} {op} x{count}", a, ref(dtype, op, xs, n))
                a = xs[rank].copy()
                c.reduce(a, root=n - 1, op=op)
                check(f"reduce {dtype.__name__} {op}", a, ref(dtype, op, xs, n) if rank == n - 1 else xs[rank])
                blocks = [inp(dtype, op, r, n * count, salt=5) for r in range(n)]
                out = np.empty(count, dtype)
                c.reduce_scatter(blocks[rank], out, op=op)
                want = ref(dtype, op, [b[rank * count:(rank + 1) * count] for b in blocks], n)
                check(f"reduce_scatter {dtype.__name__} {op}", out, want)
        mine = inp(dtype, "sum", rank, 10)
        every = [inp(dtype, "sum", r, 10) for r in range(n)]
        b = mine.copy()
        c.broadcast(b, root=n - 1)
        check(f"broadcast {dtype.__name__}", b, every[n - 1])
        g = np.empty(10 * n, dtype)
        c.all_gather(mine, g)
        check(f"all_gather {dtype.__name__}", g, np.concatenate(every))
    # Uneven all_to_all: rank r sends r + p elements to rank p.
    send = np.concatenate([np.full(rank + p, 100 * rank + p, np.int32) for p in range(n)])
    recv = np.empty(sum(p + rank for p in range(n)), np.int32)
    c.all_to_all(send=send, recv=recv, send_counts=[rank + p for p in range(n)], recv_counts=[p + rank for p in range(n)])
    check("all_to_all_v", recv, np.concatenate([np.full(p + rank, 100 * p + rank, np.int32) for p in range(n)]))
    # Buffer-protocol objects that are not numpy arrays.
    ba = bytearray([rank + 1] * 8)
    c.all_reduce(ba, op="sum")
    check("bytearray", np.frombuffer(ba, np.uint8), np.full(8, n * (n + 1) // 2, np.uint8))
    ar = array.array("d", [float(rank)] * 5)
    c.all_reduce(ar, op="max")
    check("array.array('d')", np.array(ar), np.full(5, float(n - 1)))
    # Asynchronous calls overlap; buffers are the caller's until wait().
    bufs = [np.full(1 << 16, float(rank + k), np.float32) for k in range(4)]
    works = [c.all_reduce(x, async_op=True) for x in bufs]
    for k, (x, w) in enumerate(zip(bufs, works)):
        w.wait()
        w.wait()  # waiting twice is harmless
        check(f"async all_reduce {k}", x, np.full(1 << 16, float(sum(r + k for r in range(n))), np.float32))
    hi = c.with_priority("high")
    x = np.ones(4, np.float32)
    hi.all_reduce(x)
    check("high priority", x, np.full(4, float(n), np.float32))
    if n > 1:
        right, left = (rank + 1) % n, (rank - 1) % n
        got = np.empty(6, np.int64)
        ws = [c.send(np.full(6, rank, np.int64), right, async_op=True), c.recv(got, left, async_op=True)]
        for w in ws:
            w.wait()
        check("send/recv", got, np.full(6, left, np.int64))
        # Receive from any rank: rank 0 gets one message from each other rank and learns who sent it.
        if rank == 0:
            senders = []
            for _ in range(n - 1):
                buf = np.empty(3, np.int32)
                src = c.recv(buf, None, tag=4)
                check("recv from any rank: data matches the sender", buf, np.full(3, 7 * src, np.int32))
                senders.append(src)
            check("recv from any rank: every sender once", np.array(sorted(senders)), np.arange(1, n))
        else:
            c.send(np.full(3, 7 * rank, np.int32), 0, tag=4)
    # Fusion: a list reduced as one message, blocking and not; buckets as DDP's.
    parts = [np.full(k * 100 + 1, float(rank + k), np.float64) for k in range(5)]
    c.all_reduce_coalesced(parts)
    for k, p in enumerate(parts):
        check(f"all_reduce_coalesced [{k}]", p, np.full(k * 100 + 1, float(sum(r + k for r in range(n))), np.float64))
    parts = [np.full(17, rank * 3 + k, np.int32) for k in range(3)]
    c.all_reduce_coalesced(parts, op="max", async_op=True).wait()
    for k, p in enumerate(parts):
        check(f"async all_reduce_coalesced max [{k}]", p, np.full(17, (n - 1) * 3 + k, np.int32))
    grads = [np.full(1000 + 37 * k, float(rank * (k + 1)), np.float32) for k in range(12)]
    with c.bucketed("avg", bucket_mb=0.01) as b:  # ~10 KB buckets: several launched meanwhile
        for g in reversed(grads):
            b.push(g)
        pushed_buckets = b.buckets
    check("bucketed launched buckets as they filled", np.array(pushed_buckets > 1), np.array(True))
    for k, g in enumerate(grads):
        check(f"bucketed avg [{k}]", g, np.full(1000 + 37 * k, float((k + 1) * (n - 1) / 2), np.float32))
    # all_to_all's buffers only by keyword: torch's order is the reverse.
    try:
        c.all_to_all(np.ones(n, np.int32), np.ones(n, np.int32))
        failures.append("positional all_to_all: no error")
    except conflux.InvalidArgument as e:
        check(f"positional all_to_all refused ({e})", "keyword" in str(e), True)
    check("not closed while usable", c.closed is None, True)
    # Groups: evens and odds.
    sub = c.split(rank % 2, key=-rank)
    t = np.array([rank], np.int64)
    sub.all_reduce(t)
    check("split", t, np.array([sum(r for r in range(n) if r % 2 == rank % 2)], np.int64))
    check("split order by key", np.array(sub.world_ranks), np.array(sorted((r for r in range(n) if r % 2 == rank % 2), reverse=True)))
    sub.shutdown()
    # Algorithms forced per call give the same answer as auto.
    for algo in ["ring", "tree", "rd", "rabenseifner"]:
        t = np.arange(5 * n + 3, dtype=np.float64) + rank
        c.all_reduce(t, algorithm=algo)
        check(f"all_reduce algorithm={algo}", t, n * np.arange(5 * n + 3, dtype=np.float64) + n * (n - 1) / 2)
    t = np.full(7, rank, np.int32)
    c.with_algo("chain").broadcast(t, root=n - 1)
    check("broadcast with_algo(chain)", t, np.full(7, n - 1, np.int32))
    # Bad input is a typed error, and the communicator goes on working.
    for what, call in [
        ("algorithm that lacks the operation", lambda: c.all_reduce(np.ones(3, np.float32), algorithm="chain")),
        ("unknown algorithm", lambda: c.all_reduce(np.ones(3, np.float32), algorithm="warp")),
        ("wrong length", lambda: c.all_gather(np.ones(3, np.float32), np.ones(3 * n + 1, np.float32))),
        ("root out of range", lambda: c.broadcast(np.ones(3, np.float32), root=n)),
        ("bitwise op on floats", lambda: c.all_reduce(np.ones(3, np.float32), op="band")),
        ("unknown op", lambda: c.all_reduce(np.ones(3, np.float32), op="median")),
        ("read-only array", lambda: c.all_reduce(np.frombuffer(b"abcd", np.uint8))),
        ("non-contiguous array", lambda: c.all_reduce(np.ones((4, 4), np.float32)[:, 1])),
        ("dtypes differ", lambda: c.all_gather(np.ones(3, np.float32), np.ones(3 * n, np.float64))),
    ]:
        try:
            call()
            failures.append(f"{what}: no error")
        except conflux.InvalidArgument as e:
            check(f"{what} is InvalidArgument ({e})", 1, 1)
    x = np.ones(2, np.float32)
    c.all_reduce(x)
    check("usable after errors", x, np.full(2, float(n), np.float32))
    c.shutdown()
    try:
        c.barrier()
        failures.append("barrier after shutdown: no error")
    except conflux.ClosedError:
        check("closed after shutdown", 1, 1)
    check(f"closed says why ({c.closed})", c.closed is not None, True)
    finish(rank, checks, failures)


if __name__ == "__main__":
    main()
