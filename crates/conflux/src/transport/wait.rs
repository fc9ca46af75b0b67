//! How a rank waits: spin briefly (yielding the CPU if a local peer last ran on it, see
//! YIELD_AFTER), then sleep until a peer rings its doorbell, a socket becomes ready, or a slice
//! of time passes; and on every wake-up, check that the peers are alive.
//!
//! Three pieces: this file (spinning, the doorbell and socket sleeps, the call-board checks),
//! `liveness.rs` (are the awaited peers alive, what the store reports, telling the others when
//! this rank fails) and `explain.rs` (naming the root cause of a failure).
//!
//! Doorbells (shared memory). Each local rank has a `doorbell` word and a `sleeping` flag in the
//! segment. A sleeper reads the doorbell, sets `sleeping`, issues a SeqCst fence, and checks its
//! condition once more before `futex_wait(doorbell, value)`. A waker changes the condition,
//! issues a SeqCst fence, and only if it sees `sleeping` set bumps the doorbell and calls
//! `futex_wake`. The fences make it impossible for both to miss each other: either the waker
//! sees `sleeping`, or the sleeper's last check sees the new condition. The bump makes a
//! sleeper that has not yet reached futex_wait return at once. Wakers pay no system call while
//! nobody sleeps, which is the common case when ranks have a core each.
//!
//! Waking oneself (`SelfWake`). Another thread of this process sometimes needs a sleeping
//! waiter up at once: an abort, or an operation that wants the transport the engine thread
//! holds while it sleeps between posted transfers. It bumps this rank's doorbell (a futex
//! sleeper) and writes an eventfd that every socket sleep polls as well.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::thread::futex;

mod explain;
mod liveness;

pub(crate) use liveness::abort_reason;

use super::shm::Segment;
use super::{board, LinkError};
use crate::call::{Calls, Fingerprint};
use crate::store::Monitor;
use liveness::{Liveness, NextLook};

/// How long a waiter spins before it checks, and then again every as long, whether a local
/// peer last ran on its own CPU; if one did, it yields the CPU. The scheduler now and then
/// puts two ranks on one core for up to a few hundred milliseconds, even with a core per rank
/// (2 ranks on 2 cores, unbound, as torchrun leaves them). The peer that would end the wait is
/// then queued behind the spinner, and each exchange cost the whole spin and a wake-up: an
/// 8-byte all_reduce took 42-53 us a call instead of 0.7 (`scripts/bench-colocated`). The
/// yield lets that peer run at once. Yielding on every long spin instead, whether or not a
/// peer shares the CPU, made back-to-back broadcast and reduce at 2 ranks 10-20% slower: a
/// yield is a system call.
const YIELD_AFTER: Duration = Duration::from_micros(3);
/// A waiter's pause grows by one pause instruction every this many nanoseconds it has spun
/// (see `Waiter::pause`).
const PAUSE_GROWS_EVERY_NS: u128 = 64;
/// Longest a sleeper sleeps before it checks liveness, abort and the deadline again.
const SLICE: Duration = Duration::from_millis(20);
/// Longest a sleeper waits on sockets when shared-memory work is also pending.
const MIXED_SLICE: Duration = Duration::from_micros(200);

/// Wakes local rank `i` if it sleeps (the waker's half of the doorbell protocol).
pub(crate) fn ring_doorbell(seg: &Segment, i: usize) {
    fence(Ordering::SeqCst);
    if seg.u32_at(seg.layout.sleeping(i)).load(Ordering::Relaxed) != 0 {
        let bell = seg.u32_at(seg.layout.doorbell(i));
        bell.fetch_add(1, Ordering::Release);
        let _ = futex::wake(bell, futex::Flags::empty(), i32::MAX as u32);
    }
}

/// Local peer `peer` published call `theirs` at number `seq`, where this rank is in `mine`.
#[cold]
fn mismatch(peer: usize, seq: u64, theirs: Fingerprint, mine: Fingerprint) -> LinkError {
    LinkError::Mismatch {
        peer,
        detail: format!("in collective call #{seq} it called {theirs}, this rank called {mine}"),
    }
}

/// What a rank watches while it waits.
pub(crate) struct Waiter {
    /// This host's segment (doorbells, call boards) and this rank's index in it.
    pub(crate) seg: Option<Arc<Segment>>,
    pub(crate) me_local: usize,
    /// This communicator's rank of each rank of the segment, by segment index.
    pub(crate) seg_ranks: Vec<usize>,
    /// The collective this rank is in and the one before, published on the call board.
    pub(crate) calls: Calls,
    /// Whether the awaited peers are alive, and what the store says (`liveness.rs`).
    pub(crate) live: Liveness,
    pub(crate) abort: Arc<AtomicBool>,
    pub(crate) spin: Duration,
    pub(crate) yield_while_spinning: bool,
    /// The CPU last published as this rank's (plus one; 0: none yet).
    cpu: u32,
    last_check: Instant,
    /// Polled by socket sleeps, so that `SelfWake` ends them.
    wake_fd: Arc<OwnedFd>,
}

/// Wakes one rank's waiter from another thread of its process (see the module's doc).
#[derive(Clone)]
pub(crate) struct SelfWake {
    bell: Option<(Arc<Segment>, usize)>,
    fd: Arc<OwnedFd>,
}

impl SelfWake {
    pub fn wake(&self) {
        if let Some((seg, me_local)) = &self.bell {
            let bell = seg.u32_at(seg.layout.doorbell(*me_local));
            bell.fetch_add(1, Ordering::Release);
            let _ = futex::wake(bell, futex::Flags::empty(), i32::MAX as u32);
        }
        // Non-blocking: a counter already at its limit has a wake-up pending anyway.
        let _ = rustix::io::write(&*self.fd, &1u64.to_ne_bytes());
    }
}

/// What a waiting loop is waiting on, for one sleep.
pub(crate) struct Interests<'a> {
    /// Some transfer goes over shared memory (a doorbell can end the sleep).
    pub shm: bool,
    /// Sockets of the transfers over TCP.
    pub sockets: Vec<SocketInterest<'a>>,
    /// The peers the caller still needs something from, for liveness checks and timeouts.
    pub awaited: Vec<usize>,
}

/// A socket the waiter should watch, and for what.
pub(crate) struct SocketInterest<'a> {
    pub fd: BorrowedFd<'a>,
    pub read: bool,
    pub write: bool,
    /// The peer at the other end, named when a send to it can never finish.
    pub peer: usize,
}

/// This host's shared segment, as a waiter sees it.
pub(crate) struct OnHost {
    pub seg: Arc<Segment>,
    /// This rank's index in the segment.
    pub me_local: usize,
    /// The communicator's rank of each rank of the segment, by segment index.
    pub ranks: Vec<usize>,
}

/// Everything a waiter is told at setup.
pub(crate) struct Watch {
    /// The segment, when this rank shares one with local peers.
    pub host: Option<OnHost>,
    /// (rank, pidfd) of every other local rank.
    pub pidfds: Vec<(usize, OwnedFd)>,
    /// This communicator's own channel to the store.
    pub monitor: Option<Monitor>,
    /// The global rank of each rank of this communicator, and this rank's index in it.
    pub world: Arc<[usize]>,
    pub rank: usize,
    pub abort: Arc<AtomicBool>,
    /// How long to spin before sleeping, and whether to yield while spinning (the host runs
    /// more ranks than cores).
    pub spin: Duration,
    pub yield_while_spinning: bool,
}

impl Waiter {
    pub fn new(w: Watch) -> std::io::Result<Waiter> {
        use rustix::event::{eventfd, EventfdFlags};
        let wake_fd = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let me = w.world.get(w.rank).copied().unwrap_or(w.rank);
        let (seg, me_local, seg_ranks) = match w.host {
            Some(h) => (Some(h.seg), h.me_local, h.ranks),
            None => (None, 0, Vec::new()),
        };
        let live = Liveness {
            pidfds: w.pidfds,
            monitor: w.monitor,
            world: w.world,
            me,
            on_host: seg_ranks.clone(),
            ignored: Vec::new(),
            scope: Arc::from(""),
            exited_seen: Vec::new(),
            left: Vec::new(),
            clues: Vec::new(),
            from_store: false,
        };
        Ok(Waiter {
            seg,
            me_local,
            seg_ranks,
            calls: Calls::default(),
            live,
            abort: w.abort,
            spin: w.spin,
            yield_while_spinning: w.yield_while_spinning,
            cpu: 0,
            last_check: Instant::now(),
            wake_fd,
        })
    }

    /// A handle that wakes this waiter from another thread.
    pub fn self_wake(&self) -> SelfWake {
        SelfWake { bell: self.seg.clone().map(|s| (s, self.me_local)), fd: self.wake_fd.clone() }
    }

    /// Enters collective call `seq`: local peers can now compare their call with it.
    #[inline]
    pub fn enter_call(&mut self, seq: u64, call: Fingerprint) {
        self.calls.enter(seq, call);
        if let Some(seg) = &self.seg {
            board::publish(seg, self.me_local, seq, call);
        }
    }

    /// Leaving the current call, which went through: fails if a local peer's board shows
    /// another call at this call's number or the one before (an entry it no longer holds, or
    /// does not hold yet, shows nothing). `proven(rank)`: a message of this call from that peer
    /// carried this rank's fingerprint (`frame.rs`), so its board is not read. That covers the
    /// call before too: the peer sent this call's message only after it left that one, and of
    /// the two the one that left it later compared it, from the other's message or board
    /// entry (which the other, at most one call further, still held).
    ///
    /// Checked on the way out, not the way in, so that only peers this call did not hear from
    /// cost a read: a board is a cache line that moves with every call, and reading the root's
    /// took 30% of a back-to-back 64-byte broadcast at 2 ranks. In a mismatch where no message
    /// is read (ranks that disagree on a broadcast's root each only send), both ranks publish,
    /// move bytes through a ring (whose doorbell issues a SeqCst fence) and then read, so one
    /// of the two sees the other's entry, unless the other has already run two calls further
    /// and overwritten it. A message of the mismatched call that a later point-to-point
    /// receive meets fails that receive (`Calls::finished`). Ranks whose part of the call was
    /// TCP only have no fence between publishing and reading, as before this check moved.
    #[inline]
    pub fn leave_call(&self, proven: impl Fn(usize) -> bool) -> Result<(), LinkError> {
        self.check_board(&[self.calls.before, self.calls.now], proven)
    }

    /// Local rank `i`'s call number `seq`, if its board still holds it.
    pub fn peer_call(&self, i: usize, seq: u64) -> Option<Fingerprint> {
        board::read(self.seg.as_ref()?, i, seq)
    }

    /// The newest call local rank `i` has published, with its number.
    pub fn peer_latest(&self, i: usize) -> Option<(u64, Fingerprint)> {
        board::latest(self.seg.as_ref()?, i)
    }

    /// Where each local peer is, as its call board says, for the flight recorder's dump.
    pub fn peers_calls(&self) -> String {
        if self.seg.is_none() {
            return String::new();
        }
        let mut s = String::new();
        for (i, &peer) in self.seg_ranks.iter().enumerate().filter(|&(i, _)| i != self.me_local) {
            let rank = self.live.world.get(peer).copied().unwrap_or(peer);
            let at = self.peer_latest(i).map_or("no collective yet".into(), |(n, fp)| format!("#{n} {fp}"));
            s += &format!("  local rank {rank} last entered {at}\n");
        }
        s
    }

    /// Fails if a local peer, but those `skip` names, made one of `calls` (number, fingerprint)
    /// with another fingerprint than this rank's. One pass over the peers, `skip` asked once
    /// each: leaving a call checks two calls, and two passes cost 7 ns of an 8-byte call's 72
    /// at 1 rank.
    #[inline]
    fn check_board(&self, calls: &[(u64, Fingerprint)], skip: impl Fn(usize) -> bool) -> Result<(), LinkError> {
        let Some(seg) = &self.seg else { return Ok(()) };
        for (i, &peer) in self.seg_ranks.iter().enumerate() {
            if i == self.me_local || skip(peer) {
                continue;
            }
            for &(seq, mine) in calls {
                if let Some(theirs) = board::read(seg, i, seq).filter(|theirs| *theirs != mine) {
                    return Err(mismatch(peer, seq, theirs, mine));
                }
            }
        }
        Ok(())
    }

    /// Publishes the CPU this thread runs on, if it changed, for the peers' `peer_on_my_cpu`.
    fn publish_cpu(&mut self) {
        let Some(seg) = &self.seg else { return };
        let cpu = rustix::thread::sched_getcpu() as u32 + 1;
        if cpu != self.cpu {
            self.cpu = cpu;
            seg.u32_at(seg.layout.cpu(self.me_local)).store(cpu, Ordering::Relaxed);
        }
    }

    /// Whether a local peer last waited on the CPU this thread runs on now: it may be queued
    /// behind this one (see YIELD_AFTER).
    fn peer_on_my_cpu(&self) -> bool {
        let Some(seg) = &self.seg else { return false };
        let cpu = rustix::thread::sched_getcpu() as u32 + 1;
        (0..seg.layout.ranks)
            .any(|k| k != self.me_local && seg.u32_at(seg.layout.cpu(k)).load(Ordering::Relaxed) == cpu)
    }

    /// Called between fruitless progress passes while spinning, `spun` into the wait;
    /// `crowded`: a peer may be waiting for this CPU.
    ///
    /// The pause grows with the wait. A pause instruction takes 25 ns on this machine (AMD
    /// EPYC), so the fixed 32 it used to make meant a peer's arrival was seen up to 0.8 us
    /// late, about the whole time of an 8-byte all_reduce at 2 ranks. One pause at first halves
    /// small collectives; but kept up through a long wait (a large transfer's next chunk), the
    /// faster polling takes the line the peer writes from it, and 64 KiB-16 MiB collectives
    /// were 10-30% slower. So: 1 pause, growing to 32 over the first 2 us.
    pub fn pause(&self, crowded: bool, spun: Duration) {
        if self.yield_while_spinning || crowded {
            std::thread::yield_now();
        } else {
            for _ in 0..(spun.as_nanos() / PAUSE_GROWS_EVERY_NS).clamp(1, 32) {
                std::hint::spin_loop();
            }
        }
    }

    /// First half of going to sleep: returns the doorbell value to sleep on. The caller must make
    /// one more progress pass after this and call `sleep` only if that pass did nothing.
    pub fn arm(&self) -> u32 {
        let Some(seg) = &self.seg else { return 0 };
        let v = seg.u32_at(seg.layout.doorbell(self.me_local)).load(Ordering::Acquire);
        seg.u32_at(seg.layout.sleeping(self.me_local)).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        v
    }

    pub fn disarm(&self) {
        if let Some(seg) = &self.seg {
            seg.u32_at(seg.layout.sleeping(self.me_local)).store(0, Ordering::Relaxed);
        }
    }

    /// Sleeps until a doorbell, a watched socket, or one time slice; then checks liveness.
    pub fn sleep(
        &mut self,
        bell: u32,
        shm_pending: bool,
        sockets: &[SocketInterest<'_>],
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let now = Instant::now();
        let slice = if sockets.is_empty() || !shm_pending { SLICE } else { MIXED_SLICE };
        let wait = slice.min(deadline.saturating_duration_since(now));
        if !sockets.is_empty() {
            let mut fds: Vec<PollFd<'_>> = sockets
                .iter()
                .map(|s| {
                    let mut f = PollFlags::empty();
                    if s.read {
                        f |= PollFlags::IN;
                    }
                    if s.write {
                        // A rank ends its streams only as it leaves, and reads nothing after: a
                        // send still blocked when the end arrives can never finish.
                        f |= PollFlags::OUT | PollFlags::RDHUP;
                    }
                    PollFd::from_borrowed_fd(s.fd, f)
                })
                .collect();
            fds.push(PollFd::from_borrowed_fd(self.wake_fd.as_fd(), PollFlags::IN));
            if let Some(m) = &self.live.monitor {
                fds.push(PollFd::from_borrowed_fd(m.as_fd(), PollFlags::IN));
            }
            let ts = rustix::time::Timespec::try_from(wait).unwrap_or(rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 });
            let _ = poll(&mut fds, Some(&ts));
            if fds[sockets.len()].revents().contains(PollFlags::IN) {
                // Reset the counter; the waker's purpose (this wake-up) is served.
                let _ = rustix::io::read(&*self.wake_fd, &mut [0u8; 8]);
            }
            let ended = sockets.iter().zip(&fds).find(|(s, f)| s.write && f.revents().contains(PollFlags::RDHUP));
            if let Some((s, _)) = ended {
                let detail = if self.live.left.iter().any(|(p, _)| *p == s.peer) { LEFT } else { ENDED };
                self.disarm();
                return Err(LinkError::PeerGone { peer: s.peer, detail: detail.into() });
            }
        } else if let Some(seg) = &self.seg {
            let ts = rustix::time::Timespec::try_from(wait).unwrap_or(rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 });
            let bell_word = seg.u32_at(seg.layout.doorbell(self.me_local));
            // EAGAIN (the bell rang already), ETIMEDOUT and EINTR all just mean "look again".
            let _ = futex::wait(bell_word, futex::Flags::empty(), bell, Some(&ts));
        } else {
            std::thread::sleep(wait);
        }
        self.disarm();
        Ok(())
    }

    /// Checks abort always, and liveness when a slice has passed since the last look (or
    /// `force`). `awaited()` names the ranks the caller still needs something from.
    pub fn check(
        &mut self,
        deadline: Instant,
        force: bool,
        awaited: impl FnOnce() -> Vec<usize>,
    ) -> Result<(), LinkError> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(LinkError::Aborted);
        }
        let now = Instant::now();
        if force || now.duration_since(self.last_check) >= SLICE || now >= deadline {
            self.last_check = now;
            self.check_liveness(&awaited())?;
        }
        Ok(())
    }

    /// Fails if a local peer is in this rank's call number with another call, or if
    /// `Liveness::check` fails.
    pub fn check_liveness(&mut self, awaited: &[usize]) -> Result<(), LinkError> {
        self.check_board(&[self.calls.now], |_| false)?;
        if self.live.check(awaited)? == NextLook::Soon {
            // Look again soon rather than a whole slice later.
            self.last_check = Instant::now() - SLICE + Duration::from_millis(1);
        }
        Ok(())
    }

    /// See `Liveness::report`.
    pub fn report(&mut self, err: &LinkError) {
        self.live.report(err);
    }

    /// See `Liveness::explain`.
    pub fn explain(&mut self, e: LinkError) -> LinkError {
        self.live.explain(e)
    }
}

/// Why a peer that said goodbye fails a wait for it.
const LEFT: &str = "its process shut down (left the job) while this rank still waited for it";
/// Why a send fails to a TCP peer whose stream ended before its goodbye came (leaving or dead).
const ENDED: &str = "it ended its TCP stream (it left the job or died) while this rank still had data for it";

/// A waiting loop's state between fruitless passes: spinning since when, armed to sleep or not.
#[derive(Default)]
pub(crate) struct Idle {
    since: Option<Instant>,
    armed: Option<u32>,
    /// Looks for a peer on this CPU since `since` (see YIELD_AFTER).
    looks: u128,
}

impl Idle {
    /// The caller made progress: spinning starts afresh next time.
    pub fn progressed(&mut self, w: &Waiter) {
        self.since = None;
        self.looks = 0;
        if self.armed.take().is_some() {
            w.disarm();
        }
    }

    /// One fruitless pass: spin, arm, or sleep, then return so the caller tries again.
    /// `what()` tells what the caller waits on.
    pub fn wait<'a>(
        &mut self,
        w: &mut Waiter,
        deadline: Instant,
        what: impl FnOnce() -> Interests<'a>,
    ) -> Result<(), LinkError> {
        let now = Instant::now();
        if self.since.is_none() {
            w.publish_cpu();
        }
        let since = *self.since.get_or_insert(now);
        if now >= deadline {
            w.disarm();
            self.armed = None;
            let peers = what().awaited;
            w.check(deadline, true, || peers.clone())?;
            return Err(LinkError::Timeout { peers, secs: now.duration_since(since).as_secs_f64() });
        }
        let spun = now.duration_since(since);
        if spun < w.spin {
            w.check(deadline, false, || what().awaited)?;
            let due = spun.as_nanos() / YIELD_AFTER.as_nanos();
            let crowded = due > self.looks && w.peer_on_my_cpu();
            self.looks = self.looks.max(due);
            w.pause(crowded, spun);
            return Ok(());
        }
        match self.armed.take() {
            None => self.armed = Some(w.arm()),
            Some(bell) => {
                let Interests { shm, sockets, awaited: peers } = what();
                w.sleep(bell, shm, &sockets, deadline)?;
                w.check(deadline, false, || peers)?;
            }
        }
        Ok(())
    }
}
