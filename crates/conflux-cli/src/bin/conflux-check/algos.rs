//! `conflux-check algos`: every algorithm forced on every collective it implements, at counts
//! that do and do not divide by the world size, against the independent reference. A forced
//! algorithm that cannot serve a call must say so with InvalidArgument, for a reason the
//! selection documents, never fail differently or compute a wrong answer.

use conflux::{Algo, Communicator, Error, ReduceOp};

use super::Checker;

/// `must`: algorithms that must serve some calls besides the ones that serve any topology
/// (direct needs one host, hier several nodes).
pub(crate) fn scenario_algos(comm: Communicator, quick: bool, must: &[Algo]) -> Checker {
    let n = comm.size();
    let mut total = Checker { comm: comm.with_algo(None), passed: 0, failed: Vec::new() };
    let mut counts = vec![0, 1, 7, 3 * n + 1, 1000];
    if !quick {
        // Several chunks of every pipeline (tree 64 KiB, chain 256 KiB) and of the direct slots.
        counts.push(70_001);
    }
    for algo in Algo::ALL {
        let mut c = Checker { comm: comm.with_algo(Some(algo)), passed: 0, failed: Vec::new() };
        for &count in &counts {
            c.collectives::<f32>(ReduceOp::Sum, count);
            c.movement::<f32>(count);
            if count < 10_000 {
                c.collectives::<f32>(ReduceOp::Max, count);
                c.collectives::<half::bf16>(ReduceOp::Sum, count);
                c.collectives::<i32>(ReduceOp::Avg, count);
                c.movement::<u8>(count);
            }
        }
        if algo == Algo::Direct && must.contains(&Algo::Direct) {
            many_small(&mut c);
        }
        if algo == Algo::Hier && must.contains(&Algo::Hier) {
            // More than one of hier's pipelined segments (4 MiB each), with an odd count.
            c.collectives::<f32>(ReduceOp::Sum, 2_100_001);
        }
        // What the algorithm cannot serve it must refuse for a documented reason; the rest it
        // must get right.
        let mut refused = 0;
        for f in c.failed.drain(..) {
            let reasons = ["does not implement", "needs", "does not take"];
            if f.contains("cannot serve") && reasons.iter().any(|r| f.contains(r)) {
                refused += 1;
            } else {
                total.failed.push(format!("{algo}: {f}"));
            }
        }
        if c.comm.rank() == 0 {
            println!("algos: {algo}: {} checks right, {refused} calls refused", c.passed);
        }
        if c.passed == 0 && (must.contains(&algo) || !matches!(algo, Algo::Direct | Algo::Hier)) {
            total.failed.push(format!("{algo} served nothing"));
        }
        total.passed += c.passed;
    }
    // A refusal comes before the call takes a sequence number: the ranks are still in step.
    let mut x = [1i64];
    let r = total.comm.all_reduce(&mut x, ReduceOp::Sum);
    total.ok("all_reduce after the refusals", r);
    total.expect("all_reduce after the refusals", conflux_cli::verify::first_wrong(&x, |_| n as f64));
    match comm.with_algo(Some(Algo::Rd)).broadcast(&mut [0u8; 4], 0) {
        Err(Error::InvalidArgument(m)) if m.contains("rd") && m.contains("broadcast") => total.passed += 1,
        other => total.failed.push(format!("broadcast forced to rd gave {other:?}")),
    }
    total
}

/// Back-to-back small all_reduces of changing lengths, each checked: the direct algorithm
/// places small chunks at a rotating position in its slots (algo/direct/mod.rs, Placement) when
/// the host has a core per rank; the 200 slot calls move through the slot (16 to 107 positions
/// in the default 256 KiB), among chunks of the other lengths, inline ones included. A wrong
/// result is recorded and the calls go on, so that every rank stays in step.
fn many_small(c: &mut Checker) {
    let (n, rank) = (c.comm.size(), c.comm.rank());
    let mut wrong = None;
    for call in 0..300 {
        // Every third call is inline, of each length from 0 to 90 elements in turn (0-360
        // bytes: every line count of an inline block, and past it), two slot calls between,
        // so both parities' lines are reused by calls of other lengths (algo/direct).
        let count = if call % 3 == 2 { call / 3 * 11 % 91 } else { [600, 1000, 2600, 4001][call % 4] };
        let mut x: Vec<f32> = (0..count).map(|i| ((rank * 7 + i + call) % 64) as f32).collect();
        if !c.ok("direct, many small calls", c.comm.all_reduce(&mut x, ReduceOp::Sum)) {
            return;
        }
        let want = |i: usize| (0..n).map(|r| ((r * 7 + i + call) % 64) as f64).sum();
        if let (None, Some((i, got, want))) = (&wrong, conflux_cli::verify::first_wrong(&x, want)) {
            wrong =
                Some(format!("direct, small call {call} of {count} elements: element {i} is {got}, expected {want}"));
        }
    }
    match wrong {
        Some(w) => c.failed.push(w),
        None => c.passed += 1,
    }
}
