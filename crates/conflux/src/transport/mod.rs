//! Links between ranks: shared memory within a host, TCP across hosts.
//!
//! The lowest layer of the library, with `store/`: links, waiting and liveness only. It
//! stamps and checks the fingerprint of the call a message belongs to (`call/`), but knows
//! nothing of algorithms or communicators: it imports nothing from `algo/` or `comm/`. Call
//! numbering, the flight recorder and the choice of algorithm live in `comm/` above it.
//!
//! Algorithms see only [`Transport::exchange`]: a set of sends and receives with peers that
//! progress together until all are done, as one step of a schedule. Whether a peer is reached
//! through shared memory or TCP is decided at setup and invisible above this module.

mod board;
mod frame;
mod parts;
mod posted;
mod ring;
pub(crate) mod rounds;
pub(crate) mod shm;
pub(crate) mod single_copy;
mod stream;
mod tcp;
pub(crate) mod wait;
mod window;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

pub use stream::Streaming;

use crate::call::{Calls, Fingerprint};
pub use board::CallBoard;
use frame::RxState;
pub use frame::Sink;
pub(crate) use frame::COLL_BIT;
pub use parts::Parts;
use posted::PostedQueue;
pub(crate) use posted::{Posted, PostedBuf};
use ring::{SendProgress, ShmRx, ShmTx};
pub(crate) use shm::{Layout, Segment};
pub(crate) use tcp::TcpLink;
use wait::{Idle, Interests, Waiter};
pub(crate) use window::Window;
/// Why a transfer on a link failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkError {
    /// The peer's process exited or its connection closed.
    #[error("peer rank {peer} is gone: {detail}")]
    PeerGone { peer: usize, detail: String },
    /// The deadline passed while these ranks had not delivered or accepted their part.
    #[error("timed out after {secs:.1}s waiting for rank(s) {peers:?}")]
    Timeout { peers: Vec<usize>, secs: f64 },
    /// The peer sent something that does not match what this rank expected (length, tag).
    #[error("rank {peer} does not match this rank's call: {detail}")]
    Mismatch { peer: usize, detail: String },
    /// Another rank saw a failure and told everyone.
    #[error("rank {culprit} failed (reported by rank {reporter}): {reason}")]
    Remote { culprit: usize, reporter: usize, reason: String },
    /// This rank's communicator was aborted.
    #[error("aborted on this rank")]
    Aborted,
    /// The job's store, served by rank 0, cannot be reached any more.
    #[error("the job's store, served by rank 0, is unreachable")]
    StoreLost,
    /// A system call on the link failed.
    #[error("I/O error on the link to rank {peer}: {detail}")]
    Io { peer: usize, detail: String },
}

impl LinkError {
    /// The rank this error blames.
    pub fn peer(&self) -> Option<usize> {
        match self {
            LinkError::PeerGone { peer, .. } | LinkError::Mismatch { peer, .. } | LinkError::Io { peer, .. } => {
                Some(*peer)
            }
            LinkError::Remote { culprit, .. } => Some(*culprit),
            LinkError::Timeout { peers, .. } => peers.first().copied(),
            LinkError::StoreLost => Some(0),
            LinkError::Aborted => None,
        }
    }

    /// Renames the ranks a transport of a sub-group numbered in its own terms (index into
    /// `world`) to the job's global ranks, which is what errors show. `Remote` comes from the
    /// store and is global already.
    pub(crate) fn into_world(self, world: &[usize]) -> LinkError {
        let w = |r: usize| world.get(r).copied().unwrap_or(r);
        match self {
            LinkError::PeerGone { peer, detail } => LinkError::PeerGone { peer: w(peer), detail },
            LinkError::Mismatch { peer, detail } => LinkError::Mismatch { peer: w(peer), detail },
            LinkError::Io { peer, detail } => LinkError::Io { peer: w(peer), detail },
            LinkError::Timeout { peers, secs } => {
                LinkError::Timeout { peers: peers.into_iter().map(w).collect(), secs }
            }
            e @ (LinkError::Remote { .. } | LinkError::Aborted | LinkError::StoreLost) => e,
        }
    }
}

/// What one progress call did to one transfer: moved bytes, and finished it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Advance {
    pub moved: bool,
    pub done: bool,
}

/// One transfer of a step.
pub enum Xfer<'a> {
    /// Sends `data` to `peer` as one message tagged `tag`.
    Send { peer: usize, tag: u64, data: &'a [u8] },
    /// Receives the next message tagged `tag` from `peer` into `sink`; its length must equal the sink's.
    Recv { peer: usize, tag: u64, sink: Sink<'a> },
}

impl Xfer<'_> {
    fn peer(&self) -> usize {
        match self {
            Xfer::Send { peer, .. } | Xfer::Recv { peer, .. } => *peer,
        }
    }
    fn is_send(&self) -> bool {
        matches!(self, Xfer::Send { .. })
    }
}

pub(crate) enum Wire {
    Shm { tx: ShmTx, rx: ShmRx },
    Tcp(TcpLink),
}

/// The link to one peer.
pub(crate) struct Link {
    wire: Wire,
    rx: RxState,
    /// The last collective call whose message to this peer went out whole.
    sent: u64,
    /// The peer's process, when this rank may read its memory (`single_copy.rs`).
    pid: Option<u32>,
}

impl Link {
    /// A link through segment `seg` to local rank `peer`, whose process `pid` this rank may
    /// read large blocks from (None: never), its sends streamed as `streaming` says.
    pub fn shm(seg: &Arc<Segment>, me: usize, peer: usize, pid: Option<u32>, streaming: Streaming) -> Link {
        let tx = ShmTx::new(seg.clone(), me, peer, streaming);
        let wire = Wire::Shm { tx, rx: ShmRx::new(seg.clone(), peer, me) };
        Link { wire, rx: RxState::default(), sent: 0, pid }
    }
    pub fn tcp(link: TcpLink) -> Link {
        Link { wire: Wire::Tcp(link), rx: RxState::default(), sent: 0, pid: None }
    }

    /// Whether this rank need not read the peer's call board on leaving collective call `seq`
    /// (`Waiter::leave_call`): a message of the call from the peer carried this rank's
    /// fingerprint; or, with two ranks only, this rank's message of the call went out and the
    /// peer, over shared memory, has nothing unread for this rank. With two ranks the peer's
    /// call, whatever it is, reads this rank's messages (and checks their fingerprint), sends
    /// it one, or waits for its rounds (and watches the board while it waits). Had it sent
    /// one, either this look sees it, or the peer's own look on leaving sees this rank's,
    /// whose board entry was out before it: both sent before they looked, and a send's
    /// doorbell issues a SeqCst fence. So one of the two always compares, as when both read
    /// boards, and a rooted call's sender no longer fetches its peer's board line every call
    /// (a 2-rank reduce timed alone, 8-128 B: 0.76-0.93x the time).
    fn spares_board(&self, seq: u64, two_ranks: bool) -> bool {
        self.rx.proven == seq
            || (two_ranks
                && self.sent == seq
                && self.rx.idle()
                && matches!(&self.wire, Wire::Shm { rx, .. } if !rx.has_unread()))
    }
}

/// Most payload bytes one progress call moves on one transfer, so that sends and receives of
/// one step take turns and a receiver reduces while its sender still writes.
const BUDGET: usize = 128 << 10;

/// All links of one rank, and how it waits on them.
pub struct Transport {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) links: Vec<Option<Link>>,
    pub(crate) waiter: Waiter,
    /// Set once a link failed: nothing on this transport can be trusted after that.
    pub(crate) broken: Option<LinkError>,
    /// Rounds the direct shared-segment algorithms have run (the same count on every rank).
    direct_gen: u64,
    /// A round was started and has not finished its wait: its `fill` panicked. No round may
    /// follow (`rounds.rs`): a peer still in that one could read the next one's bytes.
    mid_round: bool,
    /// The first failure (not an abort), until the layer above has dumped its flight recorder
    /// (`settle_failure`): only then are the others told and posted transfers failed, so that
    /// no handle completes with the error, and no peer acts on it, before the dump is written.
    new_failure: Option<PendingFailure>,
    /// Asynchronous sends and receives progressing in the background.
    pub(crate) posted: PostedQueue,
    /// Operations running on a higher-priority lane of the same communicator; while there are
    /// any, this transport yields its core between chunks (see `give_way`).
    pub(crate) give_way: Option<Arc<AtomicUsize>>,
}

/// A first failure whose dump, report and posted completions are still to come.
struct PendingFailure {
    e: LinkError,
    /// Still to be reported to the store (a timeout was reported at once).
    report: bool,
}

#[derive(Default, Clone, Copy)]
struct XState {
    done: bool,
    send: SendProgress,
}

impl Transport {
    pub(crate) fn new(rank: usize, size: usize, links: Vec<Option<Link>>, waiter: Waiter) -> Transport {
        Transport {
            rank,
            size,
            links,
            waiter,
            broken: None,
            direct_gen: 0,
            mid_round: false,
            new_failure: None,
            posted: PostedQueue::default(),
            give_way: None,
        }
    }

    /// Leaves the collective call this rank is in, which went through (see `Waiter::leave_call`).
    pub(crate) fn leave_call(&self) -> Result<(), LinkError> {
        let (seq, two) = (self.waiter.calls.now.0, self.size == 2);
        let links = &self.links;
        self.waiter
            .leave_call(|rank| links.get(rank).and_then(Option::as_ref).is_some_and(|l| l.spares_board(seq, two)))
    }

    /// Ends every TCP link's outgoing stream, before this rank says goodbye: a peer still
    /// waiting for it learns so from the stream itself, after everything this rank sent.
    pub(crate) fn finish_sockets(&mut self) {
        for link in self.links.iter().flatten() {
            if let Wire::Tcp(tcp) = &link.wire {
                tcp.finish();
            }
        }
    }

    /// A lock-free reader of this host's call boards, when the ranks share a segment.
    pub(crate) fn call_board(&self) -> Option<CallBoard> {
        let w = &self.waiter;
        w.seg.as_ref().map(|seg| board::CallBoard::new(seg.clone(), w.seg_ranks.clone()))
    }

    /// Between two chunks of work: if a higher-priority lane has an operation running, let its
    /// thread have the core first. Priority is a preference, never a wait, so a low-priority
    /// operation can not deadlock on a high-priority one whose peers have not arrived yet.
    pub(crate) fn give_way(&self) {
        if self.give_way.as_ref().is_some_and(|n| n.load(Ordering::Relaxed) > 0) {
            std::thread::yield_now();
        }
    }

    /// Lets every shared-memory sender see all the space this rank has freed in its ring
    /// (published lazily, `ring.rs`): called before this rank waits, so that no wait of
    /// another rank can depend on space this one freed.
    fn flush_heads(&mut self) {
        for link in self.links.iter_mut().flatten() {
            if let Wire::Shm { rx, .. } = &mut link.wire {
                rx.flush();
            }
        }
    }

    /// Runs one step: progresses every transfer until all are done, the deadline passes, a peer
    /// fails, or the communicator is aborted. Transfers to or from one peer in one direction
    /// complete in the order given.
    pub fn exchange(&mut self, xfers: &mut [Xfer<'_>], deadline: Instant) -> Result<(), LinkError> {
        self.exchange_then(xfers, deadline, &mut Nothing)
    }

    /// `exchange`, where `then` holds transfers back until it releases them and hears of each
    /// transfer as it completes, to act on it at once (read what a message points at, release
    /// the answer): a step whose later transfers depend on earlier ones runs as one exchange,
    /// doing each piece of work as soon as the message it needs is in, whichever comes first.
    pub(crate) fn exchange_then<'a>(
        &mut self,
        xfers: &mut [Xfer<'a>],
        deadline: Instant,
        then: &mut impl Then<'a>,
    ) -> Result<(), LinkError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.run(xfers, deadline, then).map_err(|e| self.fail(e))
    }

    /// Makes `e` (in global ranks, traced to its root cause, see `Waiter::explain`) this
    /// transport's sticky state, tells the other ranks, fails posted transfers, and returns it.
    /// The first failure does the last two in `settle_failure`, after the flight recorder's dump.
    pub(crate) fn fail(&mut self, e: LinkError) -> LinkError {
        let raw = e.into_world(&self.waiter.live.world);
        // A timeout is reported as it is, at once: the ranks that wait for this one follow
        // the reports to the rank nobody heard from (`Waiter::explain`), and must not wait for
        // this rank's own search first.
        let timeout = matches!(raw, LinkError::Timeout { .. });
        if timeout {
            self.waiter.report(&raw);
        }
        let e = self.waiter.explain(raw);
        let first = self.broken.is_none() && e != LinkError::Aborted;
        self.broken = Some(e.clone());
        if first {
            self.new_failure = Some(PendingFailure { e: e.clone(), report: !timeout });
        } else {
            if !timeout {
                self.waiter.report(&e);
            }
            self.posted.fail_all(&e);
        }
        e
    }

    /// After this transport's first failure (not an abort): `dump(error, waiter)` writes the
    /// flight recorder, then the other ranks are told and posted transfers fail, in the order
    /// `fail` would have done them. Does nothing otherwise, or a second time.
    #[inline]
    pub(crate) fn settle_failure(&mut self, dump: impl FnOnce(&LinkError, &Waiter)) {
        // Looked at after every call: the look stays in the caller, the rest out of its way.
        if self.new_failure.is_some() {
            self.settle_new_failure(dump);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_new_failure(&mut self, dump: impl FnOnce(&LinkError, &Waiter)) {
        let Some(p) = self.new_failure.take() else { return };
        dump(&p.e, &self.waiter);
        if p.report {
            self.waiter.report(&p.e);
        }
        self.posted.fail_all(&p.e);
    }

    /// Posts a background transfer (see `posted.rs`) and makes one progress pass, which
    /// finishes a send that fits the link's buffer at once; a broken transport fails it at once.
    pub(crate) fn post(&mut self, p: Posted) {
        if let Some(e) = &self.broken {
            p.buf.finish(Err(e.clone()));
        } else if !p.is_any() && (p.peer == self.rank || p.peer >= self.size || self.links[p.peer].is_none()) {
            p.buf.finish(Err(LinkError::Io { peer: p.peer, detail: "no link to this rank".into() }));
        } else {
            self.posted.push(p);
            if let Err(e) = self.progress_posted() {
                self.fail(e);
            }
        }
    }

    pub(crate) fn has_posted(&self) -> bool {
        !self.posted.is_empty()
    }

    /// The peers a receive from any source may come from: every rank this one has a link to.
    pub(crate) fn peers(&self) -> Vec<usize> {
        (0..self.size).filter(|&q| self.links[q].is_some()).collect()
    }

    /// Drives posted transfers for up to `slice` (the engine's idle work); returns early when
    /// none is left, or when `give_up()` says an operation is waiting for the transport (its
    /// waker ends a sleep here, see `wait::SelfWake`).
    pub(crate) fn drive_posted(&mut self, slice: Duration, give_up: impl Fn() -> bool) {
        let end = Instant::now() + slice;
        let mut idle = Idle::default();
        loop {
            if give_up() {
                idle.progressed(&self.waiter);
                return;
            }
            let r = self.progress_posted();
            let progressed = match r {
                Ok(p) => p,
                Err(e) => {
                    self.fail(e);
                    return;
                }
            };
            if self.posted.is_empty() {
                idle.progressed(&self.waiter);
                return;
            }
            if progressed {
                idle.progressed(&self.waiter);
                continue;
            }
            if Instant::now() >= end {
                idle.progressed(&self.waiter);
                return;
            }
            self.flush_heads();
            let (links, posted) = (&self.links, &self.posted);
            match idle.wait(&mut self.waiter, end, || interests(links, posted.interests())) {
                Ok(()) => {}
                Err(LinkError::Timeout { .. }) => return,
                Err(e) => {
                    self.fail(e);
                    return;
                }
            }
        }
    }

    fn progress_posted(&mut self) -> Result<bool, LinkError> {
        if self.posted.is_empty() {
            return Ok(false);
        }
        let calls = self.waiter.calls;
        let links = std::cell::RefCell::new(&mut self.links);
        self.posted.progress(
            |peer, x, sp| step(links.borrow_mut()[peer].as_mut().expect("checked when posted"), peer, x, sp, &calls),
            |peer, tag| probe(links.borrow_mut()[peer].as_mut().expect("a linked peer"), peer, tag),
        )
    }

    fn run<'a>(
        &mut self,
        xfers: &mut [Xfer<'a>],
        deadline: Instant,
        then: &mut impl Then<'a>,
    ) -> Result<(), LinkError> {
        for x in xfers.iter() {
            let p = x.peer();
            if p == self.rank || p >= self.size || self.links[p].is_none() {
                return Err(LinkError::Io { peer: p, detail: "no link to this rank".into() });
            }
        }
        // Grown in place: built by value and then moved, it took a third of this function's own
        // samples in a profile of 64-byte broadcasts (the move's wide loads reading back the
        // fields' narrow stores, which the CPU cannot forward).
        let mut st: SmallVec<[XState; 8]> = SmallVec::new();
        st.resize(xfers.len(), XState::default());
        let mut idle = Idle::default();
        loop {
            let mut progressed = self.progress_posted()?;
            let mut pending = 0;
            for i in 0..xfers.len() {
                if st[i].done {
                    continue;
                }
                pending += 1;
                let (p, send) = (xfers[i].peer(), xfers[i].is_send());
                let blocked = (0..i).any(|j| !st[j].done && xfers[j].peer() == p && xfers[j].is_send() == send)
                    || (send && self.posted.holds_send_to(p));
                if blocked || !then.ready(i) {
                    continue;
                }
                let link = self.links[p].as_mut().expect("checked above");
                let Advance { moved: prog, done } = step(link, p, &mut xfers[i], &mut st[i].send, &self.waiter.calls)?;
                progressed |= prog;
                if done {
                    st[i].done = true;
                    pending -= 1;
                    then.done(self, i, xfers)?;
                }
            }
            if pending == 0 {
                idle.progressed(&self.waiter);
                return Ok(());
            }
            if progressed {
                idle.progressed(&self.waiter);
                self.give_way();
                continue;
            }
            self.flush_heads();
            let (links, posted, xfers, st) = (&self.links, &self.posted, &*xfers, &st);
            let open =
                move || (0..xfers.len()).filter(|&i| !st[i].done).map(|i| (xfers[i].peer(), xfers[i].is_send(), true));
            idle.wait(&mut self.waiter, deadline, || interests(links, open().chain(posted.interests())))?;
        }
    }

    /// Waits until `ready()` holds, for conditions on the shared segment (the direct
    /// algorithms). `laggards()` names the ranks still awaited, for a timeout's error.
    pub(crate) fn wait_until(
        &mut self,
        deadline: Instant,
        mut ready: impl FnMut() -> bool,
        laggards: impl Fn() -> Vec<usize>,
    ) -> Result<(), LinkError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        // First, looks at `ready` alone: a peer usually arrives within a few hundred
        // nanoseconds, and a pass of the waiter (a clock read, the liveness checks) takes
        // longer than the look.
        for _ in 0..QUICK_LOOKS {
            if ready() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        self.flush_heads();
        let mut idle = Idle::default();
        let r = loop {
            if ready() {
                idle.progressed(&self.waiter);
                break Ok(());
            }
            if let Err(e) = idle.wait(&mut self.waiter, deadline, || Interests {
                shm: true,
                sockets: Vec::new(),
                awaited: laggards(),
            }) {
                break Err(e);
            }
        };
        r.map_err(|e| self.fail(e))
    }
}

/// What an exchange does as its transfers complete (`Transport::exchange_then`).
pub(crate) trait Then<'a> {
    /// Whether transfer `i` may start: one held back waits, and so do the transfers after it
    /// to or from the same peer in the same direction.
    fn ready(&self, i: usize) -> bool;
    /// Transfer `i` is complete. May use the transport and rewrite transfers not yet started;
    /// an error ends the exchange as the transport's failure.
    fn done(&mut self, t: &mut Transport, i: usize, xfers: &mut [Xfer<'a>]) -> Result<(), LinkError>;
}

/// A plain exchange: every transfer starts at once, and completing one changes nothing.
struct Nothing;

impl<'a> Then<'a> for Nothing {
    #[inline(always)]
    fn ready(&self, _: usize) -> bool {
        true
    }
    #[inline(always)]
    fn done(&mut self, _: &mut Transport, _: usize, _: &mut [Xfer<'a>]) -> Result<(), LinkError> {
        Ok(())
    }
}

/// Looks at a wait's condition alone before the waiter's first pass (see `wait_until`).
const QUICK_LOOKS: usize = 16;

/// A failure nobody settled (a transport dropped at setup, before a lane held it) is still
/// told to the others, and its posted transfers fail, without a dump.
impl Drop for Transport {
    fn drop(&mut self) {
        self.settle_failure(|_, _| {});
    }
}

/// What a waiter watches for these (peer, is_send, awaited) transfers: whether any goes over
/// shared memory, the sockets of those over TCP, and the peers awaited.
fn interests<'a>(links: &'a [Option<Link>], open: impl Iterator<Item = (usize, bool, bool)>) -> Interests<'a> {
    let mut shm = false;
    let mut sockets = Vec::new();
    let mut peers = Vec::new();
    for (peer, send, awaited) in open {
        match &links[peer].as_ref().expect("checked before waiting").wire {
            Wire::Shm { .. } => shm = true,
            Wire::Tcp(t) => sockets.push(t.interest(send, peer)),
        }
        if awaited && !peers.contains(&peer) {
            peers.push(peer);
        }
    }
    Interests { shm, sockets, awaited: peers }
}

/// Whether `peer` has a message for a receive from any source. A candidate that closed its
/// link after its last message is not the receive's failure: it just has nothing more (a
/// receive from it in particular still fails, and the store reports a rank that died).
fn probe(link: &mut Link, peer: usize, tag: u64) -> Result<bool, LinkError> {
    let r = match &mut link.wire {
        Wire::Shm { rx, .. } => link.rx.probe(rx, peer, tag),
        Wire::Tcp(t) => link.rx.probe(t, peer, tag),
    };
    match r {
        Err(LinkError::PeerGone { .. }) => Ok(false),
        r => r,
    }
}

/// Advances one transfer; a collective's messages carry (and must match) this rank's call.
fn step(
    link: &mut Link,
    peer: usize,
    x: &mut Xfer<'_>,
    send: &mut SendProgress,
    calls: &Calls,
) -> Result<Advance, LinkError> {
    let with_call = |tag: u64| (tag, if tag & COLL_BIT != 0 { calls.now.1 } else { Fingerprint::NONE });
    match (x, &mut link.wire) {
        (Xfer::Send { tag, data, .. }, Wire::Shm { tx, .. }) => {
            let a = tx.send(with_call(*tag), data, send, BUDGET);
            if a.done && *tag & COLL_BIT != 0 {
                link.sent = *tag & !COLL_BIT;
            }
            Ok(a)
        }
        (Xfer::Send { tag, data, .. }, Wire::Tcp(t)) => t.send(with_call(*tag), data, send),
        (Xfer::Recv { tag, sink, .. }, Wire::Shm { rx, .. }) => link.rx.step(rx, peer, (*tag, calls), sink, BUDGET),
        (Xfer::Recv { tag, sink, .. }, Wire::Tcp(t)) => link.rx.step(t, peer, (*tag, calls), sink, BUDGET),
    }
}
