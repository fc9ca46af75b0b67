//! Measuring the links between nodes when a communicator that spans nodes is made, so that the
//! cost model prices TCP at what this job's network carries.
//!
//! Why bandwidth and not α: networks differ most in it (2 Gbit/s to 100 Gbit/s), and it
//! decides where the algorithms that send the whole message across at every step (recursive
//! doubling, trees) lose to the ones that send a share of it (ring, hier). α stays the model's
//! fitted per-step cost: a ping-pong's half round trip, which is all a few milliseconds could
//! measure, is 5 µs on the netns testbed where the fitted 40 µs chooses right (on that
//! testbed a file with α = 5.2 µs had 5 of 72 cells below 0.9 of the best, against none with 40).
//!
//! How: the first rank of each node (its leader) sends rounds of `ROUND` bytes to the next
//! node's leader while it receives rounds from the previous one, a ring of the nodes, as the
//! ring algorithm's steps load the links. A leader sends at least `MIN_ROUNDS`, goes on until
//! `BUDGET` has passed or it sent `MAX_ROUNDS`, and marks its last round in the round's first
//! byte, so its receiver knows when to stop without the leaders agreeing on a count first. The
//! rate is that of the second half of the rounds (each ends when its send and its receive are
//! both done, so it is the slower direction's, as a ring step's is): the first half pays the
//! connection's start and lets a shaper's burst allowance pass (tbf's bucket, which would
//! otherwise show a rate the link cannot keep). Every leader publishes its rate through the
//! store; every rank takes the slowest, so all ranks price TCP alike and choose alike.
//! About 20 ms at 2 Gbit/s (5 MiB each way, measured 0.235-0.239 GB/s of tbf's 0.25), 3 ms at
//! 25 Gbit/s (8 MiB); a slow link costs two rounds, 2 s at 2 Mbit/s, and those still hold a
//! fresh connection's slow start (at 50 Mbit/s: 0.0033-0.0059 GB/s of 0.00625).

use std::time::{Duration, Instant};

use crate::algo::select::Topo;
use crate::error::{Error, Result};
use crate::store::{StoreClient, StoreError};
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// Above every user tag (a u32) and without a collective's bit: no call's message can be taken
/// for a probe's, or a probe's for a call's.
const PROBE_TAG: u64 = 1 << 40;
const ROUND: usize = 256 << 10;
const MIN_ROUNDS: usize = 2;
const MAX_ROUNDS: usize = 32;
const BUDGET: Duration = Duration::from_millis(20);

/// The slowest node-to-node rate in GB/s, the same on every rank of the communicator; `rank`
/// is this rank's number in it, `world` the global rank of each. Only a job that spans nodes
/// calls it. A leader whose measurement fails publishes why, so that every rank fails with its
/// reason at once; a rank that leaves the job meanwhile fails the others by name.
pub(crate) fn tcp_gbps(
    t: &mut Transport,
    store: &StoreClient,
    prefix: &str,
    (topo, world): (&Topo, &[usize]),
    rank: usize,
    deadline: Instant,
) -> Result<f64> {
    let k = topo.nodes.len();
    let key = |i: usize| format!("{prefix}/tcp_gbps/{i}");
    if let Some(i) = topo.nodes.iter().position(|n| n.first() == Some(&rank)) {
        let (next, prev) = (topo.nodes[(i + 1) % k][0], topo.nodes[(i + k - 1) % k][0]);
        match ring_rate(t, next, prev, deadline) {
            Ok(gbps) => store.set(&key(i), gbps.to_string().as_bytes())?,
            Err(e) => {
                let culprit = e.peer().unwrap_or(world[next]);
                store.set(&key(i), format!("!{culprit} {e}").as_bytes())?;
                return Err(Error::Link { op: op(), source: e });
            }
        }
    }
    let started = Instant::now();
    let mut rates: Vec<Option<f64>> = vec![None; k];
    let leader = |i: usize| world[topo.nodes[i][0]];
    loop {
        // One wait for every key still missing; its timeout names the ones that still are.
        let missing: Vec<String> = (0..k).filter(|&i| rates[i].is_none()).map(key).collect();
        let refs: Vec<&str> = missing.iter().map(String::as_str).collect();
        let absent = match store.wait(&refs, POLL) {
            Ok(()) => Vec::new(),
            Err(StoreError::Timeout { keys, .. }) => keys,
            Err(e) => return Err(e.into()),
        };
        let arrived: Vec<usize> = (0..k).filter(|&i| rates[i].is_none() && !absent.contains(&key(i))).collect();
        for i in arrived {
            let v = store.get(&key(i), POLL)?;
            rates[i] = Some(parse_rate(&String::from_utf8_lossy(&v), leader(i))?);
        }
        if rates.iter().all(Option::is_some) {
            return Ok(rates.into_iter().flatten().fold(f64::INFINITY, f64::min));
        }
        let gone = store.gone()?;
        if let Some(&peer) = gone.iter().find(|r| world.contains(r)) {
            // A leader that failed published why before it left: look once more, so that every
            // rank reports its reason rather than its leaving.
            for i in (0..k).filter(|&i| rates[i].is_none()) {
                if let Ok(v) = store.get(&key(i), Duration::from_millis(1)) {
                    parse_rate(&String::from_utf8_lossy(&v), leader(i))?;
                }
            }
            let detail = "it left the job while TCP between the nodes was measured".to_string();
            return Err(Error::Link { op: op(), source: LinkError::PeerGone { peer, detail } });
        }
        if Instant::now() >= deadline {
            let peers = (0..k).filter(|&i| rates[i].is_none()).map(leader).collect();
            let secs = started.elapsed().as_secs_f64();
            return Err(Error::Link { op: op(), source: LinkError::Timeout { peers, secs } });
        }
    }
}

/// How long one look at the leaders' keys waits before it looks whether a rank left.
const POLL: Duration = Duration::from_millis(50);

fn op() -> String {
    "measuring TCP between the nodes".into()
}

/// A leader's published rate, or the failure it published (`!culprit reason`).
fn parse_rate(text: &str, leader: usize) -> Result<f64> {
    if let Some(failed) = text.strip_prefix('!') {
        let (culprit, reason) = failed.split_once(' ').unwrap_or(("", failed));
        let culprit = culprit.parse().unwrap_or(leader);
        let source = LinkError::Remote { culprit, reporter: leader, reason: reason.to_string() };
        return Err(Error::Link { op: op(), source });
    }
    text.parse()
        .ok()
        .filter(|g: &f64| g.is_finite() && *g > 0.0)
        .ok_or_else(|| Error::Config(format!("rank {leader}'s measured TCP rate {text:?} is not a rate")))
}

/// GB/s of the second half of the rounds, sending to `next` while receiving from `prev`. A
/// round ends when both its send and its receive are done, so this is the slower direction's
/// rate, as a ring step's is.
fn ring_rate(t: &mut Transport, next: usize, prev: usize, deadline: Instant) -> std::result::Result<f64, LinkError> {
    let start = Instant::now();
    let mut data = vec![0u8; ROUND];
    let mut buf = vec![0u8; ROUND];
    let (mut sent, mut sent_last, mut recv_last) = (0, false, false);
    let mut arrived = Vec::with_capacity(MAX_ROUNDS);
    while !(sent_last && recv_last) {
        let mut xfers = Vec::with_capacity(2);
        if !sent_last {
            sent += 1;
            sent_last = sent >= MAX_ROUNDS || (sent >= MIN_ROUNDS && start.elapsed() >= BUDGET);
            data[0] = u8::from(sent_last);
            xfers.push(Xfer::Send { peer: next, tag: PROBE_TAG, data: &data });
        }
        if !recv_last {
            xfers.push(Xfer::Recv { peer: prev, tag: PROBE_TAG, sink: Sink::Copy(&mut buf) });
        }
        t.exchange(&mut xfers, deadline)?;
        drop(xfers);
        if !recv_last {
            arrived.push(Instant::now());
            recv_last = buf[0] != 0;
        }
    }
    Ok(second_half_gbps(&arrived))
}

/// The rate of the rounds that arrived at `arrived` (one instant per round of `ROUND` bytes)
/// after the first half of them; at least one round is timed.
fn second_half_gbps(arrived: &[Instant]) -> f64 {
    let from = (arrived.len() / 2).clamp(1, arrived.len().saturating_sub(1).max(1)) - 1;
    let (Some(first), Some(last)) = (arrived.get(from), arrived.last()) else { return f64::NAN };
    let rounds = arrived.len() - 1 - from;
    let secs = last.duration_since(*first).as_secs_f64().max(1e-9);
    (rounds * ROUND) as f64 / secs * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaders_failure_reaches_every_rank_with_its_culprit() {
        assert_eq!(parse_rate("0.25", 2).unwrap(), 0.25);
        let e = parse_rate("!5 peer rank 5 is gone: reset", 2).unwrap_err();
        assert_eq!(e.peer(), Some(5), "{e}");
        assert!(e.to_string().contains("reported by rank 2") && e.to_string().contains("reset"), "{e}");
        for bad in ["", "nan", "-1", "0", "inf"] {
            assert!(matches!(parse_rate(bad, 2), Err(Error::Config(_))), "{bad:?}");
        }
    }

    #[test]
    fn the_rate_counts_the_second_half_of_the_rounds() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two rounds: the second is timed from the first's arrival.
        let g = second_half_gbps(&[at(100), at(101)]);
        assert!((g - ROUND as f64 * 1e-6).abs() < 1e-9, "{g}");
        // A fast first half (a shaper's burst) is left out: rounds 2..4 take 1 ms each.
        let g = second_half_gbps(&[at(0), at(0), at(1), at(2), at(3)]);
        assert!((g - ROUND as f64 * 1e-6).abs() < 1e-9, "{g}");
    }
}
