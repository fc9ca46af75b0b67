"""conflux: collective communication for CPU processes over shared memory and TCP.

    import numpy as np, conflux
    comm = conflux.init()                  # RANK, WORLD_SIZE, MASTER_ADDR/PORT (conflux run, torchrun)
    grads = np.ones(1 << 20, np.float32)
    comm.all_reduce(grads, op="avg")       # in place, zero-copy, GIL released
    work = comm.all_reduce(grads, async_op=True)
    ...                                    # compute while it runs
    work.wait()

Buffers are numpy arrays or any C-contiguous object with the buffer protocol; they are used
in place. With ``async_op=True`` a call returns a ``Work`` at once; do not touch its buffers
until it completes. ``conflux.torch`` is the torch.distributed backend.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Optional, Sequence, Union

from . import _buffers as _b
from ._native import Comm as _Comm
from ._native import Work
from . import _native
from .errors import ClosedError, CommTimeout, ConfluxError, InvalidArgument, MismatchError, PeerError

__all__ = ["init", "mark_step", "Communicator", "Options", "LinkHealth", "Work", "ConfluxError", "InvalidArgument",
           "PeerError", "CommTimeout", "MismatchError", "ClosedError"]

REDUCE_OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")

# A numpy array or any C-contiguous buffer-protocol object (bytearray, array.array, ...).
Buffer = Any


class Options:
    """Settings of one communicator, what HCCL's guide sets per communication domain; each
    left None keeps the environment's (CONFLUX_*) or, for a group, its parent's value.

    transport      "auto" (shared memory in a host, TCP between hosts), "shm" or "tcp"
    algorithm      an algorithm for every collective ("ring", "tree", "rd", ...) or per
                   operation, in CONFLUX_ALGO's syntax ("all_reduce:ring;broadcast:chain")
    timeout        seconds (or a timedelta) every wait may take before it fails
    traffic_class  DSCP code point marked on the group's TCP packets: 0-63 or a name such as
                   "ef", "af41", "cs3" (CONFLUX_TRAFFIC_CLASS)

    Every rank of a new communicator must pass the same options (checked: a group call with
    different options fails on every rank, naming two ranks that differ)."""

    __slots__ = ("transport", "algorithm", "timeout", "traffic_class")

    def __init__(self, transport: Optional[str] = None, algorithm: Optional[str] = None,
                 timeout: Union[float, timedelta, None] = None, traffic_class: Union[int, str, None] = None):
        self.transport = transport
        self.algorithm = algorithm
        self.timeout = timeout
        self.traffic_class = traffic_class

    def _native(self):
        timeout = self.timeout
        if hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        return {"transport": self.transport, "algorithm": self.algorithm, "timeout": timeout,
                "traffic_class": self.traffic_class}

    def __repr__(self):
        set_ = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__ if getattr(self, k) is not None)
        return f"conflux.Options({set_})"


def _native_options(options):
    if options is None:
        return None
    if not isinstance(options, Options):
        raise InvalidArgument(f"options must be conflux.Options, not {type(options).__name__}")
    return options._native()


class LinkHealth:
    """What `check_link_health` measured, the same on every rank. Matrices are indexed by
    rank, diagonal 0 (kinds: None).

    latency_us  one-way latency of 8 bytes, microseconds: half the median round trip
    gbps        bandwidth, GB/s
    kinds       the link each pair uses: "shm" or "tcp"
    slow        (a, b, ratio) for each pair far worse than typical links of its kind, ratio
                the worse of bandwidth / reference and reference latency / latency
    reference   per kind: {"kind", "latency_us", "gbps", "pairs"}"""

    def __init__(self, d):
        self.latency_us, self.gbps, self.kinds = d["latency_us"], d["gbps"], d["kinds"]
        self.slow = [tuple(p) for p in d["slow"]]
        self.reference = d["reference"]

    @property
    def healthy(self) -> bool:
        return not self.slow

    def __repr__(self):
        return f"<conflux.LinkHealth {len(self.kinds)} ranks, {len(self.slow)} slow pairs>"


class Bucketer:
    """The open bucket and the launched ones of `Communicator.bucketed`."""

    def __init__(self, comm, op, cap_bytes):
        self._comm, self._op, self._cap = comm, op, cap_bytes
        self._open, self._open_bytes, self._works, self._dtype = [], 0, [], None

    def push(self, buf: Buffer) -> None:
        """Adds a ready buffer: launches the open bucket first if this one would overflow it (or
        has another dtype), and after if it is full. Do not touch the buffer until finish()."""
        b = _b.describe(buf)
        nbytes = b.count * _b.SIZES[b.dtype]
        if self._open and (self._open_bytes + nbytes > self._cap or b.dtype != self._dtype):
            self.flush()
        self._dtype = b.dtype
        self._open.append(buf)
        self._open_bytes += nbytes
        if self._open_bytes >= self._cap:
            self.flush()

    def flush(self) -> None:
        """Launches the open bucket now, full or not."""
        if self._open:
            bufs, self._open, self._open_bytes = self._open, [], 0
            self._works.append(self._comm.all_reduce_coalesced(bufs, self._op, async_op=True))

    @property
    def buckets(self) -> int:
        """Buckets launched so far."""
        return len(self._works)

    def finish(self) -> None:
        """Launches the open bucket and waits for every bucket; raises the first error."""
        self.flush()
        works, self._works, first = self._works, [], None
        for w in works:
            try:
                w.wait()
            except Exception as e:  # noqa: BLE001 - every bucket is waited for, then the first error
                first = first or e
        if first is not None:
            raise first

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finish()
            return False
        try:  # the buffers are the engine's until every bucket is over, error or not
            self.finish()
        except Exception:  # noqa: BLE001 - the block's own exception is the one to raise
            pass
        return False


def init(rank: Optional[int] = None, size: Optional[int] = None, store: Optional[str] = None,
         timeout: Optional[float] = None, trace: Union[str, os.PathLike, None] = None,
         options: Optional[Options] = None) -> Communicator:
    """Joins a job: from the environment when `rank` is None, else by rank, size and store
    ("host:port", served by rank 0). `timeout` (seconds) bounds every wait. `trace` (a
    directory, as CONFLUX_TRACE) records every operation there for `conflux trace report`.
    `options` (`conflux.Options`) set this communicator's link, algorithm, timeout, traffic class."""
    trace = None if trace is None else str(trace)
    native = _native_options(options)
    if rank is None:
        return Communicator(_Comm.from_env(timeout, trace, native))
    return Communicator(_Comm.create(rank, size, store, timeout, trace, None, native))


def mark_step() -> int:
    """Marks the start of the next step (training iteration) in this process's trace, so that
    `conflux trace report` breaks steps down into computation and communication. Does nothing
    when nothing is traced; returns how many ranks' traces it marked (0 or 1, usually)."""
    return _native.mark_step()


def _op(op, dtype):
    op = str(op).lower()
    if op not in REDUCE_OPS:
        raise InvalidArgument(f"unknown reduce op {op!r}; one of {', '.join(REDUCE_OPS)}")
    return _b.bool_op(op) if dtype == "bool" else op


class Communicator:
    """The ranks of a job, or of a group made from it, and the collectives they run."""

    def __init__(self, native):
        self._c = native

    rank = property(lambda self: self._c.rank)
    size = property(lambda self: self._c.size)
    local_rank = property(lambda self: self._c.local_rank)
    local_size = property(lambda self: self._c.local_size)
    world_ranks = property(lambda self: self._c.world_ranks, doc="The job rank of each member.")
    timeout = property(lambda self: self._c.timeout)

    def _issue(self, call, args, async_op, *keep, then=None):
        if not async_op:
            call(*args)
            if then is not None:
                then()
            return None
        return call(*args, _b.Keep(*keep, then=then))

    def _algo(self, algorithm):
        """The native handle for a call: `algorithm` (e.g. "ring", "tree", "rd") forces one,
        as CONFLUX_ALGO does for all calls; a call it cannot serve raises InvalidArgument."""
        return self._c if algorithm is None else self._c.with_algo(algorithm)

    def with_algo(self, algorithm: Optional[str]) -> Communicator:
        """A handle on this communicator whose collectives use `algorithm` (None: auto)."""
        return Communicator(self._c.with_algo(algorithm))

    def all_reduce(self, buf: Buffer, op: str = "sum", async_op: bool = False,
                   algorithm: Optional[str] = None) -> Optional[Work]:
        b = _b.describe(buf)
        return self._issue(self._algo(algorithm).all_reduce, (b.triple(), _op(op, b.dtype)), async_op, b)

    def broadcast(self, buf: Buffer, root: int = 0, async_op: bool = False,
                  algorithm: Optional[str] = None) -> Optional[Work]:
        b = _b.describe(buf)
        return self._issue(self._algo(algorithm).broadcast, (b.triple(), root), async_op, b)

    def reduce(self, buf: Buffer, root: int = 0, op: str = "sum", async_op: bool = False,
               algorithm: Optional[str] = None) -> Optional[Work]:
        """In place: the root's `buf` gets the reduction; the others' stay unchanged."""
        b = _b.describe(buf)
        return self._issue(self._algo(algorithm).reduce, (b.triple(), _op(op, b.dtype), root), async_op, b)

    def all_gather(self, send: Buffer, recv: Buffer, async_op: bool = False,
                   algorithm: Optional[str] = None) -> Optional[Work]:
        """`recv` (size x len(send) elements) gets every rank's `send`, in rank order."""
        s, r = _b.describe(send, writable=False), _b.describe(recv)
        self._same(s, r, r.count == s.count * self.size, "all_gather: recv must hold size x send")
        _b.copy(r, self.rank * s.count, s, 0, s.count)
        return self._issue(self._algo(algorithm).all_gather, (r.triple(),), async_op, r)

    def reduce_scatter(self, send: Buffer, recv: Buffer, op: str = "sum", async_op: bool = False,
                       algorithm: Optional[str] = None) -> Optional[Work]:
        """`recv` gets block `rank` of the reduction of every rank's `send` (size x len(recv))."""
        s, r = _b.describe(send, writable=False), _b.describe(recv)
        self._same(s, r, s.count == r.count * self.size, "reduce_scatter: send must hold size x recv")
        tmp = _b.scratch(s.count, s.dtype)
        _b.copy(tmp, 0, s, 0, s.count)
        def then():
            _b.copy(r, 0, tmp, self.rank * r.count, r.count)
        call = self._algo(algorithm).reduce_scatter
        return self._issue(call, (tmp.triple(), _op(op, s.dtype)), async_op, tmp, r, then=then)

    def all_to_all(self, *positional: Any, send: Optional[Buffer] = None, recv: Optional[Buffer] = None,
                   send_counts: Optional[Sequence[int]] = None, recv_counts: Optional[Sequence[int]] = None,
                   async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
        """Block p of `send` goes to rank p; counts (elements per rank) default to equal blocks.

        `send` and `recv` are keyword-only: torch's all_to_all_single takes (output, input), the
        reverse, and with equal sizes a swapped call would run and exchange the wrong data."""
        if positional or send is None or recv is None:
            raise InvalidArgument("all_to_all takes its buffers by keyword, all_to_all(send=..., recv=...): "
                                  "torch's all_to_all_single takes (output, input), the reverse order")
        s, r = _b.describe(send, writable=False), _b.describe(recv)
        self._same(s, r, True, "")
        n = self.size

        def equal(b, what):
            if b.count % n:
                raise InvalidArgument(f"all_to_all: {what} has {b.count} elements, not {n} equal blocks; pass counts")
            return [b.count // n] * n
        send_counts = equal(s, "send") if send_counts is None else send_counts
        recv_counts = equal(r, "recv") if recv_counts is None else recv_counts
        args = (s.triple(), list(send_counts), r.triple(), list(recv_counts))
        return self._issue(self._algo(algorithm).all_to_all_v, args, async_op, s, r)

    def all_reduce_coalesced(self, bufs: Sequence[Buffer], op: str = "sum", async_op: bool = False) -> Optional[Work]:
        """Reduces every buffer of the list `bufs` (one dtype) in place, as one message: many
        small tensors for the price of one call. Ranks pass the same lengths in the same order."""
        described = [_b.describe(b) for b in bufs]
        if not described:
            return None
        dtype = described[0].dtype
        if any(d.dtype != dtype for d in described):
            raise InvalidArgument(f"all_reduce_coalesced: buffers of several dtypes "
                                  f"({sorted({d.dtype for d in described})}); coalesce each dtype apart")
        return self._issue(self._c.all_reduce_coalesced, ([d.triple() for d in described], _op(op, dtype)),
                           async_op, *described)

    def bucketed(self, op: str = "sum", bucket_mb: Optional[float] = None) -> Bucketer:
        """Gradient fusion as DDP's buckets, a context manager: push buffers as they become
        ready (backward's order); each bucket of about `bucket_mb` MB (CONFLUX_BUCKET_MB, 25)
        is reduced in place, asynchronously, as it fills. Leaving the block launches the rest and
        waits for every bucket (`finish`); then every buffer holds its result.

            with comm.bucketed("avg") as b:
                for g in reversed(grads):
                    b.push(g)
        """
        cap = self._c.bucket_bytes if bucket_mb is None else int(float(bucket_mb) * (1 << 20))
        if cap <= 0:
            raise InvalidArgument(f"bucketed: bucket_mb must be positive, not {bucket_mb}")
        return Bucketer(self, op, cap)

    def status(self) -> list[dict]:
        """One dict per rank, what HCCL's get_device_status tells of each card, from this
        rank's view and without waiting for any rank (so it answers while ranks are stuck):
        "rank", "world_rank", "alive" (its process is still in the job; None if the store
        cannot say), "last_call" (the last collective it entered, "#12 all_reduce(float x 4,
        sum)", for ranks on this host; else None) and "links" ("self", "shm" or "tcp")."""
        return self._c.status()

    def shrink(self, exclude: Sequence[int] = ()) -> Communicator:
        """The communicator of the ranks of this one still alive and not in `exclude`, renumbered
        in order (collective over them: after a rank died, each survivor calls it and carries
        on). Every caller passes the same `exclude`; the excluded ranks do not call."""
        return Communicator(self._c.shrink(list(exclude)))

    closed = property(lambda self: self._c.closed,
                      doc="Why this communicator can no longer be used (\"aborted\", ...), or None.")

    def send(self, buf: Buffer, peer: int, tag: int = 0, async_op: bool = False) -> Optional[Work]:
        b = _b.describe(buf, writable=False)
        return self._issue(self._c.send, (b.triple(), peer, tag), async_op, b)

    def recv(self, buf: Buffer, peer: Optional[int] = None, tag: int = 0,
             async_op: bool = False) -> Union[Work, int, None]:
        """Receives into `buf` from `peer`, or with peer=None from whichever rank sends first:
        then the blocking form returns that rank, and the Work's `.source` tells it."""
        b = _b.describe(buf)
        if peer is not None:
            return self._issue(self._c.recv, (b.triple(), peer, tag), async_op, b)
        work = self._c.recv_any(b.triple(), tag, _b.Keep(b))
        if async_op:
            return work
        work.wait()
        return work.source

    def mark_step(self) -> Optional[int]:
        """Marks the start of the next step in this rank's trace (see `conflux.mark_step`);
        returns the step's number, or None when the communicator is not traced."""
        return self._c.mark_step()

    def barrier(self, async_op: bool = False) -> Optional[Work]:
        return self._issue(self._c.barrier, (), async_op)

    def new_group(self, ranks: Sequence[int], options: Optional[Options] = None) -> Optional[Communicator]:
        """Collective over this communicator: `ranks[i]` becomes rank i. None for non-members.
        `options` (`conflux.Options`, the same on every rank) override this communicator's."""
        g = self._c.new_group(list(ranks), _native_options(options))
        return None if g is None else Communicator(g)

    def split(self, color: Optional[int], key: int = 0, options: Optional[Options] = None) -> Optional[Communicator]:
        """MPI_Comm_split: equal colors form a group ordered by (key, rank); None opts out.
        `options` as for `new_group`."""
        g = self._c.split(color, key, _native_options(options))
        return None if g is None else Communicator(g)

    def check_link_health(self, bytes: int = 4 << 20, iters: int = 10, threshold: float = 0.5) -> LinkHealth:
        """Measures every pair's link, as HCCL's check_link_health and `conflux doctor`
        (collective: every rank calls it with the same arguments); returns a `LinkHealth`."""
        return LinkHealth(self._c.check_link_health(bytes, iters, threshold))

    def with_priority(self, priority: str) -> Communicator:
        """A handle whose operations run on the "high" (or "normal") priority lane."""
        if priority not in ("high", "normal"):
            raise InvalidArgument(f"priority must be 'high' or 'normal', not {priority!r}")
        return Communicator(self._c.with_priority(priority == "high"))

    def abort(self) -> None:
        self._c.abort()

    def shutdown(self) -> None:
        self._c.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __repr__(self):
        return f"<conflux.Communicator rank {self.rank} of {self.size}>"

    @staticmethod
    def _same(a, b, ok, msg):
        if a.dtype != b.dtype:
            raise InvalidArgument(f"send is {a.dtype}, recv is {b.dtype}")
        if not ok:
            raise InvalidArgument(f"{msg} ({a.count} and {b.count} elements)")
