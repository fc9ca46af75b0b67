//! Where each step's time went, per rank: computing, or blocked in communication — waiting for
//! peers to arrive or moving data — and how much communication ran hidden behind compute.
//!
//! Step i spans [mark i, mark i+1); the last mark's step never closed and is left out. Within a
//! step, with every span clipped to it:
//! - B, blocked: the union of blocking ops' [issued, ended] and waits' [began, ended];
//! - W, waiting for peers: the union of every op's [started, started + wait_for_peers];
//! - F, in flight: the union of async ops' [started, ended].
//!
//! exposed = |B|, waiting = |B ∩ W|, transfer = exposed − waiting, overlapped = |F \ B|,
//! compute = step − exposed, comm share = exposed / step.

use conflux::trace::RankTrace;

use super::intervals::{max, median, Set};

/// The spans a rank's steps are measured from, over its whole trace.
#[derive(Debug, Clone, Default)]
pub struct RankSets {
    /// B.
    pub blocked: Set,
    /// B ∩ W: blocked, waiting for the last peer.
    pub waiting: Set,
    /// F \ B: communication in flight while the caller computed.
    pub overlapped: Set,
    /// Closed steps: (number, start, end).
    pub steps: Vec<(u64, i64, i64)>,
}

/// B, B ∩ W, F \ B and the closed steps of a rank, given its records' waits for peers.
pub fn rank_sets(r: &RankTrace, wait: &[i64]) -> RankSets {
    let mut blocked: Vec<(i64, i64)> = r.waits.iter().map(|w| (w.began, w.ended)).collect();
    let (mut peers, mut flight) = (Vec::new(), Vec::new());
    for (op, &w) in r.ops.iter().zip(wait) {
        if op.is_async {
            flight.push((op.started, op.ended));
        } else {
            blocked.push((op.issued, op.ended));
        }
        peers.push((op.started, op.started + w));
    }
    let blocked = Set::union(blocked);
    let waiting = blocked.intersect(&Set::union(peers));
    let overlapped = Set::union(flight).minus(&blocked);
    let steps = r.steps.windows(2).map(|m| (m[0].step, m[0].at, m[1].at)).filter(|s| s.2 > s.1).collect();
    RankSets { blocked, waiting, overlapped, steps }
}

/// One closed step of one rank, in ms (comm share as a fraction).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Step {
    pub step_ms: f64,
    pub compute_ms: f64,
    pub exposed_ms: f64,
    pub waiting_ms: f64,
    pub transfer_ms: f64,
    pub overlapped_ms: f64,
    pub comm_share: f64,
}

impl Step {
    pub fn of(sets: &RankSets, lo: i64, hi: i64) -> Step {
        let ms = |ns: i64| ns as f64 / 1e6;
        let span = hi - lo;
        let exposed = sets.blocked.clip(lo, hi).len();
        let waiting = sets.waiting.clip(lo, hi).len();
        Step {
            step_ms: ms(span),
            compute_ms: ms(span - exposed),
            exposed_ms: ms(exposed),
            waiting_ms: ms(waiting),
            transfer_ms: ms(exposed - waiting),
            overlapped_ms: ms(sets.overlapped.clip(lo, hi).len()),
            comm_share: if span > 0 { exposed as f64 / span as f64 } else { 0.0 },
        }
    }
}

/// Medians over some steps, and the worst step time and comm share.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepSummary {
    pub count: usize,
    /// Medians.
    pub median: Step,
    pub step_ms_worst: f64,
    pub comm_share_worst: f64,
}

impl StepSummary {
    pub fn of(steps: &[Step]) -> StepSummary {
        let m = |f: fn(&Step) -> f64| median(&steps.iter().map(f).collect::<Vec<_>>());
        StepSummary {
            count: steps.len(),
            median: Step {
                step_ms: m(|s| s.step_ms),
                compute_ms: m(|s| s.compute_ms),
                exposed_ms: m(|s| s.exposed_ms),
                waiting_ms: m(|s| s.waiting_ms),
                transfer_ms: m(|s| s.transfer_ms),
                overlapped_ms: m(|s| s.overlapped_ms),
                comm_share: m(|s| s.comm_share),
            },
            step_ms_worst: max(&steps.iter().map(|s| s.step_ms).collect::<Vec<_>>()),
            comm_share_worst: max(&steps.iter().map(|s| s.comm_share).collect::<Vec<_>>()),
        }
    }
}

/// Per rank (global rank, summary of its steps), and over every (rank, step) pair.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    pub per_rank: Vec<(usize, StepSummary)>,
    pub all: StepSummary,
}

pub fn steps(ranks: &[RankTrace], sets: &[RankSets]) -> Steps {
    let mut all = Vec::new();
    let mut per_rank = Vec::new();
    for (r, s) in ranks.iter().zip(sets) {
        let mine: Vec<Step> = s.steps.iter().map(|&(_, lo, hi)| Step::of(s, lo, hi)).collect();
        per_rank.push((r.meta.rank, StepSummary::of(&mine)));
        all.extend(mine);
    }
    Steps { per_rank, all: StepSummary::of(&all) }
}
