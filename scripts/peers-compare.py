#!/usr/bin/env python3
"""Set conflux bench results beside the peer baselines measured on this machine kind.

    scripts/peers-compare.py --peers ../shared/peers/results -n 2 --transport shm run1.csv run2.csv ...

The CSVs are `conflux bench all -b 16 --csv FILE` runs (sizes 16 B x 4^k match the peers'
own); several runs of one configuration are reduced to their median time per (op, size).
The peers are OpenMPI and MPICH (`summary.md`: medians of 3 runs of coll_bench.c, back to
back, the slowest rank's time) and torch's gloo (`gloo-wsN-median.txt`, always over TCP and
timed through torch's Python API, so shown for scale only). All time their calls back to
back, as `conflux bench` does by default, and size them as nccl-tests does, so the times
compare directly.
"""
import argparse
import csv
import os
import re
import statistics
import sys

# coll_bench.c's names -> conflux's.
MPI_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "bcast": "broadcast",
    "alltoall": "all_to_all",
    "reduce": "reduce",
}
OPS = list(MPI_OPS.values())


def read_conflux(paths):
    """(op, bytes) -> median time in microseconds over the given runs (auto rows only)."""
    times = {}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["algo"] != "auto":
                    continue
                key = (row["op"], int(row["bytes"]))
                times.setdefault(key, []).append(float(row["time_us"]))
    return {k: statistics.median(v) for k, v in times.items()}


def read_mpi(summary, library, nproc, transport):
    """(op, bytes) -> median time from summary.md's per-size table of one configuration."""
    heading = f"### {library} np={nproc} {transport}"
    out = {}
    with open(summary) as f:
        lines = f.read().splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        return out
    columns = None
    for line in lines[start + 1:]:
        if line.startswith("###") or line.startswith("</details>"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "size_B":
            columns = [MPI_OPS.get(c) for c in cells[1:]]
            continue
        if columns is None or not cells[0].isdigit():
            continue
        size = int(cells[0])
        for op, cell in zip(columns, cells[1:]):
            m = re.match(r"([\d.]+)\s*/", cell)
            if op and m:
                out[(op, size)] = float(m.group(1))
    return out


def read_gloo(path):
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) >= 5:
                out[(parts[0], int(parts[2]))] = float(parts[4])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", required=True, help="the peers' results folder")
    ap.add_argument("-n", "--nproc", type=int, required=True)
    ap.add_argument("--transport", choices=["shm", "tcp"], required=True)
    ap.add_argument("csvs", nargs="+")
    args = ap.parse_args()

    mine = read_conflux(args.csvs)
    summary = os.path.join(args.peers, "summary.md")
    peers = {
        "openmpi": read_mpi(summary, "openmpi", args.nproc, args.transport),
        "mpich": read_mpi(summary, "mpich", args.nproc, args.transport),
    }
    gloo = read_gloo(os.path.join(args.peers, f"gloo-ws{args.nproc}-median.txt"))
    if not any(peers.values()):
        sys.exit(f"no peer results for np={args.nproc} {args.transport} in {args.peers}")

    print(f"# conflux (median of {len(args.csvs)} runs) against MPI, {args.nproc} ranks, "
          f"{args.transport}; ratio = the faster MPI's time / conflux's time (above 1: conflux "
          f"is faster). gloo: torch.distributed over TCP, with torch's per-call cost, for scale")
    print(f"{'op':>15} {'size(B)':>10} {'conflux':>9} {'openmpi':>9} {'mpich':>9} "
          f"{'gloo':>9} {'ratio':>6}   (times in us)")
    ratios = []
    for op in OPS:
        for size in sorted(s for (o, s) in mine if o == op):
            mpi = [t[(op, size)] for t in peers.values() if (op, size) in t]
            if not mpi:
                continue
            ours = mine[(op, size)]
            ratio = min(mpi) / ours
            ratios.append(ratio)
            cols = [fmt(peers[name].get((op, size))) for name in ("openmpi", "mpich")]
            flag = "  <" if ratio < 1 else ""
            print(f"{op:>15} {size:>10} {ours:>9.1f} {cols[0]:>9} {cols[1]:>9} "
                  f"{fmt(gloo.get((op, size))):>9} {ratio:>6.2f}{flag}")
    if ratios:
        gm = statistics.geometric_mean(ratios)
        slower = sum(r < 1 for r in ratios)
        print(f"# {len(ratios)} cells: geometric mean ratio {gm:.2f}; conflux slower in {slower}")


def fmt(t):
    return "-" if t is None else f"{t:.1f}"


if __name__ == "__main__":
    main()
