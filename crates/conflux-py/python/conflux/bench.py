"""torch.distributed collectives over backend "conflux" and backend "gloo", side by side.

    conflux run -n 2 -- python -m conflux.bench                      # all_reduce, 8 B .. 64 MiB
    conflux run -n 4 -- python -m conflux.bench --op all_gather,reduce_scatter -b 1K -e 16M --check
    conflux run -n 2 -- python -m conflux.bench --overhead           # 8 B latency: torch vs python API vs Rust

Every rank process joins one job twice: the default group is one backend (gloo unless
``--default-group conflux``) and a second group over all ranks, made with
``dist.new_group(backend=...)``, is the other. Each size runs conflux then gloo, back to
back, on the same buffers, so machine noise lands on both alike. Timing follows nccl-tests:
warm-up, barrier, N back-to-back blocking calls timed with ``time.perf_counter``, the
slowest rank's elapsed time (an all_reduce MAX over the gloo group) divided by N.
algbw = size / time; busbw = algbw x the operation's factor (all_reduce 2(n-1)/n,
all_gather, reduce_scatter and all_to_all (n-1)/n, broadcast and sendrecv 1). Sizes are nccl-tests':
all_gather's is the whole output, reduce_scatter's the whole input, all_to_all's one rank's
whole send buffer, sendrecv's the one message each rank sends to the next (isend) while it
receives one from the rank before (irecv), both issued by ``batch_isend_irecv``, as a pipeline
stage does. Rank 0 prints one table per operation with both backends and the ratio
conflux busbw / gloo busbw (= gloo time / conflux time).
"""

import argparse
import csv
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")
BACKENDS = ("conflux", "gloo")  # the order each size runs in

DTYPES = {"float32": torch.float32, "float": torch.float32, "f32": torch.float32,
          "float64": torch.float64, "double": torch.float64, "f64": torch.float64,
          "float16": torch.float16, "half": torch.float16, "f16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "int32": torch.int32, "i32": torch.int32, "int64": torch.int64, "i64": torch.int64,
          "int8": torch.int8, "i8": torch.int8, "uint8": torch.uint8, "u8": torch.uint8}

TARGET_S = 0.3          # adaptive --iters: each (size, backend) runs about this long
MIN_ITERS, MAX_ITERS = 5, 100_000
CALIBRATE_S = 0.02       # adaptive --iters: the calibration batch's length
OVERHEAD_BYTES = 8
RUST_ITERS = 5000       # --overhead: timed calls of each `conflux bench` run
FAKE_ROW = "torch.distributed, torch's fake backend (torch alone)"
BACKEND_ROW = "conflux's torch backend called directly"
FAKE_BACKEND_ROW = "torch's fake backend called directly"

# The launcher's variables, removed from the environment of a nested `conflux bench`.
_JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
             "CONFLUX_RUN_ID")


# ---------------------------------------------------------------------------------------------
# arguments

def parse_size(s):
    """'8', '64K', '64M', '1G' (powers of 1024, as nccl-tests and `conflux bench`)."""
    t = str(s).strip()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:].lower(), 1)
    digits = t[:-1] if mult != 1 else t
    if not digits.strip().isdigit():
        raise argparse.ArgumentTypeError(f"bad size {s!r}: a number with an optional K, M or G suffix")
    return int(digits) * mult


def parse_ops(s):
    ops = [o.strip() for o in s.split(",") if o.strip()]
    if ops == ["all"]:
        return list(OPS)
    for o in ops:
        if o not in OPS:
            raise argparse.ArgumentTypeError(f"unknown op {o!r}: one of {', '.join(OPS)}, all, or a comma list")
    if not ops:
        raise argparse.ArgumentTypeError("no op given")
    return ops


def positive(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s} is not a positive integer")
    return v


def non_negative(s):
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s} is negative")
    return v


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m conflux.bench",
        description="torch.distributed collectives over backend conflux and backend gloo, side by side "
                    "(launch per rank: conflux run -n N -- python -m conflux.bench ...)")
    p.add_argument("--op", type=parse_ops, default=["all_reduce"],
                   help=f"{', '.join(OPS)}, a comma list of them, or all (default all_reduce)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8, help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20, help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="multiplier between sizes (default 4)")
    p.add_argument("--iters", type=positive, default=None,
                   help=f"timed calls per size and backend (default: adaptive, about {TARGET_S} s each, "
                        f"at least {MIN_ITERS})")
    p.add_argument("--warmup", type=non_negative, default=3, help="untimed calls first (default 3)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), metavar="DTYPE",
                   help="float32 (default), float64, float16, bfloat16, int32, int64, int8, uint8")
    p.add_argument("--check", action="store_true",
                   help="first pass per size: rank-dependent inputs through both backends, conflux's result "
                        "compared with gloo's (and both with the exact expectation)")
    p.add_argument("--csv", metavar="FILE", help="also write the rows to FILE (rank 0)")
    p.add_argument("--default-group", choices=BACKENDS, default="gloo",
                   help="backend of the default group; the other one is a new_group over all ranks "
                        "(default gloo)")
    p.add_argument("--overhead", action="store_true",
                   help=f"{OVERHEAD_BYTES} B all_reduce latency: torch.distributed over conflux (and gloo) vs "
                        "the conflux Python API vs the raw native binding vs the Rust bench")
    p.add_argument("--rounds", type=positive, default=5,
                   help="--overhead: rounds of every method, alternating; the median is reported (default 5)")
    p.add_argument("--no-rust", action="store_true",
                   help="--overhead: do not start `conflux bench` from rank 0 for the Rust figure")
    return p


# ---------------------------------------------------------------------------------------------
# the job

class Job:
    """This process's two groups over all ranks, one per backend."""

    def __init__(self, default_backend):
        if "WORLD_SIZE" not in os.environ:
            print("conflux.bench: no WORLD_SIZE in the environment; running as a job of 1 rank "
                  "(launch with: conflux run -n N -- python -m conflux.bench ...)", file=sys.stderr)
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port("127.0.0.1")))
        other = "conflux" if default_backend == "gloo" else "gloo"
        dist.init_process_group(backend=default_backend)
        second = dist.new_group(backend=other)
        self.groups = {default_backend: dist.group.WORLD, other: second}
        self.default_backend = default_backend
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.lead = self.rank == 0

    def group(self, backend):
        return self.groups[backend]

    def slowest(self, seconds):
        """The largest of every rank's `seconds` (all_reduce MAX over the gloo group)."""
        t = torch.tensor([float(seconds)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.groups["gloo"])
        return t.item()

    def total(self, value):
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.groups["gloo"])
        return int(t.item())

    def barrier(self):
        dist.barrier(group=self.groups["gloo"])

    def close(self):
        dist.destroy_process_group()


from conflux.torch import _free_port  # noqa: E402 - after torch, like the rest


def _launcher():
    """The `conflux` binary that started this process (its parent), else one on PATH, or None."""
    try:
        exe = os.readlink(f"/proc/{os.getppid()}/exe")
        if os.path.basename(exe) == "conflux":
            return exe
    except OSError:
        pass
    return os.environ.get("CONFLUX_BIN") or shutil.which("conflux")


def reproduce_command(size):
    """The command line that reruns this job."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", size) or size)
    nodes = max(1, size // max(1, local))
    args = " ".join(shlex.quote(a) for a in sys.argv[1:])
    py = shlex.quote(sys.executable)
    if "CONFLUX_RUN_ID" in os.environ or "TORCHELASTIC_RUN_ID" not in os.environ:
        launcher = shlex.quote(_launcher() or "conflux") + " run"
        multi = (f" --nnodes {nodes} --node-rank <node> --master-addr {os.environ.get('MASTER_ADDR')}"
                 f" --master-port {os.environ.get('MASTER_PORT')}") if nodes > 1 else ""
        return f"{launcher} -n {local}{multi} -- {py} -m conflux.bench {args}".rstrip()
    multi = f" --nnodes {nodes}" if nodes > 1 else ""
    return f"torchrun --nproc-per-node {local}{multi} -m conflux.bench {args}".rstrip()


def _versions():
    try:
        from importlib.metadata import version
        cf = version("conflux")
    except Exception:  # noqa: BLE001 - informational only
        cf = "?"
    return cf


def memcpy_gbps():
    """Single-core torch copy_ of 64 MiB, the reference busbw is read against."""
    src = torch.ones(16 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps = 4
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return src.numel() * 4 * reps / (time.perf_counter() - t) / 1e9


def print_header(job, args, mode):
    if not job.lead:
        return
    iters = f"{args.iters} iters" if args.iters else f"iters adaptive (~{TARGET_S} s per size and backend, >= {MIN_ITERS})"
    other = "conflux" if job.default_backend == "gloo" else "gloo"
    local = os.environ.get("LOCAL_WORLD_SIZE", "?")
    print(f"# conflux.bench {mode}: world size {job.size} ({local} on this host), torch {torch.__version__}, "
          f"conflux {_versions()}, python {platform.python_version()}, {os.cpu_count()} cpus", flush=True)
    print(f"# default group {job.default_backend}, {other} via new_group over all ranks; dtype {args.dtype}, "
          f"{iters}, {args.warmup} warmup, check {'on' if args.check else 'off'}; "
          f"CONFLUX_TRANSPORT={os.environ.get('CONFLUX_TRANSPORT', 'auto')} "
          f"CONFLUX_ALGO={os.environ.get('CONFLUX_ALGO', 'auto')} "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}", flush=True)
    print(f"# reproduce: {reproduce_command(job.size)}", flush=True)


# ---------------------------------------------------------------------------------------------
# one operation at one size

def bus_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


class Case:
    """The buffers and the blocking call of one operation at one size, for either backend."""

    def __init__(self, op, nbytes, dtype, n):
        es = torch.empty((), dtype=dtype).element_size()
        self.op, self.dtype, self.n = op, dtype, n
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            self.block = max(1, nbytes // es // n)      # elements per rank
            self.count = self.block * n
        else:
            self.count = max(1, nbytes // es)
            self.block = self.count
        self.bytes = self.count * es
        # Zeros: repeated in-place sums stay finite (no inf, no denormals) at any iteration count.
        if op == "all_gather":
            self.inp, self.out = torch.zeros(self.block, dtype=dtype), torch.zeros(self.count, dtype=dtype)
        elif op == "reduce_scatter":
            self.inp, self.out = torch.zeros(self.count, dtype=dtype), torch.zeros(self.block, dtype=dtype)
        elif op in ("all_to_all", "sendrecv"):
            self.inp, self.out = torch.zeros(self.count, dtype=dtype), torch.zeros(self.count, dtype=dtype)
        else:
            self.inp = self.out = torch.zeros(self.count, dtype=dtype)

    def call(self, group):
        """The blocking call, as a function of nothing."""
        op, inp, out = self.op, self.inp, self.out
        if op == "all_reduce":
            return lambda: dist.all_reduce(out, group=group)
        if op == "all_gather":
            return lambda: dist.all_gather_into_tensor(out, inp, group=group)
        if op == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
        if op == "broadcast":
            return lambda: dist.broadcast(out, src=0, group=group)
        if op == "sendrecv":
            # A pipeline stage's exchange: isend to the next rank, irecv from the one before.
            rank, n = dist.get_rank(), self.n
            if n == 1:
                return lambda: out.copy_(inp)
            ops = [dist.P2POp(dist.isend, inp, (rank + 1) % n, group), dist.P2POp(dist.irecv, out, (rank - 1) % n, group)]
            return lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]
        return lambda: dist.all_to_all_single(out, inp, group=group)

    # -- --check --
    def _input(self, rank, count):
        """Rank `rank`'s input: small integers, exact in every dtype and in any summation order."""
        g = torch.Generator().manual_seed(1_000_003 * (rank + 1) + count)
        lo = 0 if self.dtype == torch.uint8 else -4
        return torch.randint(lo, 5, (count,), generator=g, dtype=torch.int64)

    def _cast(self, v):
        # Integer sums wrap as the backends' do (int64 -> narrower ints truncates two's complement).
        return v.to(self.dtype)

    def expected(self, rank):
        n, b = self.n, self.block
        if self.op == "all_reduce":
            return self._cast(sum(self._input(r, self.count) for r in range(n)))
        if self.op == "broadcast":
            return self._cast(self._input(0, self.count))
        if self.op == "sendrecv":
            return self._cast(self._input((rank - 1) % n, self.count))
        if self.op == "all_gather":
            return self._cast(torch.cat([self._input(r, b) for r in range(n)]))
        if self.op == "reduce_scatter":
            return self._cast(sum(self._input(r, self.count)[rank * b:(rank + 1) * b] for r in range(n)))
        return self._cast(torch.cat([self._input(r, self.count)[rank * b:(rank + 1) * b] for r in range(n)]))

    def run_checked(self, group, rank):
        """One call on rank-dependent inputs; returns this rank's result (a copy)."""
        size = self.block if self.op == "all_gather" else self.count
        x = self._cast(self._input(rank, size))
        if self.op in ("all_reduce", "broadcast"):
            self.out.copy_(x)
        else:
            self.inp.copy_(x)
            self.out.zero_()
        self.call(group)()
        result = self.out.clone()
        self.out.zero_()
        self.inp.zero_()
        return result


def _wrong(a, b):
    """Elements of `a` not close to `b` (exact for integers)."""
    if a.dtype.is_floating_point:
        rtol = 1e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-5
        close = torch.isclose(a.double(), b.double(), rtol=rtol, atol=0.0)
    else:
        close = a == b
    return int((~close).sum().item())


def check(job, case):
    """(#wrong conflux vs gloo, conflux vs exact, gloo vs exact), summed over ranks."""
    got = {be: case.run_checked(job.group(be), job.rank) for be in BACKENDS}
    want = case.expected(job.rank)
    return (job.total(_wrong(got["conflux"], got["gloo"])),
            job.total(_wrong(got["conflux"], want)),
            job.total(_wrong(got["gloo"], want)))


def calibrate(job, call):
    """Seconds per call, estimated from back-to-back batches growing until one lasts
    CALIBRATE_S (the slowest rank's time decides, so every rank takes the same steps)."""
    k = 1
    while True:
        t = time.perf_counter()
        for _ in range(k):
            call()
        spent = job.slowest(time.perf_counter() - t)
        if spent >= CALIBRATE_S or k * 2 > MAX_ITERS:
            return spent / k
        k = min(MAX_ITERS, max(2 * k, math.ceil(k * CALIBRATE_S * 1.2 / max(spent, 1e-9))), 16 * k)


def time_calls(job, call, barrier, warmup, iters):
    """(seconds per call of the slowest rank, calls timed): warm-up, `barrier()`, then `iters`
    back-to-back calls. With iters None, the count comes from a calibration after the
    warm-up, the same on every rank."""
    for _ in range(warmup):
        call()
    if iters is None:
        per_call = calibrate(job, call)
        iters = int(min(MAX_ITERS, max(MIN_ITERS, math.ceil(TARGET_S / max(per_call, 1e-9)))))
    barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    elapsed = time.perf_counter() - t
    return job.slowest(elapsed) / iters, iters


# ---------------------------------------------------------------------------------------------
# the tables

COLS = ("op", "size_bytes", "count", "dtype", "ranks",
        "conflux_time_us", "conflux_algbw_gbps", "conflux_busbw_gbps", "conflux_iters",
        "gloo_time_us", "gloo_algbw_gbps", "gloo_busbw_gbps", "gloo_iters",
        "ratio_conflux_over_gloo", "wrong_conflux_vs_gloo", "wrong_conflux", "wrong_gloo")


def table_header(op, checking):
    w = " {:>7}".format("#wrong") if checking else ""
    print(f"# {op}", flush=True)
    print("#{:>12} {:>11} {:>8}   {:-^32}   {:-^32} {:>9} {:>13}{}".format(
        "", "", "", " conflux ", " gloo ", "", "", " " * len(w)), flush=True)
    print("#{:>12} {:>11} {:>8} {:>11} {:>10} {:>10} {:>11} {:>10} {:>10} {:>9} {:>13}{}".format(
        "size", "count", "type", "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw",
        "ratio", "iters", w), flush=True)
    print("#{:>12} {:>11} {:>8} {:>11} {:>10} {:>10} {:>11} {:>10} {:>10} {:>9} {:>13}{}".format(
        "(B)", "(elements)", "", "", "(GB/s)", "(GB/s)", "", "(GB/s)", "(GB/s)", "(c/g)", "(c/g)",
        "" if not checking else " {:>7}".format("(c/g)")), flush=True)


def table_row(r, checking):
    w = " {:>7}".format(r["wrong_conflux_vs_gloo"]) if checking else ""
    print(" {:>12} {:>11} {:>8} {:>11.2f} {:>10.3f} {:>10.3f} {:>11.2f} {:>10.3f} {:>10.3f} {:>9.2f} {:>13}{}".format(
        r["size_bytes"], r["count"], r["dtype"], r["conflux_time_us"], r["conflux_algbw_gbps"],
        r["conflux_busbw_gbps"], r["gloo_time_us"], r["gloo_algbw_gbps"], r["gloo_busbw_gbps"],
        r["ratio_conflux_over_gloo"], f"{r['conflux_iters']}/{r['gloo_iters']}", w), flush=True)


def bench(job, args):
    dtype = DTYPES[args.dtype]
    es = torch.empty((), dtype=dtype).element_size()
    if args.stepfactor < 2:
        raise SystemExit("conflux.bench: --stepfactor must be at least 2")
    sizes = []
    b = max(args.minbytes, es)
    while b <= args.maxbytes:
        sizes.append(b)
        b *= args.stepfactor
    print_header(job, args, "collectives")
    if job.lead:
        print(f"# reference: single-core torch copy_ of 64 MiB on this machine: {memcpy_gbps():.2f} GB/s", flush=True)
        print("# ratio = conflux busbw / gloo busbw (= gloo time / conflux time); iters = timed calls "
              "conflux/gloo", flush=True)
    job.barrier()
    rows, bad = [], 0
    tally = [0, 0, 0]  # wrong elements: conflux vs gloo, conflux vs exact, gloo vs exact
    for op in args.op:
        if job.lead:
            table_header(op, args.check)
        ratios = []
        for nbytes in sizes:
            case = Case(op, nbytes, dtype, job.size)
            row = {"op": op, "size_bytes": case.bytes, "count": case.count, "dtype": args.dtype, "ranks": job.size}
            if args.check:
                c_vs_g, c_bad, g_bad = check(job, case)
                row.update(wrong_conflux_vs_gloo=c_vs_g, wrong_conflux=c_bad, wrong_gloo=g_bad)
                tally = [tally[0] + c_vs_g, tally[1] + c_bad, tally[2] + g_bad]
                bad += c_vs_g + c_bad
            factor = bus_factor(op, job.size)
            for be in BACKENDS:
                group = job.group(be)
                secs, iters = time_calls(job, case.call(group), lambda: dist.barrier(group=group),
                                         args.warmup, args.iters)
                algbw = case.bytes / secs / 1e9
                row.update({f"{be}_time_us": secs * 1e6, f"{be}_algbw_gbps": algbw,
                            f"{be}_busbw_gbps": algbw * factor, f"{be}_iters": iters})
            row["ratio_conflux_over_gloo"] = row["gloo_time_us"] / row["conflux_time_us"]
            ratios.append(row["ratio_conflux_over_gloo"])
            rows.append(row)
            if job.lead:
                table_row(row, args.check)
                if args.check and (row["wrong_conflux"] or row["wrong_gloo"]):
                    print(f"#   {case.bytes} B: wrong elements vs the exact result: conflux "
                          f"{row['wrong_conflux']}, gloo {row['wrong_gloo']}", flush=True)
            del case
        if job.lead and ratios:
            geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
            print(f"# {op}: conflux/gloo ratio geometric mean {geo:.2f} over {len(ratios)} sizes "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f})", flush=True)
    if job.lead and args.check:
        if not any(tally):
            print("# check: all results agree (conflux with gloo, both with the exact result)", flush=True)
        else:
            print(f"# check: WRONG: conflux differs from gloo in {tally[0]} elements and from the exact "
                  f"result in {tally[1]}; gloo differs from the exact result in {tally[2]} "
                  "(summed over ranks and sizes)", flush=True)
    if job.lead and args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLS, restval="")
            w.writeheader()
            w.writerows(rows)
        print(f"# wrote {len(rows)} rows to {args.csv}", flush=True)
    return 0 if bad == 0 else 3


# ---------------------------------------------------------------------------------------------
# --overhead

def python_api_comm(job):
    """A conflux communicator of the plain Python API over the same ranks, bootstrapped like
    the torch backend's: rank 0 publishes a free port through torch's store."""
    import conflux
    from conflux._native import Comm

    from conflux.torch import store_address

    store = dist.distributed_c10d._get_default_store()
    native = Comm.create(job.rank, job.size, store_address(store, job.rank, job.size, "conflux_bench/overhead_store"))
    return native, conflux.Communicator(native)


def rust_bench(job, rounds):
    """Rank 0 runs `conflux bench all_reduce -n N -b 8 -e 8` (its own job, the others waiting),
    `rounds` times; returns (command, [time_us of each run] or None, why not or None)."""
    exe = _launcher()
    iters, warmup = RUST_ITERS, 200
    n = job.size
    cmd = [exe or "conflux", "bench", "all_reduce", "-n", str(n), "-b", str(OVERHEAD_BYTES),
           "-e", str(OVERHEAD_BYTES), "--iters", str(iters), "--warmup", str(warmup), "--json"]
    shown = " ".join(shlex.quote(c) for c in cmd)
    if exe is None:
        return shown, None, "no conflux binary found (parent process, CONFLUX_BIN, PATH)"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    if local != n:
        return shown, None, "the job spans several hosts; the Rust bench here would be one-host"
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARS}
    times = []
    for _ in range(rounds):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            return shown, None, f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"
        for line in p.stdout.splitlines():
            line = line.split("]: ", 1)[-1].strip()  # the launcher's rank prefix, if any
            if line.startswith("{"):
                times.append(json.loads(line)["time_us"])
    return shown, times, None


def fake_group():
    """A group on torch's own "fake" backend, which communicates nothing: what dist.all_reduce
    costs in torch alone (dispatch, the Python wrapper, the flight recorder's hook when torch
    attaches one). None where this torch has no fake backend."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
        return dist.new_group(backend="fake")
    except Exception:  # an internal module: absent or changed in some torch versions
        return None


def overhead(job, args):
    import numpy as np

    print_header(job, args, "overhead")
    native, api = python_api_comm(job)
    count = OVERHEAD_BYTES // 4
    t_cf = torch.zeros(count, dtype=torch.float32)
    t_gl = torch.zeros(count, dtype=torch.float32)
    arr = np.zeros(count, dtype=np.float32)
    raw = np.zeros(count, dtype=np.float32)
    raw_triple = (raw.__array_interface__["data"][0], count, "f32")
    g_cf, g_gl = job.group("conflux"), job.group("gloo")
    g_fake = fake_group()
    t_fake = torch.zeros(count, dtype=torch.float32)

    # (what, the call, the barrier before the timed calls: the same path's own)
    methods = [
        ("torch.distributed, backend conflux", lambda: dist.all_reduce(t_cf, group=g_cf),
         lambda: dist.barrier(group=g_cf)),
        ("conflux Python API (Communicator.all_reduce, numpy)", lambda: api.all_reduce(arr), api.barrier),
        ("conflux._native.Comm.all_reduce (raw triple)", lambda: native.all_reduce(raw_triple, "sum"),
         native.barrier),
        ("torch.distributed, backend gloo", lambda: dist.all_reduce(t_gl, group=g_gl),
         lambda: dist.barrier(group=g_gl)),
    ]
    if g_fake is not None:
        methods.append((FAKE_ROW, lambda: dist.all_reduce(t_fake, group=g_fake), job.barrier))
    # The same two backends called directly, below torch's dispatcher and Python wrapper: what
    # the backend itself costs, the collective included.
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    be_cf = g_cf._get_backend(torch.device("cpu"))
    methods.append((BACKEND_ROW, lambda: be_cf.allreduce([t_cf], opts).wait(), lambda: dist.barrier(group=g_cf)))
    if g_fake is not None:
        be_fake = g_fake._get_backend(torch.device("cpu"))
        methods.append((FAKE_BACKEND_ROW, lambda: be_fake.allreduce([t_fake], opts).wait(), job.barrier))
    results = {m[0]: [] for m in methods}
    iters_used = {m[0]: [] for m in methods}
    for _ in range(args.rounds):
        for name, call, barrier in methods:
            secs, iters = time_calls(job, call, barrier, args.warmup, args.iters)
            results[name].append(secs * 1e6)
            iters_used[name].append(iters)

    rust = None
    if job.lead and not args.no_rust:
        rust = rust_bench(job, args.rounds)
    job.barrier()  # the others wait here while rank 0's Rust bench runs
    if job.lead:
        print(f"# {OVERHEAD_BYTES} B float32 all_reduce (sum), slowest rank's mean per call; "
              f"{args.rounds} rounds of every method, alternating", flush=True)
        print("#{:<56} {:>12} {:>10} {:>10} {:>10}".format("path", "median(us)", "min(us)", "max(us)", "iters"),
              flush=True)
        for name, _, _ in methods:
            v = results[name]
            print(" {:<56} {:>12.2f} {:>10.2f} {:>10.2f} {:>10}".format(
                name, statistics.median(v), min(v), max(v), statistics.median(iters_used[name])), flush=True)
        base = statistics.median(results[methods[0][0]])
        floor = statistics.median(results[FAKE_ROW]) if FAKE_ROW in results else None
        if FAKE_BACKEND_ROW in results:
            direct = statistics.median(results[BACKEND_ROW]) - statistics.median(results[FAKE_BACKEND_ROW])
            print(f"# conflux's backend over fake's, both called directly: {direct:+.2f} us per call", flush=True)
        api_us = statistics.median(results[methods[1][0]])
        raw_us = statistics.median(results[methods[2][0]])
        if rust is not None:
            shown, times, why = rust
            if times:
                print(" {:<56} {:>12.2f} {:>10.2f} {:>10.2f} {:>10}".format(
                    "Rust (conflux bench, its own job)", statistics.median(times), min(times), max(times),
                    RUST_ITERS), flush=True)
                rust_us = statistics.median(times)
            else:
                rust_us = None
                print(f"# Rust bench not run: {why}", flush=True)
            print(f"# Rust figure: {shown}", flush=True)
            if floor is not None and rust_us is not None:
                print(f"# conflux through torch over torch's own floor (the fake backend): {base - floor:+.2f} us "
                      f"per call, of which the collective itself (Rust bench) {rust_us:.2f} us; "
                      f"flight recorder {'off' if os.environ.get('TORCH_FR_BUFFER_SIZE') == '0' else 'on'} "
                      "(TORCH_FR_BUFFER_SIZE=0 turns it off)", flush=True)
        else:
            rust_us = None
            print(f"# compare with the Rust bench: conflux bench all_reduce -n {job.size} -b {OVERHEAD_BYTES} "
                  f"-e {OVERHEAD_BYTES}", flush=True)
        print(f"# torch.distributed overhead over the Python API: {base - api_us:+.2f} us per call; "
              f"Python API over the raw binding: {api_us - raw_us:+.2f} us"
              + (f"; raw binding over Rust: {raw_us - rust_us:+.2f} us" if rust_us is not None else ""),
              flush=True)
    native.shutdown()
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    job = Job(args.default_group)
    try:
        rc = overhead(job, args) if args.overhead else bench(job, args)
        job.barrier()
    finally:
        job.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
