"""The torch.distributed backend "conflux", for CPU tensors.

    import torch, torch.distributed as dist
    dist.init_process_group(backend="conflux")   # env:// (torchrun, conflux run) or tcp://
    dist.all_reduce(t)

The package's entry point (group ``torch.distributed.backends``) registers the backend when
torch first meets the name, so no import is needed. ``register()`` does it by hand.

Each process group torch creates (the default one, each ``new_group``) is its own conflux
communicator, bootstrapped through the store torch hands over: rank 0 of the group serves a
conflux store on a free port and publishes its address there. Tensors reach conflux by
address and length (``data_ptr``, ``numel``); a non-contiguous tensor goes through a
contiguous copy that is copied back when the operation completes.
"""

import math
import os
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from . import _buffers as _b
from . import LinkHealth, Options, _native_options
from ._native import Comm as _Comm
from .errors import CommTimeout, InvalidArgument

NAME = "conflux"

_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32",
           torch.int64: "i64", torch.bool: "bool"}

_NATIVE = {k: _b.native_dtype(v) for k, v in _DTYPES.items()}

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: "sum", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max", _R.AVG: "avg",
        _R.BAND: "band", _R.BOR: "bor", _R.BXOR: "bxor"}


def register():
    """Registers the backend with torch.distributed (idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


def _cpp():
    """The C++ backend's module (conflux._c10d, built by `pip install ./crates/conflux-py/csrc`),
    or None: not built, or CONFLUX_TORCH_BACKEND=python asks for the Python one."""
    choice = os.environ.get("CONFLUX_TORCH_BACKEND", "auto").lower()
    if choice not in ("auto", "cpp", "python"):
        raise InvalidArgument(f"CONFLUX_TORCH_BACKEND must be auto, cpp or python, not {choice!r}")
    if choice == "python":
        return None
    try:
        from . import _c10d
    except ImportError:
        if choice == "cpp":
            raise
        return None
    return _c10d


def _create(opts, backend_options):
    """torch's creator: `backend_options` is the `pg_options` of init_process_group/new_group,
    a `conflux.torch.Options` (its timeout, when set, wins over the group's). The backend is
    the C++ one when it is built (see `_cpp`), else the Python one below."""
    if backend_options is not None and not isinstance(backend_options, Options):
        raise InvalidArgument(f"pg_options for the conflux backend must be conflux.torch.Options, "
                              f"not {type(backend_options).__name__}")
    timeout = opts.timeout.total_seconds() if isinstance(opts.timeout, timedelta) else None
    cpp = _cpp()
    if cpp is None:
        return ConfluxBackend(opts.store, opts.group_rank, opts.group_size, timeout, _trace_as(opts), backend_options)
    comm = _comm_for(opts.store, opts.group_rank, opts.group_size, timeout, _trace_as(opts), backend_options)
    backend = cpp.ConfluxBackend(comm, opts.group_rank, opts.group_size)
    # A group of its own rather than torch's, so that it calls itself "conflux" (DDP's logging
    # data asks the group); torch then uses it in place of the one it made.
    return cpp.ConfluxProcessGroup(opts.store, opts.group_rank, opts.group_size, backend)


def _comm_for(store, rank, size, timeout, trace_as, options):
    """The conflux communicator of one torch group, bootstrapped through torch's store."""
    return _Comm.create(rank, size, store_address(store, rank, size), timeout, None, trace_as,
                        _native_options(options))


def _split(comm, rank, ranks, timeout):
    """The C++ backend's `split` (torch's `dist.split_group`): torch calls it on every rank of
    the parent group, each with the parent ranks of its own new group (a rank in none with
    another group's), which is conflux's collective split with the group's first rank as
    its color. The new group's links are conflux's own, agreed on through the parent; its
    timeout is the one torch gives (`timeout` s, or the parent's when < 0). None for a rank
    outside `ranks`."""
    member = rank in ranks
    options = Options(timeout=timeout) if timeout >= 0 else None
    child = comm.split(ranks[0] if member else None, ranks.index(rank) if member else 0, _native_options(options))
    if child is None:
        return None
    return _cpp().ConfluxBackend(child, child.rank, child.size)


def _shrink(comm, ranks_to_exclude, flags):
    """The C++ backend's `shrink` (torch's `dist.shrink_group`): the group's ranks not in
    `ranks_to_exclude`, renumbered in order, agreed on through the store (`Communicator.shrink`).
    SHRINK_ABORT needs nothing more: the shrink never waits on the old group's operations,
    which fail on their own once a rank they wait for is gone (torch then aborts the job's
    other groups itself, which fails only those)."""
    del flags
    small = comm.shrink(list(ranks_to_exclude))
    return _cpp().ConfluxBackend(small, small.rank, small.size)


def _backend(group):
    """The ConfluxBackend serving CPU tensors in `group` (None: the default group)."""
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise InvalidArgument("torch.distributed is not initialized")
    backend = pg._get_backend(torch.device("cpu"))
    cpp = _cpp()
    if not isinstance(backend, ConfluxBackend) and not (cpp is not None and isinstance(backend, cpp.ConfluxBackend)):
        raise InvalidArgument(f"this group's CPU backend is {type(backend).__name__}, not conflux")
    return backend


def status(group=None):
    """Every rank of `group` as this rank sees it, without waiting for any: see
    `conflux.Communicator.status` ("rank" is the group rank)."""
    return _backend(group).comm.status()


def check_link_health(group=None, bytes=4 << 20, iters=10, threshold=0.5):
    """Measures every pair of `group`'s ranks (collective over it), as HCCL's
    check_link_health: a `conflux.LinkHealth` (latency_us, gbps, kinds, slow), indexed by
    group rank."""
    return LinkHealth(_backend(group).comm.check_link_health(bytes, iters, threshold))


def _trace_as(opts):
    """Who this group is in a trace (CONFLUX_TRACE): each process group is a conflux job of
    its own, so its trace is told the members' ranks in the whole job and a name they share."""
    ranks = list(getattr(opts, "global_ranks_in_group", None) or range(opts.group_size))
    world = dist.get_world_size() if dist.is_initialized() else opts.group_size
    return (f"torch:{getattr(opts, 'group_id', '') or 'default'}", ranks, world)


def mark_steps(optimizer):
    """Marks a step in the trace each time `optimizer.step()` finishes (the documented
    one-line hook: ``conflux.torch.mark_steps(opt)``); returns the hooks' handles.

    It also tells the trace, as the optimizer starts, that every operation whose torch future
    was taken (DDP's buckets) has been waited for: DDP waits on those futures inside torch's
    C++, where conflux cannot see, so the trace counts the caller as blocked from the last such
    operation's issue to the last end of one (after DDP's last bucket is issued, backward has
    nothing left to overlap with it)."""
    from . import _native, mark_step
    pre = optimizer.register_step_pre_hook(lambda *_: _native.sync_point())
    post = optimizer.register_step_post_hook(lambda *_: mark_step())
    return pre, post


# The per-call helpers below run on every collective: an 8-byte all_reduce spends more time
# here than in conflux, so they look each attribute up once.

def _triple(t):
    """The native triple of a contiguous CPU tensor: its memory, in place."""
    d = _NATIVE.get(t.dtype)
    if d is None or not t.is_cpu:
        _refuse(t)
    return t.data_ptr(), t.numel(), d


def _refuse(t):
    if not t.is_cpu:
        raise InvalidArgument(f"conflux serves CPU tensors; this one is on {t.device}")
    raise InvalidArgument(f"conflux does not carry {t.dtype}")


def _op(reduce_op, t):
    """(conflux op name, premultiply factor or None) for a torch ReduceOp on tensor t."""
    kind = reduce_op.op
    name = _OPS.get(kind)
    if name is None:
        if kind != _R.PREMUL_SUM:
            raise InvalidArgument(f"conflux does not support {kind}")
        return ("max" if t.dtype is torch.bool else "sum"), reduce_op.factor
    return (_b.bool_op(name) if t.dtype is torch.bool else name), None


def _host(store):
    """The address torch's store listens on: where this group's conflux store goes too."""
    s = store
    while hasattr(s, "underlying_store"):
        s = s.underlying_store
    host = getattr(s, "host", None)
    if host:
        return host
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


def _free_port(host):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def store_address(store, rank, size, key="conflux/store"):
    """Where this group's conflux store will be, agreed through torch's `store`: rank 0 picks
    a free port on the host torch's store listens on and publishes it under `key`. None for
    one rank. (The port is free when picked; another process could take it before rank 0
    binds it, and then rank 0's setup fails with a clear error.)"""
    if size == 1:
        return None
    if rank == 0:
        host = _host(store)
        store.set(key, f"{host}:{_free_port(host)}")
    return store.get(key).decode()


class ConfluxWork(dist._Work):
    """The torch Work of one backend call: one or more conflux operations, then `finish` (the
    copies into outputs), then the future completes with the output tensors.

    A blocking call (asyncOp False) returns its Work already complete, and makes nothing it
    does not need: torch only calls wait() on it. An asynchronous one counts its operations
    down in completion callbacks (`_callback`). Those run on the thread that is issuing or
    waiting on an operation when it completes, else on conflux's notifier thread; so for a
    send that fits the link, or a receive waited on, everything happens on the caller's thread.

    Per call it makes two plain locks, and the torch Future only when asked for one
    (`get_future`): an isend of 8 bytes costs about 6 us in this layer, 10 when a
    threading.Event and a Future were made up front.
    """

    def __init__(self, outputs):
        super().__init__()
        self._outputs = outputs
        self._natives = ()
        self._error = None
        self._gate = None  # while asynchronous: a Lock held until the call is complete
        self._future = None
        self._source = None  # the Future that `_future` follows (see get_future)

    # -- building an asynchronous one, from the backend --
    def _start(self, operations):
        self._natives, self._finish = [], []
        self._gate = threading.Lock()
        self._gate.acquire()
        # One per operation, and one for the issuing thread, released by `_issued`. Counted up
        # front: a callback may run on the notifier thread while later ones are being issued.
        self._left = operations + 1
        self._lock = threading.Lock()
        self._completing = False
        self._finished = False

    def _callback(self, *keep):
        return _b.Keep(*keep, then=self._one_done)

    def _issued(self):
        self._one_done()
        return self

    def _one_done(self):
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._complete()

    def _complete(self):
        """Runs once: from the last callback, or from wait() once every operation is over.
        Whatever happens in it (the call's error, a failed copy, an interrupt), the Work ends
        complete, its future settled and its gate open."""
        with self._lock:
            if self._completing:
                return
            self._completing = True
        interrupted = None
        try:
            for w in self._natives:
                try:
                    w.wait()
                except Exception as e:  # noqa: BLE001 - the first error is the call's
                    self._error = self._error or e
            if self._error is None:
                for f in self._finish:
                    f()
        except Exception as e:  # noqa: BLE001 - handed to whoever waits
            self._error = e
        except BaseException as e:  # an interrupt: the Work still ends, then it goes on up
            self._error = interrupted = e
        finally:
            with self._lock:
                self._finished = True
                source = self._source
            # Settled before the gate opens, so that a wait() that returns sees the future
            # done; a then() callback that calls wait() passes the gate by (see wait).
            try:
                if source is not None:
                    source.set_result(self._outcome())
            finally:
                self._gate.release()
        if interrupted is not None:
            raise interrupted

    def _outcome(self):
        return self._outputs if self._error is None else self._error

    # -- torch's Work interface --
    def wait(self, timeout=None):
        if self._gate is None:
            return True
        t = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        deadline = time.monotonic() + t if t is not None and t > 0 else None

        def left():
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        def timed_out():
            return CommTimeout(f"{self} did not complete within {t:.3f}s")

        # Wait on the operations themselves (GIL released): their callbacks run on this
        # thread, and the last one completes the Work here, with no thread hand-off. An
        # operation's own failure (its CommTimeout too) is the call's error, not this wait's.
        for w in self._natives:
            try:
                w.wait(left())
            except CommTimeout:
                if not w.is_completed():
                    raise timed_out() from None
            except Exception:  # noqa: BLE001 - _complete records it for everyone
                pass
        self._complete()
        if not (self._finished and (self._future is None or self._future.done())):
            # Another thread is completing it (the notifier, or another waiter).
            remaining = left()
            if not self._gate.acquire(timeout=-1 if remaining is None else remaining):
                raise timed_out()
            self._gate.release()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._gate is None or self._finished

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        if self._gate is None:  # a blocking call's Work: complete already
            if self._future is None:
                self._future = torch.futures.Future()
                self._future.set_result(self._outputs)
            return self._future
        # Made on first request; `_complete` settles its source, or this does if that has run.
        # torch's Future.set_exception marks the error on the Python wrapper only, and torch
        # hands the future to callers (DDP, work.get_future()) in new wrappers, which would
        # return the exception as the value. An error raised in a then() callback is the
        # future's own, kept by torch in C++ and raised by every wrapper (as a RuntimeError,
        # as gloo's errors are). Settled under the lock: nothing but `_raise_errors` is chained
        # on it yet, and no thread gets it unsettled.
        for w in self._natives:
            w.awaited_elsewhere()  # for the trace: waited in C++ (see mark_steps)
        with self._lock:
            if self._future is None:
                self._source = torch.futures.Future()
                self._future = self._source.then(_raise_errors)
                if self._finished:
                    self._source.set_result(self._outcome())
            return self._future

    def result(self):
        return self._outputs

    def __repr__(self):
        what = ", ".join(w.what for w in self._natives) or "a completed call"
        return f"<ConfluxWork {what}>"


def _raise_errors(source):
    """A call's outputs, or its error raised (the then() callback of ConfluxWork's futures)."""
    value = source.value()
    if isinstance(value, BaseException):
        # A new exception: the call's own is shared by every waiter and must not collect
        # this frame in its traceback.
        raise RuntimeError(f"{type(value).__name__}: {value}")
    return value


class ConfluxBackend(_C10dBackend):
    """torch.distributed's view of one conflux communicator."""

    def __init__(self, store, rank, size, timeout=None, trace_as=None, options=None):
        super().__init__(rank, size)
        self._comm = _comm_for(store, rank, size, timeout, trace_as, options)

    @property
    def comm(self):
        """The conflux communicator behind this group (as the C++ backend's `comm`)."""
        return self._comm

    def getBackendName(self):
        return NAME

    # torch's trampoline asks Python for these; left undefined, the lookup recurses.
    @property
    def supports_splitting(self):
        return False

    @property
    def supports_coalescing(self):
        return False

    # -- the machinery every method uses --
    def _run(self, opts, outputs, steps):
        """Runs `steps`, a list of (native method, args, tensors it uses, finish or None),
        blocking (GIL released) or asynchronously as `opts.asyncOp` says."""
        work = ConfluxWork(outputs)
        if not opts.asyncOp:
            for call, args, _keep, finish in steps:
                call(*args)
                if finish is not None:
                    finish()
            return work
        work._start(len(steps))
        for call, args, keep, finish in steps:
            work._natives.append(call(*args, work._callback(*keep)))
            if finish is not None:
                work._finish.append(finish)
        return work._issued()

    @staticmethod
    def _contig(t):
        """(contiguous tensor to work on, finish copying it back into t or None)."""
        if t.is_contiguous():
            return t, None
        _triple(t)  # refuses what conflux cannot carry before copying it
        c = t.contiguous()
        return c, (lambda: t.copy_(c))

    def _reducing(self, call, t, opts, *extra):
        name, factor = _op(opts.reduceOp, t)
        if factor is None and t.is_contiguous():
            return (call, (_triple(t), name, *extra), (t,), None)
        c, back = self._contig(t)
        if factor is not None:
            if c is t:
                c = t.clone()
                back = (lambda: t.copy_(c))
            c.mul_(factor)
        return (call, (_triple(c), name, *extra), (c, t), back)

    # -- collectives --
    def allreduce(self, tensors, opts):
        if len(tensors) == 1 and not opts.asyncOp and tensors[0].is_contiguous():
            # The latency-bound case (one small blocking all_reduce), without the general path's
            # step lists: about 1 us of the ~3 us this layer adds.
            t = tensors[0]
            name, factor = _op(opts.reduceOp, t)
            if factor is None:
                self._comm.all_reduce(_triple(t), name)
                return ConfluxWork(tensors)
        return self._run(opts, tensors, [self._reducing(self._comm.all_reduce, t, opts) for t in tensors])

    def allreduce_coalesced(self, tensors, opts):
        if not tensors:
            return self._run(opts, tensors, [])
        flat = torch.cat([t.reshape(-1) for t in tensors])
        step = self._reducing(self._comm.all_reduce, flat, opts)

        def scatter_back():
            if step[3] is not None:
                step[3]()
            at = 0
            for t in tensors:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()
        return self._run(opts, tensors, [step[:3] + (scatter_back,)])

    def reduce(self, tensors, opts):
        t = tensors[opts.rootTensor]
        return self._run(opts, tensors, [self._reducing(self._comm.reduce, t, opts, opts.rootRank)])

    def broadcast(self, tensors, opts):
        steps = []
        for t in tensors:
            c, back = self._contig(t)
            steps.append((self._comm.broadcast, (_triple(c), opts.rootRank), (c, t), back))
        return self._run(opts, tensors, steps)

    def _gather_into(self, flat, inp):
        """Copies `inp` into this rank's block of the flat all_gather buffer."""
        n = inp.numel()
        flat[self.rank() * n:(self.rank() + 1) * n].copy_(inp.reshape(-1))

    def _all_gather_step(self, outs, inp):
        """One all_gather of `inp` into the list of tensors `outs` (one per rank)."""
        self._check_list(outs, inp, "all_gather")
        flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
        self._gather_into(flat, inp)

        def split():
            for o, block in zip(outs, flat.chunk(self.size())):
                o.copy_(block.view_as(o))
        return (self._comm.all_gather, (_triple(flat),), (flat, inp, *outs), split)

    def allgather(self, output_tensors, input_tensors, opts):
        steps = [self._all_gather_step(o, i) for o, i in zip(output_tensors, input_tensors)]
        return self._run(opts, output_tensors, steps)

    def allgather_coalesced(self, output_lists, input_list, opts):
        """torch's layout (as gloo's): output_lists[r][j] receives rank r's input_list[j]."""
        n = self.size()
        if len(output_lists) != n or any(len(outs) != len(input_list) for outs in output_lists):
            raise InvalidArgument(f"all_gather_coalesced: output lists must be {n} (one per rank) of "
                                  f"{len(input_list)} tensors (one per input); got "
                                  f"{[len(outs) for outs in output_lists]}")
        per_input = [[output_lists[r][j] for r in range(n)] for j in range(len(input_list))]
        steps = [self._all_gather_step(o, i) for o, i in zip(per_input, input_list)]
        return self._run(opts, output_lists, steps)

    def _all_gather_single_step(self, output, inp):
        if output.numel() != inp.numel() * self.size() or output.dtype != inp.dtype:
            raise InvalidArgument(f"all_gather_into_tensor: output has {output.numel()} {output.dtype}, "
                                  f"expected {self.size()} x {inp.numel()} {inp.dtype}")
        c, back = self._contig(output)
        self._gather_into(c.view(-1), inp)
        return (self._comm.all_gather, (_triple(c),), (c, output, inp), back)

    def all_gather_single(self, output, inp, opts):
        return self._run(opts, [output], [self._all_gather_single_step(output, inp)])

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        steps = [self._all_gather_single_step(o, i) for o, i in zip(outputs, inputs)]
        return self._run(opts, outputs, steps)

    def _reduce_scatter_step(self, output, flat, opts):
        """Reduce-scatters the flat (size x n) buffer `flat`, which it may clobber, into output."""
        if flat.numel() != output.numel() * self.size() or flat.dtype != output.dtype:
            raise InvalidArgument(f"reduce_scatter: input has {flat.numel()} {flat.dtype}, "
                                  f"expected {self.size()} x {output.numel()} {output.dtype}")
        step = self._reducing(self._comm.reduce_scatter, flat, opts)
        work_on = step[2][0]
        n = output.numel()

        def take_block():
            output.copy_(work_on[self.rank() * n:(self.rank() + 1) * n].view_as(output))
        return step[:3] + (take_block,)

    def reduce_scatter(self, output_tensors, input_lists, opts):
        steps = []
        for out, ins in zip(output_tensors, input_lists):
            self._check_list(ins, out, "reduce_scatter")
            steps.append(self._reduce_scatter_step(out, torch.cat([t.reshape(-1) for t in ins]), opts))
        return self._run(opts, output_tensors, steps)

    def reduce_scatter_single(self, output, inp, opts):
        flat = inp.reshape(-1).clone()
        return self._run(opts, [output], [self._reduce_scatter_step(output, flat, opts)])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        steps = [self._reduce_scatter_step(o, i.reshape(-1).clone(), opts) for o, i in zip(outputs, inputs)]
        return self._run(opts, outputs, steps)

    def _v_step(self, send, send_counts, recv, recv_counts, outputs_back=None):
        """all_to_all_v of flat contiguous tensors; `outputs_back` copies recv into outputs."""
        if send.dtype != recv.dtype:
            raise InvalidArgument(f"all_to_all: input is {send.dtype}, output {recv.dtype}")
        args = (_triple(send), list(send_counts), _triple(recv), list(recv_counts))
        return (self._comm.all_to_all_v, args, (send, recv), outputs_back)

    def alltoall(self, output_tensors, input_tensors, opts):
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        recv = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype)

        def split():
            at = 0
            for o in output_tensors:
                o.copy_(recv[at:at + o.numel()].view_as(o))
                at += o.numel()
        step = self._v_step(send, [t.numel() for t in input_tensors], recv,
                            [t.numel() for t in output_tensors], split)
        return self._run(opts, output_tensors, [step])

    def all_to_all_single(self, output, inp, output_split_sizes, input_split_sizes, opts):
        n = self.size()
        send = inp.contiguous()
        recv, back = self._contig(output)

        def counts(t, splits):
            if t.dim() == 0:
                raise InvalidArgument("all_to_all_single needs tensors with a first dimension")
            row = math.prod(t.shape[1:])
            if not splits:
                if t.size(0) % n:
                    raise InvalidArgument(f"all_to_all_single: {t.size(0)} rows do not split into {n} equal parts")
                splits = [t.size(0) // n] * n
            if len(splits) != n:
                raise InvalidArgument(f"all_to_all_single: {len(splits)} split sizes for {n} ranks")
            return [s * row for s in splits]
        step = self._v_step(send, counts(inp, input_split_sizes), recv, counts(output, output_split_sizes), back)
        return self._run(opts, [output], [step])

    def gather(self, output_lists, input_tensors, opts):
        root, n, inp = opts.rootRank, self.size(), input_tensors[0].contiguous()
        me = self.rank()
        send_counts = [inp.numel() if p == root else 0 for p in range(n)]
        if me == root:
            outs = output_lists[0]
            self._check_list(outs, inp, "gather")
            recv = torch.empty(inp.numel() * n, dtype=inp.dtype)
            recv_counts = [inp.numel()] * n

            def split():
                for o, block in zip(outs, recv.chunk(n)):
                    o.copy_(block.view_as(o))
        else:
            recv, recv_counts, split = torch.empty(0, dtype=inp.dtype), [0] * n, None
        return self._run(opts, output_lists, [self._v_step(inp, send_counts, recv, recv_counts, split)])

    def scatter(self, output_tensors, input_lists, opts):
        root, n, out = opts.rootRank, self.size(), output_tensors[0]
        recv, back = self._contig(out)
        recv_counts = [out.numel() if p == root else 0 for p in range(n)]
        if self.rank() == root:
            ins = input_lists[0]
            self._check_list(ins, out, "scatter")
            send, send_counts = torch.cat([t.reshape(-1) for t in ins]), [out.numel()] * n
        else:
            send, send_counts = torch.empty(0, dtype=out.dtype), [0] * n
        return self._run(opts, output_tensors, [self._v_step(send, send_counts, recv, recv_counts, back)])

    def send(self, tensors, dst, tag=0):
        steps = []
        for t in tensors:
            c = t.contiguous()
            steps.append((self._comm.send, (_triple(c), dst, tag), (c,), None))
        return self._run(_ASYNC, tensors, steps)

    def recv(self, tensors, src, tag=0):
        steps = []
        for t in tensors:
            c, back = self._contig(t)
            steps.append((self._comm.recv, (_triple(c), src, tag), (c, t), back))
        return self._run(_ASYNC, tensors, steps)

    def recv_anysource(self, tensors, tag=0):
        if len(tensors) != 1:
            raise InvalidArgument(f"recv from any source takes one tensor, not {len(tensors)}")
        c, back = self._contig(tensors[0])
        return self._run(_ASYNC, tensors, [(self._comm.recv_any, (_triple(c), tag), (c, tensors[0]), back)])

    def barrier(self, opts):
        return self._run(opts, [], [(self._comm.barrier, (), (), None)])

    # -- life cycle --
    def shutdown(self):
        self._comm.shutdown()

    def abort(self):
        self._comm.abort()

    def _check_list(self, tensors, like, what):
        if len(tensors) != self.size():
            raise InvalidArgument(f"{what}: {len(tensors)} tensors for {self.size()} ranks")
        for t in tensors:
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise InvalidArgument(f"{what}: a tensor of {t.numel()} {t.dtype} where "
                                      f"{like.numel()} {like.dtype} was expected")


def _nbytes(x):
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


def _profiled(name, method):
    """`method`, seen by torch.profiler as a range "conflux:<name>" with its bytes, so that
    collectives line up with computation in torch's own trace; one cheap check when off."""
    label = f"conflux:{name}"
    enabled = torch.autograd._profiler_enabled

    def run(self, *args, **kwargs):
        if not enabled():
            return method(self, *args, **kwargs)
        with torch.autograd.profiler.record_function(label, f"bytes={_nbytes(args[:2])}"):
            return method(self, *args, **kwargs)

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


for _method, _name in [("allreduce", "all_reduce"), ("allreduce_coalesced", "all_reduce_coalesced"),
                       ("reduce", "reduce"), ("broadcast", "broadcast"), ("allgather", "all_gather"),
                       ("allgather_coalesced", "all_gather_coalesced"), ("all_gather_single", "all_gather"),
                       ("all_gather_single_coalesced", "all_gather_coalesced"),
                       ("reduce_scatter", "reduce_scatter"), ("reduce_scatter_single", "reduce_scatter"),
                       ("reduce_scatter_single_coalesced", "reduce_scatter_coalesced"),
                       ("alltoall", "all_to_all"), ("all_to_all_single", "all_to_all"), ("gather", "gather"),
                       ("scatter", "scatter"), ("send", "send"), ("recv", "recv"),
                       ("recv_anysource", "recv"), ("barrier", "barrier")]:
    setattr(ConfluxBackend, _method, _profiled(_name, getattr(ConfluxBackend, _method)))


class _Async:
    """Options for calls torch gives none (send, recv): always asynchronous, as torch's are."""
    asyncOp = True


_ASYNC = _Async()
