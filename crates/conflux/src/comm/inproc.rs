//! N ranks of one communicator inside one test process, as Gloo's tests spawn ranks: a thread
//! per rank, each with a lane of its own (transport, call context, planner) whose links are
//! the shared-memory rings of one segment that all of them map. Calls go through `ops::run`,
//! the path every collective takes, so a test exercises the table, the forms, the fingerprints
//! and the algorithm itself, in seconds, with no store and no processes. The multi-process
//! tests (crates/conflux-cli/tests) still test the real bootstrap, TCP and liveness.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use super::lane::LaneState;
use super::ops::Plan;
use super::planner::Planner;
use super::recorder::Recorder;
use crate::algo::select::{Model, Topo};
use crate::algo::Algo;
use crate::config::AlgoSpec;
use crate::transport::wait::{OnHost, Waiter, Watch};
use crate::transport::{Layout, Link, Segment, Streaming, Transport};

/// Small rings and slots, so that modest messages wrap the rings and take several chunks.
const RING: usize = 8 << 10;
const CHUNK: usize = 8 << 10;

/// One rank's lane over `seg`, with `topo` as its planner's view of where the ranks are.
fn lane(n: usize, rank: usize, seg: &Arc<Segment>, topo: &Topo) -> LaneState {
    // Ranks that are threads of this process read each other's memory as peers' processes do.
    let pid = Some(std::process::id());
    let links = (0..n).map(|p| (p != rank).then(|| Link::shm(seg, rank, p, pid, Streaming::Auto))).collect();
    let world: Arc<[usize]> = (0..n).collect();
    let abort = Arc::new(AtomicBool::new(false));
    let spin = Duration::from_micros(20);
    let host = Some(OnHost { seg: seg.clone(), me_local: rank, ranks: (0..n).collect() });
    let watch = Watch { host, pidfds: Vec::new(), monitor: None, world, rank, abort, spin, yield_while_spinning: true };
    let waiter = Waiter::new(watch).expect("an eventfd for the waiter");
    let recorder = Arc::new(Recorder::new(rank, format!("in-process rank {rank}"), "inproc", None));
    LaneState::new(Transport::new(rank, n, links, waiter), Planner::new(topo.clone(), Model::default()), recorder)
}

/// Runs `body(lane, plan)` on `n` ranks at once, one thread each, and returns their results by
/// rank. Every call the bodies make must be made by all of them in the same order, as in a job.
pub(crate) fn with_ranks<R: Send>(
    n: usize,
    topo: &Topo,
    algo: Option<Algo>,
    body: impl Fn(&mut LaneState, &Plan) -> R + Sync,
) -> Vec<R> {
    let seg = Arc::new(Segment::create(Layout::new(n, RING, CHUNK)).expect("a memfd segment"));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (seg, body) = (&seg, &body);
                scope.spawn(move || {
                    let mut st = lane(n, rank, seg, topo);
                    let timeout = Duration::from_secs(10);
                    let plan = Plan {
                        rank,
                        size: n,
                        timeout,
                        algo: AlgoSpec::default(),
                        call_algo: algo,
                        deterministic: false,
                        issue: None,
                    };
                    body(&mut st, &plan)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank's thread panicked")).collect()
    })
}

/// Where `n` ranks are for the harness: one host, with the ranks split into equal nodes when
/// `n` has a divisor (so that hier, which needs two or more nodes alike, can run too), and
/// odd sizes oversubscribed (the direct rounds then place their chunks differently).
pub(crate) fn topo_of(n: usize) -> Topo {
    let per = (2..n).find(|&d| n.is_multiple_of(d)).map_or(n, |d| n / d);
    let nodes = (0..n).collect::<Vec<_>>().chunks(per).map(<[usize]>::to_vec).collect();
    let load = if n % 2 == 1 { 4.0 } else { 1.0 };
    Topo { nodes, load, ..Topo::single(n, true) }
}

#[cfg(test)]
mod tests;
