//! `shrink`: after a failure, the survivors make a communicator of themselves and go on, as
//! ULFM's MPI_Comm_shrink and ncclCommShrink do, without restarting the job.
//!
//! Who survives is decided through the store, which knows which ranks' processes are gone
//! (died, or left with a goodbye). Each caller checks in under the communicator's prefix and
//! the shrink's number, then waits until every rank of the old communicator has either checked
//! in or is gone: from then on every caller sees the same members, whatever it knew of the
//! failure when it called. Members keep their order and are renumbered from 0. A rank that
//! dies while the others shrink can leave them with different views; their new communicator
//! then fails to form within the deadline, and they can shrink again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Communicator;
use crate::config::Options;
use crate::error::{Error, Result};
use crate::store::StoreError;

/// How often a shrinking rank looks at the store again.
const POLL: Duration = Duration::from_millis(10);

impl Communicator {
    /// A communicator of the ranks of this one whose processes are still in the job, in the
    /// same order, renumbered. Every surviving rank must call it (after this communicator
    /// failed, or at any time: with nobody gone it is a copy). Fails if the survivors do not
    /// all call within the timeout.
    pub fn shrink(&self) -> Result<Communicator> {
        self.shrink_without(&[])
    }

    /// `shrink` that also leaves out `excluded` (ranks of this communicator), alive or not, as
    /// torch's `shrink_group` and ncclCommShrink do: the excluded ranks do not call, every
    /// other surviving rank does, with the same list (checked: a caller with another list
    /// fails the shrink on every rank that sees it). Shrinks are numbered per rank, so a rank
    /// left out of one cannot join a later shrink of this same communicator (its number is
    /// behind): the others go on with the communicator they made, as torch does.
    pub fn shrink_without(&self, excluded: &[usize]) -> Result<Communicator> {
        let mut excluded = excluded.to_vec();
        excluded.sort_unstable();
        excluded.dedup();
        if let Some(&r) = excluded.iter().find(|&&r| r >= self.size()) {
            return Err(Error::InvalidArgument(format!(
                "shrink: rank {r} is not in a communicator of {}",
                self.size()
            )));
        }
        if excluded.contains(&self.rank()) {
            return Err(Error::InvalidArgument(format!(
                "shrink: this rank ({}) is among the ranks to exclude; excluded ranks must not call it",
                self.rank()
            )));
        }
        let n = self.core.shrinks.fetch_add(1, Ordering::SeqCst);
        let base = format!("{}/shrink{n}", self.core.prefix);
        let world = &self.core.world;
        let Some((store, _)) = &self.core.session.store else {
            return self.child(format!("{base}/c"), &[0], 0, &Options::default());
        };
        // Each caller checks in with its list, so that one with another list is caught.
        let list = format!("{excluded:?}");
        let checked_in = |r: usize| format!("{base}/in/{}", world[r]);
        store.set(&checked_in(self.rank()), list.as_bytes())?;
        let deadline = Instant::now() + self.timeout();
        let members = loop {
            let gone = store.gone()?;
            let stays = |r: &usize| !gone.contains(&world[*r]) && excluded.binary_search(r).is_err();
            let mut waiting = Vec::new();
            for r in (0..self.size()).filter(stays) {
                match store.get(&checked_in(r), Duration::ZERO) {
                    Ok(theirs) if theirs != list.as_bytes() => {
                        return Err(Error::Mismatch(format!(
                            "shrink: rank {} excludes ranks {}, rank {} excludes {list}",
                            world[r],
                            String::from_utf8_lossy(&theirs),
                            world[self.rank()]
                        )))
                    }
                    Ok(_) => {}
                    Err(StoreError::Timeout { .. }) => waiting.push(world[r]),
                    Err(e) => return Err(e.into()),
                }
            }
            if waiting.is_empty() {
                break (0..self.size()).filter(stays).collect::<Vec<usize>>();
            }
            if Instant::now() >= deadline {
                return Err(Error::Closed(format!(
                    "shrink: rank(s) {waiting:?} neither called shrink nor left the job within {:.1}s",
                    self.timeout().as_secs_f64()
                )));
            }
            std::thread::sleep(POLL);
        };
        let me = members.iter().position(|&r| r == self.rank()).expect("this rank checked in and is not gone");
        let tag: Vec<String> = members.iter().map(|&r| world[r].to_string()).collect();
        tracing::info!(members = tag.join(","), "shrink: new communicator");
        let small = self.child(format!("{base}/c"), &members, me, &Options::default())?;
        // The store replays the failures that made this shrink necessary to every new
        // communicator; they are not the new one's. Nor are those of the ranks excluded.
        let left_out: Vec<usize> = (0..self.size()).filter(|r| !members.contains(r)).map(|r| world[r]).collect();
        small.core.ignore_failures_of(&left_out);
        Ok(small)
    }
}
