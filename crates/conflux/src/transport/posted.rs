//! Point-to-point transfers that progress in the background (isend / irecv).
//!
//! A collective runs as one blocking step after another, but a pipeline stage posts a send to
//! its successor and a receive from its predecessor and expects both to move at once: if sends
//! ran to completion in issue order, two ranks sending each other more than a ring holds would
//! wait on each other forever. So an asynchronous send or receive is *posted*: the transport
//! keeps it and advances it on every progress pass, whatever else runs, and the progress
//! engine drives it while it has nothing else to do.
//!
//! Ordering: posted transfers to (or from) one peer complete in the order posted, and a later
//! step's send to that peer waits until the posted sends before it are written, so messages
//! between two ranks keep their issue order in both directions.
//!
//! A receive from any source (torch's `recv` without `src`) waits unmatched until some
//! candidate peer's link has a message with its tag ready (`RxState::probe`), skipping peers
//! that an earlier posted receive is waiting on; from then on it is a receive from that peer.
//! Receives from any source match in the order posted.

use std::collections::VecDeque;
use std::time::Instant;

use super::frame::Sink;
use super::ring::SendProgress;
use super::{Advance, LinkError, Xfer};

/// The buffer a posted transfer owns until it is over, and what to do then.
pub(crate) trait PostedBuf: Send {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Called exactly once, when the transfer has finished (from this peer) or failed.
    fn finish(self: Box<Self>, r: Result<usize, LinkError>);
}

pub(crate) struct Posted {
    pub peer: usize,
    pub tag: u64,
    pub send: bool,
    pub deadline: Instant,
    posted_at: Instant,
    pub buf: Box<dyn PostedBuf>,
    progress: SendProgress,
    done: bool,
    /// For a receive from any source not yet matched: the peers it may come from.
    any_of: Option<Vec<usize>>,
}

impl Posted {
    pub fn new(peer: usize, tag: u64, send: bool, deadline: Instant, buf: Box<dyn PostedBuf>) -> Posted {
        Posted {
            peer,
            tag,
            send,
            deadline,
            posted_at: Instant::now(),
            buf,
            progress: SendProgress::default(),
            done: false,
            any_of: None,
        }
    }

    /// A receive of the next message tagged `tag` from whichever of `peers` has one first.
    pub fn recv_any(peers: Vec<usize>, tag: u64, deadline: Instant, buf: Box<dyn PostedBuf>) -> Posted {
        Posted { any_of: Some(peers), ..Posted::new(usize::MAX, tag, false, deadline, buf) }
    }

    pub fn is_any(&self) -> bool {
        self.any_of.is_some()
    }

    fn waits_on(&self) -> &[usize] {
        self.any_of.as_deref().unwrap_or(std::slice::from_ref(&self.peer))
    }
}

/// The posted transfers of one transport, in the order posted.
#[derive(Default)]
pub(crate) struct PostedQueue {
    items: VecDeque<Posted>,
}

impl PostedQueue {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn push(&mut self, p: Posted) {
        self.items.push_back(p);
    }

    /// True while a posted send to `peer` is unwritten: a later send to it must wait.
    pub fn holds_send_to(&self, peer: usize) -> bool {
        self.items.iter().any(|p| p.send && p.peer == peer)
    }

    /// (peer, is_send, awaited) of every posted transfer, for the waiter. A receive from any
    /// source watches every candidate but awaits none: a candidate that exits cleanly is not a
    /// failure (the store reports one that dies).
    pub fn interests(&self) -> impl Iterator<Item = (usize, bool, bool)> + '_ {
        self.items.iter().flat_map(|p| p.waits_on().iter().map(move |&q| (q, p.send, !p.is_any())))
    }

    /// Matches the receive from any source at `i` to a peer with a message ready, if one has.
    fn match_any(
        &mut self,
        i: usize,
        probe: &mut impl FnMut(usize, u64) -> Result<bool, LinkError>,
    ) -> Result<(), LinkError> {
        if !self.items[i].is_any() {
            return Ok(());
        }
        let (before, rest) = self.items.make_contiguous().split_at_mut(i);
        let p = &mut rest[0];
        let Some(peers) = &p.any_of else { return Ok(()) };
        if before.iter().any(|b| b.any_of.is_some()) {
            return Ok(()); // an earlier receive from any source matches first
        }
        for &q in peers {
            if before.iter().any(|b| !b.send && b.peer == q) {
                continue;
            }
            if probe(q, p.tag)? {
                p.peer = q;
                p.any_of = None;
                return Ok(());
            }
        }
        Ok(())
    }

    /// One pass over every posted transfer; `step` moves one transfer on its link and tells
    /// what it did. Finished transfers are completed and removed.
    /// `probe(peer, tag)` tells whether a receive of `tag` from `peer` would match now.
    pub fn progress(
        &mut self,
        mut step: impl FnMut(usize, &mut Xfer<'_>, &mut SendProgress) -> Result<Advance, LinkError>,
        mut probe: impl FnMut(usize, u64) -> Result<bool, LinkError>,
    ) -> Result<bool, LinkError> {
        let now = Instant::now();
        let mut progressed = false;
        for i in 0..self.items.len() {
            if now >= self.items[i].deadline {
                let p = &self.items[i];
                return Err(LinkError::Timeout {
                    peers: p.waits_on().to_vec(),
                    secs: (now - p.posted_at).as_secs_f64(),
                });
            }
            self.match_any(i, &mut probe)?;
            let (peer, send) = (self.items[i].peer, self.items[i].send);
            if self.items[i].any_of.is_some()
                || (0..i).any(|j| self.items[j].peer == peer && self.items[j].send == send)
            {
                continue;
            }
            let p = &mut self.items[i];
            let tag = p.tag;
            let Advance { moved: prog, done } = if send {
                let mut x = Xfer::Send { peer, tag, data: p.buf.bytes() };
                step(peer, &mut x, &mut p.progress)?
            } else {
                let mut x = Xfer::Recv { peer, tag, sink: Sink::Copy(p.buf.bytes_mut()) };
                step(peer, &mut x, &mut p.progress)?
            };
            progressed |= prog;
            p.done = done;
        }
        let mut i = 0;
        while i < self.items.len() {
            if self.items[i].done {
                let p = self.items.remove(i).expect("index in range");
                p.buf.finish(Ok(p.peer));
            } else {
                i += 1;
            }
        }
        Ok(progressed)
    }

    /// Fails every posted transfer with `e`.
    pub fn fail_all(&mut self, e: &LinkError) {
        for p in self.items.drain(..) {
            p.buf.finish(Err(e.clone()));
        }
    }
}
