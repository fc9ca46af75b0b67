"""Where and how often an asynchronous call's completion callback runs (`conflux._native`,
the layer the Python API and the torch backend build on), at 2 ranks: exactly once, on the
thread that is issuing or waiting on the call when it completes there, else on the notifier
thread. Launched per rank by `conflux run`."""

import threading
import time

import numpy as np

import conflux
from conflux.errors import CommTimeout
from report import finish

failures, checks = [], 0
MAIN = threading.get_ident()


def check(what, cond, detail=""):
    global checks
    checks += 1
    if not cond:
        failures.append(f"{what} {detail}")


class Seen:
    """A callback that records each run: the thread, and whether the call had returned yet."""

    def __init__(self):
        self.runs, self.returned, self.event = [], False, threading.Event()

    def __call__(self):
        self.runs.append((threading.get_ident(), self.returned))
        self.event.set()


def triple(a):
    return a.ctypes.data, a.size, "i64"


c = conflux.init()
raw = c._c
rank, n = c.rank, c.size
assert n == 2, "this worker runs at 2 ranks"
peer = 1 - rank
LATE = 1.0  # how long the sender holds back a message the receiver must not have yet

# 1. Sends that fit the link complete while they are issued: their callbacks run on the
#    issuing thread before the call returns, in all but the odd case where the progress
#    engine held the link at that moment (then the notifier runs it).
inline, trials = 0, 100
for k in range(trials):
    if rank == 0:
        buf, seen = np.full(4, k, np.int64), Seen()
        w = raw.send(triple(buf), peer, 10, seen)
        seen.returned = True
        w.wait()
        seen.event.wait(10)
        check(f"send {k}: callback ran once", len(seen.runs) == 1, seen.runs)
        inline += seen.runs[:1] == [(MAIN, False)]
    else:
        got = np.zeros(4, np.int64)
        raw.recv(triple(got), peer, 10)
        check(f"send {k}: data", (got == k).all(), got)
if rank == 0:
    check("inline sends ran their callbacks on the issuing thread", inline > 0, f"({inline} of {trials})")
    print(f"rank 0: {inline} of {trials} inline sends ran their callback before the call returned")

def late_receive(tag, callback, then):
    """Rank 0 posts a receive of `tag` with `callback` and runs `then(work)`; rank 1 sends the
    message LATE seconds after both pass a barrier. The data is checked once waited for."""
    c.barrier()
    if rank == 0:
        got = np.zeros(3, np.int64)
        w = raw.recv(triple(got), peer, tag, callback)
        then(w)
        w.wait()
        check(f"receive {tag}: data", (got == tag).all(), got)
    else:
        time.sleep(LATE)
        raw.send(triple(np.full(3, tag, np.int64)), peer, tag)


# 2. A receive that completes while its thread waits: the waiter runs the callback before
#    wait() returns, once however often it waits.
def waited_on(w):
    check("recv: not completed before the peer sent", not w.is_completed())
    w.wait()
    check("recv waited on: callback ran once, on the waiting thread, before wait() returned",
          seen.runs == [(MAIN, False)], seen.runs)
    w.wait()
    check("recv waited on twice: still once", len(seen.runs) == 1, seen.runs)


seen = Seen()
late_receive(11, seen, waited_on)


# 3. Nobody waits: the notifier thread runs it. 4. Nor after a wait that timed out.
def nobody_waits(w, after_timeout):
    what = "after a timed-out wait" if after_timeout else "nobody waits on"
    if after_timeout:
        try:
            w.wait(0.01)
            check("recv with a short timeout: timed out", False, "wait returned")
        except CommTimeout:
            check("recv with a short timeout: timed out", True)
    seen.returned = True
    check(f"recv {what}: callback ran", seen.event.wait(30))
    check(f"recv {what}: once, on another thread", len(seen.runs) == 1 and seen.runs[0][0] != MAIN, seen.runs)


for tag, after_timeout in [(12, False), (13, True)]:
    seen = Seen()
    late_receive(tag, seen, lambda w: nobody_waits(w, after_timeout))
    if rank == 0:
        check(f"recv {tag} waited on after its callback ran: still once", len(seen.runs) == 1, seen.runs)

# 5. A wait() that returns has seen the callback finish, also one the notifier is running.
started, finished = threading.Event(), []


def slow():
    started.set()
    time.sleep(0.3)
    finished.append(threading.get_ident())


def while_slow_callback_runs(w):
    check("slow callback: started", started.wait(30))
    check("slow callback running: is_completed() is False until it has finished", not w.is_completed())
    w.wait()
    check("slow callback on the notifier: finished when wait() returned",
          len(finished) == 1 and finished[0] != MAIN, finished)


late_receive(15, slow, while_slow_callback_runs)

# 5b. is_completed() is True only once the callback has run (it runs it if nobody has).
def polled(w):
    deadline = time.monotonic() + 30
    while not w.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    check("is_completed(): True, and the callback has run by then", len(seen.runs) == 1, seen.runs)


seen = Seen()
late_receive(18, seen, polled)

# 6. A callback may wait on its own Work, on the waiting thread and on the notifier.
for k, waited in enumerate([True, False]):
    box, reentered = [], []

    def reenter():
        reentered.append(box[0].wait())

    def then(w):
        box.append(w)
        if waited:
            w.wait()
        deadline = time.monotonic() + 30
        while not reentered and time.monotonic() < deadline:
            time.sleep(0.01)
        check(f"callback that waits on its own Work ({'waited on' if waited else 'on the notifier'})",
              reentered == [True], reentered)

    late_receive(16 + k, reenter, then)

# 7. A callback that raises is reported on stderr; the call's own outcome stands.
c.barrier()
if rank == 0:
    def boom():
        raise RuntimeError("a callback that raises")
    w = raw.send(triple(np.full(2, 5, np.int64)), peer, 14, boom)
    check("send whose callback raised: wait succeeds", w.wait() is True)
else:
    got = np.zeros(2, np.int64)
    raw.recv(triple(got), peer, 14)
    check("send whose callback raised: data", (got == 5).all(), got)

c.barrier()
c.shutdown()
finish(rank, checks, failures)
