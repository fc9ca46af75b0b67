//! Naming the root cause of a failure: when a rank loses a peer or times out, the peer is
//! often not the culprit but another victim. The store's events (see `store`) say more.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};

use super::liveness::Liveness;
use super::LEFT;
use crate::store::{Event, Monitor};
use crate::transport::LinkError;

/// How long a rank that lost a peer listens for the store to name the root cause.
const EXPLAIN_WAIT: Duration = Duration::from_millis(300);
/// Once the store has spoken of a failure, how long `explain` listens for the rest of it.
const STORE_GRACE: Duration = Duration::from_millis(100);
/// How long a rank that timed out listens for the ranks it waited for to report their own
/// timeouts: their deadlines fall later by however much later they entered the call, which
/// on a loaded host can be several hundred ms.
const CHASE_WAIT: Duration = Duration::from_secs(1);

impl Liveness {
    /// Traces a lost peer to the failure behind it. When rank A dies, its neighbour B fails,
    /// reports A to the store and exits; B's other neighbours then see B's link close first.
    /// So before blaming a vanished peer, listen briefly for the store naming someone else.
    ///
    /// `e` is in global ranks, as the store's events are. The evidence, strongest first: a
    /// failure report naming another rank, or the peer's own (it aborted); another rank's death; a rank that left the job
    /// (said goodbye) before the peer vanished. The server relays each connection's events in
    /// its own thread, so a death and the report or goodbye behind it can arrive in either
    /// order: once the store has said anything about the lost rank, the others get a short
    /// grace to follow.
    pub fn explain(&mut self, e: LinkError) -> LinkError {
        if std::mem::take(&mut self.from_store) {
            return e;
        }
        if let LinkError::Timeout { peers, .. } = &e {
            return self.chase_timeout(peers.clone()).unwrap_or(e);
        }
        let LinkError::PeerGone { peer, .. } = &e else {
            return e;
        };
        let peer = *peer;
        let Some(m) = &mut self.monitor else { return e };
        let world = self.world.clone();
        let member = |r: usize| world.iter().position(|&w| w == r);
        let clues = &mut self.clues;
        let mut end = Instant::now() + if clues.is_empty() { EXPLAIN_WAIT } else { STORE_GRACE };
        loop {
            while let Some(ev) = m.try_event() {
                match ev {
                    Event::Failure { culprit, reporter, reason } if culprit != peer || reporter == peer => {
                        return LinkError::Remote { culprit, reporter, reason };
                    }
                    Event::Failure { reporter, .. } => clues.push(Clue::Blamed(reporter)),
                    Event::StoreLost => {}
                    Event::RankLeft { rank } => {
                        if let Some(p) = member(rank) {
                            self.left.push((p, false));
                            clues.push(Clue::Left(rank));
                        }
                    }
                    Event::RankDied { rank } => {
                        if member(rank).is_some() {
                            clues.push(Clue::Died(rank));
                        }
                    }
                }
                end = end.min(Instant::now() + STORE_GRACE);
            }
            let now = Instant::now();
            if now >= end {
                return match blame(peer, clues) {
                    Some((culprit, detail)) => LinkError::PeerGone { peer: culprit, detail },
                    None => e,
                };
            }
            await_event(m, end - now);
        }
    }

    /// A rank that timed out waiting for `peers` (global ranks) may wait for ranks that wait
    /// themselves: in a ring or a tree only the stuck rank's neighbours wait for it. Those time
    /// out at about the same moment and report whom they waited for, so listen briefly and
    /// follow the reports from the awaited ranks to the rank nobody heard from.
    fn chase_timeout(&mut self, peers: Vec<usize>) -> Option<LinkError> {
        let m = self.monitor.as_mut()?;
        let end = Instant::now() + CHASE_WAIT;
        let mut waited_on = peers;
        let mut found = None;
        loop {
            while let Some(ev) = m.try_event() {
                if let Event::Failure { culprit, reporter, reason } = ev {
                    if waited_on.contains(&reporter) && culprit != reporter {
                        waited_on = vec![culprit];
                        found = Some(LinkError::Remote { culprit, reporter, reason });
                    }
                }
            }
            let now = Instant::now();
            if now >= end {
                return found;
            }
            await_event(m, end - now);
        }
    }
}

/// Waits up to `wait` for the store to say something.
fn await_event(m: &Monitor, wait: Duration) {
    let mut fds = [PollFd::from_borrowed_fd(m.as_fd(), PollFlags::IN)];
    let ts = rustix::time::Timespec::try_from(wait).unwrap_or(rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 });
    let _ = poll(&mut fds, Some(&ts));
}

/// What the store said about the ranks of a communicator, in global ranks, in its order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Clue {
    /// The rank said goodbye: it left the job.
    Left(usize),
    /// The rank's line closed without a goodbye.
    Died(usize),
    /// The rank reported that it fails because of the lost peer.
    Blamed(usize),
}

/// Who is to blame for losing `peer`, from what the store said (`None`: the peer itself, as
/// the transport saw it). The first rank that left or died is the root cause, unless its
/// failure is explained: it reported the lost peer, or it is the peer and died (a peer that
/// died is its own failure, even after a goodbye elsewhere, which may be a rank that simply
/// finished its part).
fn blame(peer: usize, clues: &[Clue]) -> Option<(usize, String)> {
    let explained = |r: usize| clues.contains(&Clue::Blamed(r));
    let peer_died = clues.contains(&Clue::Died(peer));
    for c in clues {
        match *c {
            Clue::Left(r) if r == peer => return Some((peer, LEFT.into())),
            Clue::Left(r) if !peer_died && !explained(r) => {
                let detail =
                    format!("it left the job while the others still needed it (and rank {peer} failed after it)");
                return Some((r, detail));
            }
            Clue::Died(r) if r == peer => return None,
            Clue::Died(r) if !explained(r) => {
                return Some((r, format!("it died (and rank {peer} failed after it)")));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{blame, Clue::*};

    #[test]
    fn the_first_unexplained_departure_is_blamed() {
        // The peer left; rank 2 died of it and said so: the peer, whichever came first.
        assert_eq!(blame(1, &[Left(1), Died(2), Blamed(2)]).map(|b| b.0), Some(1));
        // The peer left cleanly after another rank left: the first leaver.
        assert_eq!(blame(1, &[Left(0), Left(1)]).map(|b| b.0), Some(0));
        assert_eq!(blame(1, &[Left(1)]).map(|b| b.0), Some(1));
        // A third rank died first, unexplained: it is the root cause.
        assert_eq!(blame(1, &[Died(2), Died(1)]).map(|b| b.0), Some(2));
        // The dying rank reported the peer: the peer, which left.
        assert_eq!(blame(1, &[Died(2), Blamed(2), Left(1)]).map(|b| b.0), Some(1));
    }

    #[test]
    fn a_peer_that_died_unexplained_is_its_own_failure() {
        assert_eq!(blame(1, &[Died(1)]), None);
        // Even after another rank's goodbye, which may be a rank that finished its part.
        assert_eq!(blame(1, &[Left(0), Died(1)]), None);
        assert_eq!(blame(1, &[]), None);
    }
}
