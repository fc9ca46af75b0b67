//! Timing one operation at one size under several algorithms, fairly.
//!
//! On an oversubscribed host (4+ ranks on 2 cores) the time of one algorithm drifts by 20-30%
//! from one run to the next, more than the margins between algorithms, as the scheduler
//! settles the ranks one way or another. So the algorithms take turns in short batches,
//! round after round (each round in its own shuffled order), and each keeps the median of its
//! batches: drift then reaches every algorithm alike, and auto is timed beside the forced
//! algorithm it chose as closely as two runs of one algorithm can be.
//!
//! The order changes because what ran before a batch shows in its time, even after the
//! untimed call: over netns TCP, auto's reduce ran 17% slower than the forced tree it chose
//! when a fixed rotation always put it after the chain, and auto's all_reduce 16% faster than
//! the forced hier when it always followed hier.
//!
//! Two runs of one algorithm at 4-8 ranks on 2 cores, or over netns TCP at small sizes, are
//! 20-40% apart batch to batch, so `--rounds` rounds can leave auto's ratio to the best forced
//! algorithm undecided: its 95% interval holds the 0.90 that `--report-auto` asks for. Such a
//! size runs another `--rounds` rounds, and again, up to `--max-rounds`. The rule stops as
//! readily on an interval wholly below 0.90 as on one wholly above, so it favours neither
//! verdict; but each look is a chance to stop on a chance excursion, so with the default four
//! looks a decided verdict is wrong somewhat more often than a single 95% interval's 5%.
//!
//! Every batch is preceded by one untimed call, since the first call after a switch pays for
//! the previous algorithm's cache footprint, and by a barrier; its time is the slowest rank's.
//! With `--latency` the calls of a batch are timed one by one with an untimed barrier between
//! them (OSU's way), so that no call overlaps the next.
//! With `--check`, each algorithm's result is checked last, in a buffer cleared first, so an
//! algorithm that wrote nothing cannot pass on another's result.

use std::time::Instant;

use conflux::{Algo, Communicator, OpKind, ReduceOp};

use super::stats::{best_of, median, paired, TARGET};
use super::{BenchArgs, Row};
use crate::verify::{self, Num};

/// One operation at one size: the buffers every algorithm measured shares.
struct Case<'a, T: Num> {
    op: &'static str,
    count: usize,
    block: usize,
    redop: ReduceOp,
    root: usize,
    rank: usize,
    size: usize,
    send: Vec<T>,
    recv: Vec<T>,
    args: &'a BenchArgs,
}

impl<'a, T: Num> Case<'a, T> {
    fn new(comm: &Communicator, op: &'static str, bytes: usize, redop: ReduceOp, args: &'a BenchArgs) -> Self {
        let (n, r) = (comm.size(), comm.rank());
        // Sizes follow nccl-tests: all_gather's is the total output, reduce_scatter's the total
        // input, all_to_all's the whole send buffer of one rank.
        let count = match op {
            "all_gather" | "reduce_scatter" | "all_to_all" => bytes / T::DTYPE.size() / n * n,
            _ => bytes / T::DTYPE.size(),
        };
        let block = count / n;
        let send_len = match op {
            "all_gather" => block,
            "broadcast" => 0,
            _ => count,
        };
        let mut send = vec![T::zeroed(); send_len];
        verify::fill(&mut send, redop, r, 0);
        let mut case =
            Case { op, count, block, redop, root: args.root, rank: r, size: n, send, recv: Vec::new(), args };
        case.clear();
        case
    }

    /// The output as before any call: zeros, but the broadcast root's data and an in-place
    /// all_reduce's input.
    fn clear(&mut self) {
        let len = if self.op == "reduce_scatter" { self.block } else { self.count };
        self.recv.clear();
        self.recv.resize(len, T::zeroed());
        let holds_input = match self.op {
            "broadcast" => self.rank == self.root,
            "all_reduce" => self.args.inplace,
            _ => false,
        };
        if holds_input {
            verify::fill(&mut self.recv, self.redop, self.rank, 0);
        }
    }

    fn once(&mut self, h: &Communicator) -> conflux::Result<()> {
        if self.op == "sendrecv" {
            return self.sendrecv(h);
        }
        let (send, recv, redop, root) = (&self.send, &mut self.recv, self.redop, self.root);
        match self.op {
            "all_reduce" if self.args.inplace => h.all_reduce(recv, redop),
            "all_reduce" => h.all_reduce_into(send, recv, redop),
            "all_gather" => h.all_gather(send, recv),
            "reduce_scatter" => h.reduce_scatter(send, recv, redop),
            "broadcast" => h.broadcast(recv, root),
            "all_to_all" => h.all_to_all(send, recv),
            "reduce" => h.reduce_into(send, recv, redop, root),
            _ => unreachable!("checked in main"),
        }
    }

    /// Every rank sends to the next and receives from the one before, as a pipeline stage
    /// does: the send posted (torch's isend) and handed back by its Work, so that no copy of the
    /// buffer is timed, the receive blocking.
    fn sendrecv(&mut self, h: &Communicator) -> conflux::Result<()> {
        let n = self.size;
        if n == 1 {
            self.recv.copy_from_slice(&self.send);
            return Ok(());
        }
        let w = h.send_async(std::mem::take(&mut self.send), (self.rank + 1) % n, 0);
        let received = h.recv(&mut self.recv, (self.rank + n - 1) % n, 0);
        self.send = w.wait()?;
        received
    }

    /// Wrong elements of this rank's output, against `verify`'s exact expectations.
    fn wrong(&self) -> usize {
        let (d, redop, n, r, root) = (T::DTYPE, self.redop, self.size, self.rank, self.root);
        let (block, b) = (self.block, self.block.max(1));
        let recv = &self.recv;
        match self.op {
            "all_reduce" => verify::count_wrong(recv, |i| verify::reduced(d, redop, n, i)),
            "reduce" if r == root => verify::count_wrong(recv, |i| verify::reduced(d, redop, n, i)),
            "reduce" => 0,
            "reduce_scatter" => verify::count_wrong(recv, |i| verify::reduced(d, redop, n, r * block + i)),
            "all_gather" => verify::count_wrong(recv, |i| verify::input(d, redop, i / b, i % b)),
            "broadcast" => verify::count_wrong(recv, |i| verify::input(d, redop, root, i)),
            "all_to_all" => verify::count_wrong(recv, |i| verify::input(d, redop, i / b, r * block + i % b)),
            "sendrecv" => verify::count_wrong(recv, |i| verify::input(d, redop, (r + n - 1) % n, i)),
            _ => 0,
        }
    }

    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(&self) -> f64 {
        let n = self.size as f64;
        match self.op {
            "all_reduce" => 2.0 * (n - 1.0) / n,
            "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

/// Measures `op` at `bytes` under each algorithm of `list` (None: auto), and returns one row
/// each. An algorithm that refuses the call (forced where it cannot serve; every rank
/// refuses alike) is removed from `list` and announced through `skipped`.
pub fn measure<T: Num>(
    comm: &Communicator,
    list: &mut Vec<Option<Algo>>,
    op: &'static str,
    bytes: usize,
    redop: ReduceOp,
    args: &BenchArgs,
    mut skipped: impl FnMut(&str),
) -> conflux::Result<Vec<Row>> {
    let mut case = Case::<T>::new(comm, op, bytes, redop, args);
    // Warm-up, which also finds out what each algorithm costs per call. Its first call is not
    // timed: it pays the buffers' first touch, is where a forced algorithm refuses, and on a
    // rank that arrives early it holds the wait for the others (rank 0 measures memcpy for the
    // header before the first size; timed, that made the first size's batch 20 calls where
    // --min-ms asked for 20,000, and its time per call twice the next size's). The ranks then
    // meet, so the timed calls start together.
    let mut per_call = Vec::with_capacity(list.len());
    let mut k = 0;
    while k < list.len() {
        let h = comm.with_algo(list[k]);
        match case.once(&h) {
            Ok(()) => {
                comm.barrier()?;
                let timed = args.warmup.max(2) - 1;
                let t = Instant::now();
                for _ in 0..timed {
                    case.once(&h)?;
                }
                per_call.push(t.elapsed().as_secs_f64() / timed as f64);
                k += 1;
            }
            Err(conflux::Error::InvalidArgument(why)) if list[k].is_some() => {
                skipped(&why);
                list.remove(k);
            }
            Err(e) => return Err(e),
        }
    }
    // Every rank runs the same number of calls, sized from the slowest rank's warm-up of the
    // fastest algorithm, and every algorithm the same number: a batch's time includes the
    // barrier's skew, which more calls amortise more.
    comm.all_reduce(&mut per_call, ReduceOp::Max)?;
    let rounds = args.rounds.unwrap_or(if args.report_auto { 15 } else { 1 }).max(1);
    let fastest = per_call.iter().copied().fold(f64::INFINITY, f64::min);
    let batch = calls_per_batch(args, bytes, fastest, rounds);

    let algos = list.len();
    if algos == 0 {
        // Nothing of `--algo` implements this operation, or every forced algorithm refused.
        return Ok(Vec::new());
    }
    let auto = list.iter().position(Option::is_none);
    // Extra rounds only serve the report, and only where auto has a forced algorithm to be
    // held against (`undecided` says no otherwise).
    let most = if args.report_auto { args.max_rounds.unwrap_or(4 * rounds).max(rounds) } else { rounds };
    // Microseconds per call, by algorithm and round.
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); algos];
    loop {
        let first = times[0].len();
        let block = rounds.min(most - first);
        let mut secs = vec![0.0f64; block * algos];
        for round in 0..block {
            for k in shuffled(algos, first + round) {
                let h = comm.with_algo(list[k]);
                if rounds > 1 {
                    case.once(&h)?;
                }
                comm.barrier()?;
                secs[round * algos + k] = if args.latency {
                    let mut alone = 0.0;
                    for _ in 0..batch {
                        let t = Instant::now();
                        case.once(&h)?;
                        alone += t.elapsed().as_secs_f64();
                        comm.barrier()?;
                    }
                    alone / batch as f64
                } else {
                    let t = Instant::now();
                    for _ in 0..batch {
                        case.once(&h)?;
                    }
                    t.elapsed().as_secs_f64() / batch as f64
                };
            }
        }
        comm.all_reduce(&mut secs, ReduceOp::Max)?;
        for (i, s) in secs.iter().enumerate() {
            times[i % algos].push(s * 1e6);
        }
        // Every rank holds the same times, so every rank decides alike.
        if times[0].len() >= most || auto.is_none_or(|a| !undecided(&times, a)) {
            break;
        }
    }
    let mut wrong = vec![0i64; algos];
    if args.check {
        for (k, w) in wrong.iter_mut().enumerate() {
            case.clear();
            case.once(&comm.with_algo(list[k]))?;
            *w = case.wrong() as i64;
        }
    }
    comm.all_reduce(&mut wrong, ReduceOp::Sum)?;

    let kind = OpKind::parse(op);
    let reduces = matches!(op, "all_reduce" | "reduce_scatter" | "reduce");
    let rows = (0..algos)
        .map(|k| {
            let h = comm.with_algo(list[k]);
            let samples = std::mem::take(&mut times[k]);
            let us = median(&samples);
            let algbw = bytes as f64 / us / 1e3;
            Row {
                op,
                forced: list[k],
                chosen: kind.and_then(|o| h.algo_for(o, bytes, T::DTYPE).ok()).filter(|_| comm.size() > 1),
                bytes,
                count: case.count,
                dtype: T::DTYPE,
                redop: reduces.then_some(redop),
                root: matches!(op, "broadcast" | "reduce").then_some(case.root),
                us,
                algbw,
                busbw: algbw * case.bus_factor(),
                wrong: wrong[k] as u64,
                samples,
            }
        })
        .collect();
    Ok(rows)
}

/// A permutation of 0..n, the same on every rank for the same round (Fisher-Yates driven by
/// SplitMix64 of the round number).
fn shuffled(n: usize, round: usize) -> Vec<usize> {
    let mut state = (round as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    order
}

/// Calls per timed batch: --iters in all (a quarter above 1 MiB, at least 5), or as many as
/// last --min-ms, spread over the rounds.
fn calls_per_batch(args: &BenchArgs, bytes: usize, per_call_s: f64, rounds: usize) -> usize {
    let mut total = if bytes > 1 << 20 { (args.iters / 4).max(5) } else { args.iters };
    // 20 calls of a 1 µs operation last 20 µs, the scale of one wake-up after the barrier
    // before the batch: timed so, a 4 KiB all_reduce at 2 ranks took 4.7-5.1 µs in 3 runs,
    // and 1.6 µs timed over 100 ms.
    // (Not with --latency alone: each of its calls pays a barrier besides.)
    let min_ms = args.min_ms.unwrap_or(if args.report_auto {
        30.0
    } else if args.latency {
        0.0
    } else {
        10.0
    });
    if min_ms > 0.0 {
        let want = (min_ms * 1e-3 / per_call_s.max(1e-9)).ceil() as usize;
        total = total.max(want.min(20_000 * rounds));
    }
    total.div_ceil(rounds).max(1)
}

/// Whether auto's time against the best forced algorithm's (lowest median) is still
/// undecided against the 0.90 that `--report-auto` holds it to: the 95% interval of their
/// round-by-round ratio holds 0.90.
fn undecided(times: &[Vec<f64>], auto: usize) -> bool {
    let forced: Vec<&[f64]> = (0..times.len()).filter(|&k| k != auto).map(|k| times[k].as_slice()).collect();
    best_of(&forced).is_some_and(|b| paired(forced[b], &times[auto]).holds(TARGET))
}

#[cfg(test)]
mod tests {
    use super::{shuffled, undecided};

    #[test]
    fn a_size_is_undecided_while_the_interval_of_auto_against_the_best_holds_090() {
        // Algorithm 0 is slow, 1 the best forced one, 2 auto. Nine rounds: the interval runs
        // from the second lowest to the second highest ratio of best over auto.
        let slow = vec![100.0; 9];
        let best = vec![10.0; 9];
        let auto = |ratios: [f64; 9]| ratios.iter().map(|r| 10.0 / r).collect::<Vec<f64>>();
        let straddles = auto([0.70, 0.85, 0.88, 0.9, 0.93, 0.95, 0.99, 1.0, 1.10]);
        assert!(undecided(&[slow.clone(), best.clone(), straddles.clone()], 2));
        // The best is the lowest median, wherever it stands in the list.
        assert!(undecided(&[best.clone(), slow.clone(), straddles], 2));
        // Decided either way: wholly above, or wholly below (one outlier each way allowed).
        let above = auto([0.5, 0.91, 0.95, 0.96, 1.0, 1.0, 1.05, 1.1, 1.3]);
        assert!(!undecided(&[slow.clone(), best.clone(), above], 2));
        let below = auto([0.5, 0.6, 0.7, 0.7, 0.75, 0.8, 0.85, 0.89, 1.3]);
        assert!(!undecided(&[slow.clone(), best.clone(), below], 2));
        // Nothing forced to hold auto against.
        assert!(!undecided(&[best], 0));
    }

    #[test]
    fn every_round_is_a_permutation_and_predecessors_vary() {
        let mut before_last = std::collections::BTreeSet::new();
        for round in 0..15 {
            let mut order = shuffled(6, round);
            let pos = order.iter().position(|&k| k == 5).unwrap();
            if pos > 0 {
                before_last.insert(order[pos - 1]);
            }
            order.sort();
            assert_eq!(order, (0..6).collect::<Vec<_>>());
        }
        assert!(before_last.len() >= 3, "algorithm 5 follows only {before_last:?}");
        assert_eq!(shuffled(0, 3), Vec::<usize>::new());
        assert_eq!(shuffled(1, 3), vec![0]);
    }
}
