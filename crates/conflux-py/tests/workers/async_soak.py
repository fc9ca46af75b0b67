"""Asynchronous calls of the Python API and the torch backend, issued and waited on in random
ways for a while, every result checked: waits right away, later, in reverse order, from a
second thread, with a timeout too short to succeed, or never (the result read after a
barrier). Completion callbacks then run on the issuing thread, a waiting thread or the
notifier thread, in every interleaving the host produces. Every rank draws the same schedule
from a shared seed, so collectives match. Launched per rank by `conflux run`;
argv: seconds [seed]."""

import random
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

import conflux
import conflux.torch  # noqa: F401 - registers the backend
from conflux.errors import CommTimeout
from report import finish

failures, checks = [], 0
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)


def check(what, ok, detail=""):
    global checks
    checks += 1
    if not ok and len(failures) < 40:
        failures.append(f"{what} {detail}")


dist.init_process_group(backend="conflux")
rank, n = dist.get_rank(), dist.get_world_size()
# A second communicator for the Python API, meeting through torch's store (the job's own
# address is torch's now).
store = dist.distributed_c10d._get_default_store()
c = conflux.init(rank, n, conflux.torch.store_address(store, rank, n, key="soak/store"))
right, left = (rank + 1) % n, (rank - 1) % n


def issue(k):
    """One asynchronous call (the k-th of this round): (Work-like, check(), what)."""
    kind = rng.choice(["all_reduce", "reduce_scatter", "sendrecv", "torch_all_reduce", "torch_p2p", "torch_future"])
    count = rng.choice([1, 7, 256, 5000, 70000])
    if kind == "all_reduce":
        x = np.full(count, rank + k, np.float64)
        w = c.all_reduce(x, async_op=True)
        want = sum(r + k for r in range(n))
        return [w], lambda: (x == want).all(), kind
    if kind == "reduce_scatter":
        s = np.arange(count * n, dtype=np.int64) + rank
        r = np.zeros(count, np.int64)
        w = c.reduce_scatter(s, r, async_op=True)
        want = n * (np.arange(count, dtype=np.int64) + rank * count) + n * (n - 1) // 2
        return [w], lambda: np.array_equal(r, want), kind
    if kind == "sendrecv":
        got = np.zeros(count, np.int32)
        ws = [c.send(np.full(count, rank * 1000 + k, np.int32), right, tag=k % 7, async_op=True),
              c.recv(got, left, tag=k % 7, async_op=True)]
        return ws, lambda: (got == left * 1000 + k).all(), kind
    if kind == "torch_all_reduce":
        t = torch.full((count,), float(rank + k))
        w = dist.all_reduce(t, async_op=True)
        want = float(sum(r + k for r in range(n)))
        return [w], lambda: bool((t == want).all()), kind
    if kind == "torch_p2p":
        got = torch.zeros(count, dtype=torch.int64)
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((count,), rank + 10 * k), right),
                                     dist.P2POp(dist.irecv, got, left)])
        return ws, lambda: bool((got == left + 10 * k).all()), kind
    t = torch.full((count,), float(rank))
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] + 1)
    want = float(sum(range(n)) + 1)
    return [fut], lambda: bool((fut.value() == want).all()), kind


def wait_one(w):
    """A Work's or a Future's wait: both raise the call's error."""
    w.wait()


rounds = ops = 0
stop_at = time.monotonic() + seconds
while True:
    # Every rank decides together whether to go on, so that all run the same rounds.
    go = torch.tensor([1 if time.monotonic() < stop_at else 0])
    dist.all_reduce(go, op=dist.ReduceOp.MIN)
    if not go.item():
        break
    rounds += 1
    calls = [issue(k) for k in range(rng.randint(1, 6))]
    ops += len(calls)
    style = rng.choice(["now", "reverse", "thread", "short_timeout", "never"])
    works = [w for ws, _, _ in calls for w in ws]
    if style == "now":
        for w in works:
            wait_one(w)
    elif style == "reverse":
        for w in reversed(works):
            wait_one(w)
    elif style == "thread":
        errors = []

        def waiter(ws):
            try:
                for w in ws:
                    wait_one(w)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        half = len(works) // 2
        th = threading.Thread(target=waiter, args=(works[:half],))
        th.start()
        waiter(works[half:])
        th.join(60)
        check(f"round {rounds}: waits from two threads", not th.is_alive() and not errors, errors)
    elif style == "short_timeout":
        for w in works:
            if isinstance(w, conflux.Work):
                try:
                    w.wait(1e-6)
                except CommTimeout:
                    pass
            wait_one(w)
    # "never": nobody waits; the barrier below orders every rank's calls before it.
    if style == "never":
        c.barrier()
        deadline = time.monotonic() + 30
        # The callbacks (and so the Python API's copies) may still be on the notifier.
        for w in works:
            while isinstance(w, conflux.Work) and not w.is_completed() and time.monotonic() < deadline:
                time.sleep(0.001)
            wait_one(w)
    for ws, ok, what in calls:
        check(f"round {rounds} ({style}): {what}", ok())

print(f"rank {rank}: {rounds} rounds, {ops} calls")
c.shutdown()
dist.destroy_process_group()
finish(rank, checks, failures)
