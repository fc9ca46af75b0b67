//! Whether the ranks a waiter waits for are still there: local peers' processes (pidfds),
//! goodbyes and deaths the store reports, and failures other ranks report; and, when this
//! rank fails, telling the others and naming the root cause (`explain.rs`).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::event::{poll, PollFd, PollFlags};

use super::explain::Clue;
use super::LEFT;
use crate::store::{Event, Monitor};
use crate::transport::LinkError;

/// When a waiter should look at liveness again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextLook {
    /// After a whole slice, as usual.
    Later,
    /// Soon: a peer was seen gone once, and counts as failed if it still is at the next look.
    Soon,
}

/// What a rank knows of its peers' liveness.
pub(crate) struct Liveness {
    /// (rank, pidfd) of every other local rank: readable once that process has exited.
    pub pidfds: Vec<(usize, OwnedFd)>,
    /// This communicator's own channel to the store (see `store`).
    pub monitor: Option<Monitor>,
    /// The global rank of each rank of this communicator: the store speaks global ranks, and
    /// errors name them.
    pub world: Arc<[usize]>,
    /// This rank's global rank.
    pub me: usize,
    /// This communicator's ranks that share this rank's segment.
    pub on_host: Vec<usize>,
    /// Global ranks whose failures are not this communicator's: the ones a shrink left out,
    /// which the store's history still reports.
    pub ignored: Vec<usize>,
    /// The communicator's name in the store (its prefix): an abort fails only the communicator
    /// it was made on (`abort_reason`), whatever else its rank belongs to.
    pub scope: Arc<str>,
    /// Awaited peers whose exit was seen once; seen again while still awaited, they failed.
    pub(super) exited_seen: Vec<usize>,
    /// Peers (this communicator's ranks) whose process said goodbye, and whether one was
    /// already seen awaited once: like an exit, it counts at the second look.
    pub(super) left: Vec<(usize, bool)>,
    /// What the store said about this communicator's ranks so far, for `explain`.
    pub(super) clues: Vec<Clue>,
    /// The last error came from the store, which names root causes itself: nothing to explain.
    pub(super) from_store: bool,
}

/// What a rank that aborts communicator `scope` tells the others (through the store, whose
/// failure events reach every communicator of that rank; only `scope`'s act on it).
pub(crate) fn abort_reason(rank: usize, scope: &str) -> String {
    format!("aborted by rank {rank} (communicator {scope})")
}

/// The communicator an abort's report names, or None for another failure.
fn aborted_in(reason: &str) -> Option<&str> {
    let rest = reason.strip_prefix("aborted by rank ")?;
    rest.split_once(" (communicator ")?.1.strip_suffix(')')
}

impl Liveness {
    /// Fails if an awaited local peer's process has exited or said goodbye, or the store
    /// reported a failure; says when to look again.
    ///
    /// A peer that exits after sending its last message is not a failure, and its last bytes
    /// may land just before its exit is seen; so an exit counts only when the peer is still
    /// awaited at the next look, after another progress pass.
    pub fn check(&mut self, awaited: &[usize]) -> Result<NextLook, LinkError> {
        let mut next = NextLook::Later;
        if !self.pidfds.is_empty() {
            let mut fds: Vec<PollFd<'_>> = self.pidfds.iter().map(|(_, fd)| PollFd::new(fd, PollFlags::IN)).collect();
            let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
            if poll(&mut fds, Some(&zero)).unwrap_or(0) > 0 {
                let exited: Vec<usize> =
                    fds.iter().zip(&self.pidfds).filter(|(f, _)| !f.revents().is_empty()).map(|(_, p)| p.0).collect();
                drop(fds);
                for peer in exited {
                    if !awaited.contains(&peer) {
                        continue;
                    }
                    if self.exited_seen.contains(&peer) {
                        return Err(LinkError::PeerGone { peer, detail: "its process exited".into() });
                    }
                    self.exited_seen.push(peer);
                    next = NextLook::Soon;
                }
            }
        }
        // A peer outside the segment is reached over TCP: its goodbye travels through the
        // store and can overtake its last bytes (retransmitted on a lossy link), so only the
        // end of its stream, which a leaving rank sends before its goodbye, fails a wait.
        let on_segment = |p: &usize| self.on_host.contains(p);
        let by_goodbye = |p: &usize| awaited.contains(p) && on_segment(p);
        for (peer, seen) in self.left.iter_mut().filter(|(p, _)| by_goodbye(p)) {
            if *seen {
                let detail = LEFT.into();
                // The store said so: the root cause, nothing for `explain` to look for (others
                // that waited for it too may be failing and exiting by now).
                self.from_store = true;
                return Err(LinkError::PeerGone { peer: *peer, detail });
            }
            *seen = true;
            next = NextLook::Soon;
        }
        let Some(m) = &mut self.monitor else { return Ok(next) };
        while let Some(ev) = m.try_event() {
            let member = |r: usize| self.world.iter().position(|&w| w == r);
            let err = match ev {
                // Errors made here are in this communicator's ranks, like the transport's own;
                // `Transport::fail` renames them.
                // A rank that left while awaited came first: others may die of waiting for it,
                // and the store itself dies with rank 0.
                Event::RankDied { .. } | Event::StoreLost if self.left.iter().any(|(p, _)| awaited.contains(p)) => {
                    let peer = self.left.iter().find(|(p, _)| awaited.contains(p)).expect("checked").0;
                    let detail = LEFT.into();
                    LinkError::PeerGone { peer, detail }
                }
                Event::RankDied { rank } => match member(rank) {
                    Some(peer) => {
                        self.clues.push(Clue::Died(rank));
                        // Not `from_store`: it may have died of another rank's failure, which
                        // its report (on another connection) will name; `explain` listens.
                        return Err(LinkError::PeerGone {
                            peer,
                            detail:
                                "its connection to the job's store closed (the process died or its host is unreachable)"
                                    .into(),
                        });
                    }
                    // A rank outside this group died: whoever here needed it will report.
                    None => continue,
                },
                Event::Failure { culprit, reporter, reason } => {
                    let outside = member(culprit).is_none() && member(reporter).is_none();
                    // A rank that timed out waiting for this one blames it; but this rank is
                    // waiting too, and its own timeout, soon, will say for whom.
                    let waited_for = culprit == self.me && reason.starts_with("timed out");
                    let elsewhere = aborted_in(&reason).is_some_and(|scope| scope != &*self.scope);
                    if outside || waited_for || elsewhere || self.ignored.contains(&culprit) {
                        continue;
                    }
                    LinkError::Remote { culprit, reporter, reason }
                }
                Event::RankLeft { rank } => {
                    if let Some(peer) = member(rank) {
                        self.left.push((peer, false));
                        self.clues.push(Clue::Left(rank));
                    }
                    continue;
                }
                Event::StoreLost => LinkError::StoreLost,
            };
            self.from_store = true;
            return Err(err);
        }
        Ok(next)
    }

    /// Tells every other rank, through the store, that this rank fails because of `culprit`
    /// (`err` is in global ranks).
    pub fn report(&mut self, err: &LinkError) {
        let Some(m) = &mut self.monitor else { return };
        match err {
            LinkError::Remote { .. } | LinkError::Aborted | LinkError::StoreLost => {}
            e => {
                if let Some(culprit) = e.peer() {
                    m.report_failure(culprit, &e.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{abort_reason, aborted_in};

    #[test]
    fn an_abort_names_its_communicator() {
        assert_eq!(aborted_in(&abort_reason(3, "conflux/shrink0/c")), Some("conflux/shrink0/c"));
        assert_eq!(aborted_in("timed out after 1.0s waiting for rank(s) [2]"), None);
        assert_eq!(aborted_in("aborted by rank 3"), None);
    }
}
