//! Rounds on the host's shared segment: the protocol the direct algorithms (`algo/direct/`)
//! run on, with every unsafe access to the segment's slots here, behind borrows that enforce
//! it: a round's parts can be read only while the `Round` lives, and the next round can be
//! published only once it is gone.
//!
//! Protocol. A per-communicator counter `gen` numbers rounds, the same on every rank; round
//! `gen` uses the slots and result of parity `gen % 2`.
//!  1. Write slot(me, p); store `desc[me][p]` (a digest of the call's and the previous call's
//!     numbers and fingerprints, `Calls::digest`: one word, read in the line this rank reads
//!     anyway; four words cost 8% of an 8-byte all_reduce) and `posted[me] = gen` (Release);
//!     ring every doorbell.
//!  2. Wait until `posted[k] >= gen` for all k (Acquire); check every rank's `desc`. A rank
//!     whose digest differs is described from its call board (`board.rs`).
//!  3. (`Round::share`, the large all_reduce) reduce slice `me` of all slots into result(p);
//!     `reduced[me] = gen`; ring doorbells; wait until `reduced[k] >= gen` for all k; read
//!     result(p).
//!
//! Reuse. slot(me, p) is next written at gen + 2, after this rank saw `posted[k] >= gen + 1`
//! for all k in step 2 of gen + 1; a rank posts gen + 1 only after it finished reading the
//! slots of gen (its `Round` is dropped before `Rounds::round` can run again). result(p)
//! slice k is next written by rank k at gen + 2 after it saw every rank post gen + 2, which
//! each does only after reading result(p) of gen. desc has an entry per parity for the same
//! reason: rank k rewrites desc[k][p] only at gen + 2. A round whose wait failed fails the
//! transport, and no later round is published on it: a peer still in it could read the next
//! one's bytes as its own.
//!
//! Inline. A part of at most `INLINE_DATA` (368) bytes travels in rank me's inline block
//! `inline(me, p)`: six 64-byte lines, the round number and the descriptor in the first 16
//! bytes, the data after them in one piece. Rank me writes the data beyond the first line,
//! then the first line's data and the descriptor, and stores the round number last (Release);
//! a peer that sees it (Acquire) has every byte of the part. A waiting peer polls that one word,
//! where the slot path reads `posted` first and the slot and descriptor lines only after it;
//! the first line is written last so that the poller does not take it away mid-write. Readers
//! borrow the data where it lies, with no copy. (It once carried a round number in every
//! line, and readers gathered it line by line into a buffer: at 2 ranks, 8-512 B all_gather,
//! all_to_all and reduce_scatter took 1.05-1.2x the time they take now, the fastest of 11
//! alternating runs each.) Against the slot path, at 2 ranks, medians of 5 interleaved runs
//! with ranks bound to cores: 64 B 0.62 against 0.81 us, 256 B 0.67 against 0.84.
//! `posted[me] = gen` is stored too, so that the counter larger chunks wait on never falls
//! behind; no peer reads it meanwhile, so the store stays in this rank's cache. Reuse is as
//! for slots: the block of parity p is next written at gen + 2, after every peer announced
//! gen + 1 (in its inline block or `posted`), which it does only after reading this one. Ranks
//! that disagree on the length take different paths, or lengths with different descriptors,
//! and find out from the descriptor or from the call board while they wait.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::shm::{INLINE_DATA, INLINE_HEAD};
use super::wait::ring_doorbell;
use super::{LinkError, Parts, Segment, Transport};

/// How one rank's bytes of a round travel: in its inline block (Inline above), or at an
/// offset in its slot. Every rank takes the same way in a round.
#[derive(Clone, Copy)]
pub(crate) enum Via {
    Inline,
    Slot(usize),
}

impl Via {
    /// Inline when the longest rank's part fits an inline block, else at `place` in the slot.
    pub(crate) fn for_len(most: usize, place: usize) -> Via {
        if most <= INLINE_DATA {
            Via::Inline
        } else {
            Via::Slot(place)
        }
    }
}

/// The shared segment's rounds for one call of a direct algorithm (`Transport::rounds`).
pub(crate) struct Rounds<'t> {
    t: &'t mut Transport,
    seg: Arc<Segment>,
    /// This call's and the previous call's fingerprints, which every rank's must equal.
    digest: u64,
}

impl Transport {
    /// The segment's rounds, for one call of a direct algorithm. A transport that failed
    /// already writes nothing more: a peer still in the failed call could read it as that
    /// call's data.
    #[inline]
    pub(crate) fn rounds(&mut self) -> Result<Rounds<'_>, LinkError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if self.mid_round {
            return Err(interrupted(self.rank));
        }
        let no_segment = || LinkError::Io { peer: self.rank, detail: "no shared segment on this host".into() };
        let seg = self.waiter.seg.clone().ok_or_else(no_segment)?;
        let digest = self.waiter.calls.digest();
        Ok(Rounds { t: self, seg, digest })
    }
}

impl<'t> Rounds<'t> {
    /// The ranks of the segment.
    pub fn ranks(&self) -> usize {
        self.seg.layout.ranks
    }
    /// This rank's index in the segment.
    pub fn local_rank(&self) -> usize {
        self.t.waiter.me_local
    }
    /// Bytes of one rank's slot.
    pub fn slot_len(&self) -> usize {
        self.seg.layout.chunk
    }
    /// The number the next round will have (the same on every rank).
    pub fn next_gen(&self) -> u64 {
        self.t.direct_gen + 1
    }
    /// Between rounds: let a higher-priority lane have the core (`Transport::give_way`).
    pub fn give_way(&self) {
        self.t.give_way();
    }

    /// Runs one round: writes this rank's `len` bytes (`fill(dst, range)` copies bytes `range`
    /// of them into `dst`) and descriptor, announces the round, and waits by `deadline` until
    /// every rank k announced it with `lens(k)` bytes (this rank's `len`); a rank whose
    /// descriptor differs fails the call, named. With `Via::Slot(place)`, `place + len` must
    /// fit in the slot.
    pub fn round<L: Fn(usize) -> usize>(
        &mut self,
        via: Via,
        len: usize,
        lens: L,
        fill: impl FnMut(&mut [u8], Range<usize>),
        deadline: Instant,
    ) -> Result<Round<'_, 't, L>, LinkError> {
        if let Some(e) = &self.t.broken {
            return Err(e.clone());
        }
        if self.t.mid_round {
            return Err(interrupted(self.t.rank));
        }
        let cap = capacity(via, self.slot_len());
        assert!(len <= cap, "a part of {len} bytes where {cap} fit");
        self.t.direct_gen += 1;
        let gen = self.t.direct_gen;
        // Cleared once the wait is over: a `fill` that panics leaves it set, and the rounds
        // of this transport end there.
        self.t.mid_round = true;
        self.publish(gen, via, len, fill);
        let waited = self.await_round(gen, via, deadline);
        self.t.mid_round = false;
        waited?;
        Ok(Round { rounds: self, gen, via, lens })
    }

    /// Step 1: writes this rank's part and descriptor of round `gen`, announces it, rings.
    fn publish(&self, gen: u64, via: Via, len: usize, mut fill: impl FnMut(&mut [u8], Range<usize>)) {
        let (seg, me) = (&*self.seg, self.local_rank());
        let l = seg.layout;
        let p = (gen % 2) as usize;
        match via {
            Via::Inline => {
                // SAFETY: the data bytes of inline(me, p) are ours to write: every peer finished
                // reading them (Reuse above: this rank's round gen - 1 was awaited, and every
                // peer announced it only after reading gen - 2), and none reads them again
                // before we store `gen` below; `len` fits (checked in `round`).
                let data = unsafe { seg.bytes_mut(l.inline_data(me, p), len) };
                let head = len.min(INLINE_HEAD);
                let (first, rest) = data.split_at_mut(head);
                if !rest.is_empty() {
                    fill(rest, head..len);
                }
                fill(first, 0..head);
                seg.u64_at(l.inline_desc(me, p)).store(self.digest, Ordering::Relaxed);
                seg.u64_at(l.inline(me, p)).store(gen, Ordering::Release);
            }
            Via::Slot(place) => {
                // SAFETY: slot(me, p) is ours to write: every rank finished reading it (Reuse
                // above, as for the inline block), and place + len fits (checked in `round`).
                fill(unsafe { seg.bytes_mut(l.slot(me, p) + place, len) }, 0..len);
                seg.u64_at(l.desc(me, p)).store(self.digest, Ordering::Relaxed);
            }
        }
        // Inline, the store stays in this rank's cache: no peer reads `posted` meanwhile (Inline above).
        seg.u64_at(l.posted(me)).store(gen, Ordering::Release);
        ring_all(seg, me);
    }

    /// Step 2: waits until every rank announced round `gen`, then compares descriptors.
    fn await_round(&mut self, gen: u64, via: Via, deadline: Instant) -> Result<(), LinkError> {
        let seg = &*self.seg;
        let l = seg.layout;
        let (n, p) = (l.ranks, (gen % 2) as usize);
        let announced = |k: usize| match via {
            // Stored after the part and its descriptor (Inline above).
            Via::Inline => seg.u64_at(l.inline(k, p)).load(Ordering::Acquire) >= gen,
            Via::Slot(_) => seg.u64_at(l.posted(k)).load(Ordering::Acquire) >= gen,
        };
        self.t.wait_until(deadline, || (0..n).all(announced), || (0..n).filter(|&k| !announced(k)).collect())?;
        let desc = |k: usize| match via {
            Via::Inline => l.inline_desc(k, p),
            Via::Slot(_) => l.desc(k, p),
        };
        if let Some(k) = (0..n).find(|&k| seg.u64_at(desc(k)).load(Ordering::Relaxed) != self.digest) {
            let e = mismatch(self.t, k);
            return Err(self.t.fail(e));
        }
        Ok(())
    }
}

/// Bytes a part can have: what an inline block holds, or the slot from `place` on.
fn capacity(via: Via, slot: usize) -> usize {
    match via {
        Via::Inline => INLINE_DATA,
        Via::Slot(place) => slot.saturating_sub(place),
    }
}

fn interrupted(rank: usize) -> LinkError {
    let detail = "a shared-segment round of this rank was interrupted (a panic); no later round can run".into();
    LinkError::Io { peer: rank, detail }
}

fn ring_all(seg: &Segment, me: usize) {
    for k in 0..seg.layout.ranks {
        if k != me {
            ring_doorbell(seg, k);
        }
    }
}

/// What local rank `k`, whose descriptor differs from this rank's, called, from its call
/// board. It stays in that call: it waits for this rank's next post, or fails on the same
/// comparison.
#[cold]
fn mismatch(t: &Transport, k: usize) -> LinkError {
    let w = &t.waiter;
    let ((seq, mine), (prev, mine_before)) = (w.calls.now, w.calls.before);
    let detail = match (w.peer_call(k, seq), w.peer_call(k, prev)) {
        (Some(theirs), _) if theirs != mine => {
            format!("in collective call #{seq} it called {theirs}, this rank called {mine}")
        }
        (Some(_), Some(theirs)) if theirs != mine_before => {
            format!("in collective call #{prev} it called {theirs}, this rank called {mine_before}")
        }
        _ => match w.peer_latest(k) {
            Some((at, theirs)) => {
                format!("it is in collective call #{at}, {theirs}, while this rank is in #{seq}, {mine}")
            }
            None => format!("it is in another call than this rank's #{seq}, {mine}"),
        },
    };
    LinkError::Mismatch { peer: k, detail }
}

/// A round every rank has announced: its parts can be read while it lives, and no later
/// round can be published until it is dropped (it borrows the `Rounds`).
pub(crate) struct Round<'r, 't, L> {
    rounds: &'r mut Rounds<'t>,
    gen: u64,
    via: Via,
    /// Each rank's length in this round.
    lens: L,
}

impl<L: Fn(usize) -> usize> Round<'_, '_, L> {
    /// Bytes `range` of rank k's part are within its length, and that length within what
    /// its slot or inline block holds: what every read below relies on.
    fn check(&self, k: usize, range: &Range<usize>) {
        let (len, cap) = ((self.lens)(k), capacity(self.via, self.rounds.slot_len()));
        assert!(range.start <= range.end && range.end <= len && len <= cap, "bytes {range:?} of rank {k}'s {len}");
    }

    /// Copies bytes `range` of rank k's part into `dst`.
    pub fn copy_part(&self, k: usize, range: Range<usize>, dst: &mut [u8]) {
        crate::bytes::copy(dst, self.part(k, range));
    }

    /// Bytes `range` of rank k's part, borrowed from its slot or inline block.
    pub fn part(&self, k: usize, range: Range<usize>) -> &[u8] {
        self.check(k, &range);
        let seg = &*self.rounds.seg;
        let p = (self.gen % 2) as usize;
        let at = match self.via {
            Via::Inline => seg.layout.inline_data(k, p),
            Via::Slot(place) => seg.layout.slot(k, p) + place,
        };
        // SAFETY: rank k wrote its part before it announced gen (its round number in the inline
        // block, or `posted`, Release), which this rank saw (`await_round`, Acquire), and
        // rewrites it only after this rank announces gen + 1, which it cannot while this round,
        // which the slice borrows, lives. The range lies within k's length, and that length
        // within what its block or slot holds (checked above).
        unsafe { seg.bytes(at + range.start, range.len()) }
    }

    /// Every rank's bytes `range`, by segment index, borrowed where they lie.
    pub fn parts(&self, range: Range<usize>) -> Parts<'_> {
        (0..self.rounds.ranks()).map(|k| self.part(k, range.clone())).collect()
    }

    /// Step 3, the large all_reduce's: every rank's parts are `len` bytes of `esize`-byte
    /// elements, split into N shares of whole elements; `reduce(share, parts)` writes this
    /// rank's share of the round's result from the same bytes of every rank's part, by
    /// segment index. Once every rank has written its share, by `deadline`, `read(result)`
    /// gets the whole result. Slot rounds only.
    pub fn share(
        self,
        (len, esize): (usize, usize),
        reduce: impl FnOnce(&mut [u8], &[&[u8]]),
        read: impl FnOnce(&[u8]),
        deadline: Instant,
    ) -> Result<(), LinkError> {
        assert!(matches!(self.via, Via::Slot(_)), "shares are for slot rounds");
        let seg = self.rounds.seg.clone();
        let l = seg.layout;
        let (n, me, p) = (l.ranks, self.rounds.local_rank(), (self.gen % 2) as usize);
        let elems = len / esize.max(1);
        let mine = (elems * me / n) * esize..(elems * (me + 1) / n) * esize;
        assert!(len <= l.chunk && (0..n).all(|k| (self.lens)(k) == len), "a share of parts that differ");
        {
            let parts = self.parts(mine.clone());
            // SAFETY: slice `mine` of result(p) is written only by this rank (every rank's
            // share is its own slice of the same split of `len`, which every rank's part has,
            // as checked above and by the descriptors), and nobody reads it until this rank
            // publishes reduced[me] = gen below; the previous reader of parity p read it before
            // posting gen (Reuse above), which this rank saw.
            reduce(unsafe { seg.bytes_mut(l.result(p) + mine.start, mine.len()) }, &parts);
        }
        let gen = self.gen;
        seg.u64_at(l.reduced(me)).store(gen, Ordering::Release);
        ring_all(&seg, me);
        let all_reduced = || (0..n).all(|k| seg.u64_at(l.reduced(k)).load(Ordering::Acquire) >= gen);
        let not_reduced = || (0..n).filter(|&k| seg.u64_at(l.reduced(k)).load(Ordering::Acquire) < gen).collect();
        self.rounds.t.wait_until(deadline, all_reduced, not_reduced)?;
        // SAFETY: every rank published its slice of result(p) (Acquire above); none rewrites
        // it before all ranks, this one included, post gen + 2, which this one cannot before
        // this round is dropped.
        read(unsafe { seg.bytes(l.result(p), len) });
        Ok(())
    }
}
