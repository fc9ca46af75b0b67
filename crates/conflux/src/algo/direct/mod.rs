//! The direct shared-segment all_reduce, for communicators whose ranks all share one host;
//! all_gather, reduce_scatter and all_to_all take the same rounds (`blocks.rs`).
//!
//! Every rank copies a chunk of its input into its own slot, each rank reduces one slice of
//! that chunk across all slots into the shared result, and every rank copies the whole result
//! out: one read of each input and one write of each output, with the chunk staying in cache.
//! Small messages skip the slices: each rank reduces the whole chunk itself (one sync, not two).
//!
//! Protocol. A per-communicator counter `gen` numbers chunks, the same on every rank; chunk
//! `gen` uses the slots and result of parity `gen % 2`.
//!  1. Write slot(me, p); store `desc[me][p]` (a digest of the call's and the previous call's
//!     numbers and fingerprints, `Calls::digest`: one word, read in the line this rank reads
//!     anyway; four words cost 8% of an 8-byte all_reduce) and `posted[me] = gen` (Release);
//!     ring every doorbell.
//!  2. Wait until `posted[k] >= gen` for all k (Acquire); check every rank's `desc`. A rank
//!     whose digest differs is described from its call board (`transport/board.rs`).
//!     Small: reduce all slots into the output; done.
//!     Large: reduce slice `me` of all slots into result(p); `reduced[me] = gen`; ring doorbells.
//!  3. Large: wait until `reduced[k] >= gen` for all k; copy result(p) out.
//!
//! Reuse. slot(me, p) is next written at gen + 2, after this rank saw `posted[k] >= gen + 1`
//! for all k in step 2 of gen + 1; a rank posts gen + 1 only after it finished reading the
//! slots of gen. result(p) slice k is next written by rank k at gen + 2 after it saw every
//! rank post gen + 2, which each does only after copying out result(p) of gen. desc has an
//! entry per parity for the same reason: rank k rewrites desc[k][p] only at gen + 2.
//!
//! Placement. A large chunk starts at the start of its slot. A small one (2 KiB and up), when
//! the host has a core per rank, goes to the next of the positions that fit in the slot, the
//! same on every rank (from `gen` and the length). Written at the same place every other
//! call, its lines are still in the peers' L1 from their last read (the likely cost: each
//! store must first invalidate its line there). At 2 ranks that made 2–32 KiB 1.15–1.35x
//! slower than recursive doubling, whose ring buffer moves on; rotating through a window of
//! 128 KiB or more brings it to 0.95–1.05x. With ranks sharing cores the lines are local and
//! the larger footprint only costs (1.7x slower at 512 B against rd, 8 ranks on 2 cores), so
//! it stays put; and below 2 KiB the reuse wins even with a core per rank. all_gather,
//! reduce_scatter and all_to_all rotate their windows whatever their size, with a core per rank (`blocks.rs`;
//! their --report-auto cells at 2 ranks stayed at 0.91 of the best or above). Reuse above
//! covers the whole slot, whatever the position.
//!
//! Inline. A message of at most `INLINE_DATA` (328) bytes travels in rank me's inline block
//! `inline(me, p)`: up to six 64-byte lines, each carrying its own copy of the chunk number
//! beside its data (line 0 also the descriptor). Rank me writes a line's data, then its number
//! (Release); a peer that sees the number in every line the length takes (Acquire) has the
//! data in the lines it just read. A waiting peer loads every line's number on each poll, so
//! the lines travel together as they are written, where the slot path reads `posted` first and
//! the slot and descriptor lines only after it. At 2 ranks, medians of 5 interleaved runs with
//! ranks bound to cores: 64 B 0.62 against 0.81 us, 256 B 0.67 against 0.84; one line (8 B)
//! had taken it from 0.79-0.98 to 0.59. `posted[me] = gen` is stored too, so that the counter
//! larger chunks wait on never falls behind; no peer reads it meanwhile, so the store stays in
//! this rank's cache. Reuse is as for slots: the block of parity p is next written at gen + 2,
//! after every peer announced gen + 1 (in its inline block or `posted`), which it does only
//! after reading this one. A line a shorter call left out keeps an older number, which no peer
//! takes for this call's. Ranks that disagree on the length take different paths, or
//! different lines with different descriptors, and find out from the descriptor or from the
//! call board while they wait.
//!
//! Rounds (`publish`, `await_round`, `part`) are steps 1 and 2 above, inline or through the
//! slots, for any operation whose every rank publishes a part and reads the others'.
//!
//! Every element is reduced over ranks 0..N in that order, so the result is the same bitwise on
//! every rank, and f16/bf16 accumulate in f32 across all ranks before one rounding.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Ctx, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;
use crate::transport::shm::{inline_lines, inline_span, INLINE_DATA};
use crate::transport::wait::ring_doorbell;
use crate::transport::{LinkError, Segment, Transport};

pub(crate) mod blocks;

/// Up to this many bytes per rank, every rank reduces the whole message itself.
const SMALL: usize = 16 << 10;

/// From this many bytes per chunk, small messages on a host with a core per rank rotate
/// through their slots (see Placement above).
const ROTATE_FROM: usize = 2 << 10;

/// Where in its slot chunk `gen` of `len` bytes goes: position `gen / 2` of as many as fit in
/// `slot` bytes when `rotate`, else the start.
pub(super) fn placement(gen: u64, len: usize, slot: usize, rotate: bool) -> usize {
    if !rotate || len < ROTATE_FROM {
        return 0;
    }
    let stride = len.div_ceil(64) * 64;
    ((gen / 2) as usize % (slot / stride).max(1)) * stride
}

fn ring_all(seg: &Segment, me: usize) {
    for k in 0..seg.layout.ranks {
        if k != me {
            ring_doorbell(seg, k);
        }
    }
}

/// Calls `f(span, offset)` for each piece of `parts` (consecutive, as one buffer) that
/// overlaps `range`, with the overlapping part and its offset from `range.start`.
pub(super) fn each_span(parts: &mut [&mut [u8]], range: std::ops::Range<usize>, mut f: impl FnMut(&mut [u8], usize)) {
    let mut base = 0;
    for part in parts.iter_mut() {
        let (lo, hi) = (range.start.max(base), range.end.min(base + part.len()));
        if lo < hi {
            f(&mut part[lo - base..hi - base], lo - range.start);
        }
        base += part.len();
        if base >= range.end {
            break;
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

/// How one rank's bytes of a round travel: in its inline block (Inline above), or at an
/// offset in its slot. Every rank takes the same way in a round.
#[derive(Clone, Copy)]
pub(super) enum Via {
    Inline,
    Slot(usize),
}

impl Via {
    /// Inline when the longest rank's part fits an inline block, else at `place` in the slot.
    pub(super) fn for_len(most: usize, place: usize) -> Via {
        if most <= INLINE_DATA {
            Via::Inline
        } else {
            Via::Slot(place)
        }
    }
}

/// Starts round `gen` for this rank: writes its `len` bytes (`fill(dst, range)` copies bytes
/// `range` of them into `dst`) and its descriptor, then announces `gen` and rings the peers.
///
/// # Safety
/// `gen` is this communicator's next round (`Transport::direct_gen`, counted alike on every
/// rank), and this rank finished round gen - 1: its `await_round` returned Ok and nothing it
/// read through `part` is still in use. Then every peer has finished reading this rank's
/// parity of gen - 2 (Reuse above). With `Via::Slot(place)`, place + len fits in the slot.
pub(super) unsafe fn publish(
    seg: &Segment,
    me: usize,
    gen: u64,
    via: Via,
    len: usize,
    digest: u64,
    mut fill: impl FnMut(&mut [u8], Range<usize>),
) {
    let l = seg.layout;
    let p = (gen % 2) as usize;
    match via {
        Via::Inline => {
            for j in (0..inline_lines(len)).rev() {
                let span = inline_span(j, len);
                // SAFETY: the data bytes of line j of inline(me, p) are ours to write: every
                // peer finished reading them (this function's contract), and none reads them
                // again before we store `gen` in that line below.
                fill(unsafe { seg.bytes_mut(l.inline_data(me, p, j), span.len()) }, span);
                if j == 0 {
                    seg.u64_at(l.inline_desc(me, p)).store(digest, Ordering::Relaxed);
                }
                seg.u64_at(l.inline_gen(me, p, j)).store(gen, Ordering::Release);
            }
        }
        Via::Slot(place) => {
            debug_assert!(place + len <= l.chunk);
            // SAFETY: slot(me, p) is ours to write: every rank finished reading it, and
            // place + len fits (this function's contract).
            fill(unsafe { seg.bytes_mut(l.slot(me, p) + place, len) }, 0..len);
            seg.u64_at(l.desc(me, p)).store(digest, Ordering::Relaxed);
        }
    }
    // Inline, the store stays in this rank's cache: no peer reads `posted` meanwhile (Inline above).
    seg.u64_at(l.posted(me)).store(gen, Ordering::Release);
    ring_all(seg, me);
}

/// Waits until every rank announced round `gen` (rank k with `len(k)` bytes), then compares
/// their descriptors with `digest`: a rank that differs fails the call, named.
pub(super) fn await_round(
    t: &mut Transport,
    s: &Step,
    seg: &Segment,
    gen: u64,
    via: Via,
    len: impl Fn(usize) -> usize,
    digest: u64,
) -> Result<(), LinkError> {
    let l = seg.layout;
    let (n, p) = (l.ranks, (gen % 2) as usize);
    let announced = |k: usize| match via {
        Via::Inline => (0..inline_lines(len(k)))
            .fold(true, |all, j| all & (seg.u64_at(l.inline_gen(k, p, j)).load(Ordering::Acquire) >= gen)),
        Via::Slot(_) => seg.u64_at(l.posted(k)).load(Ordering::Acquire) >= gen,
    };
    t.wait_until(s.deadline, || (0..n).all(announced), || (0..n).filter(|&k| !announced(k)).collect())?;
    let desc = |k: usize| match via {
        Via::Inline => l.inline_desc(k, p),
        Via::Slot(_) => l.desc(k, p),
    };
    if let Some(k) = (0..n).find(|&k| seg.u64_at(desc(k)).load(Ordering::Relaxed) != digest) {
        let e = mismatch(t, k);
        return Err(t.fail(e));
    }
    Ok(())
}

/// Copies bytes `range` of rank k's part of round `gen` into `dst`.
///
/// # Safety
/// This rank's `await_round` for `gen` returned Ok, with rank k's length at least `range.end`,
/// and this rank has not published gen + 1 since: until it does, k does not rewrite its part
/// (Reuse above).
pub(super) unsafe fn copy_part(seg: &Segment, k: usize, gen: u64, via: Via, range: Range<usize>, dst: &mut [u8]) {
    let l = seg.layout;
    let p = (gen % 2) as usize;
    match via {
        Via::Inline => {
            for j in 0..inline_lines(range.end) {
                let span = inline_span(j, range.end);
                let (lo, hi) = (span.start.max(range.start), span.end);
                if lo < hi {
                    let from = l.inline_data(k, p, j) + (lo - span.start);
                    // SAFETY: rank k stored `gen` in line j after writing its data bytes, and
                    // this rank saw it (`await_round`, Acquire: line j is within k's length);
                    // k rewrites them only after this rank announces gen + 1, which it has not.
                    dst[lo - range.start..hi - range.start].copy_from_slice(unsafe { seg.bytes(from, hi - lo) });
                }
            }
        }
        // SAFETY: this function's contract is `part`'s, and the slice is gone when it returns.
        Via::Slot(_) => dst.copy_from_slice(unsafe { part(seg, k, gen, via, range, &mut []) }),
    }
}

/// Bytes `range` of rank k's part of round `gen`: borrowed from its slot, or gathered from its
/// inline lines into `into`.
///
/// # Safety
/// As `copy_part`'s, and the slice returned is dropped before this rank publishes gen + 1.
pub(super) unsafe fn part<'a>(
    seg: &'a Segment,
    k: usize,
    gen: u64,
    via: Via,
    range: Range<usize>,
    into: &'a mut [u8],
) -> &'a [u8] {
    match via {
        Via::Inline => {
            let into = &mut into[..range.len()];
            // SAFETY: this function's contract is `copy_part`'s.
            unsafe { copy_part(seg, k, gen, via, range, into) };
            into
        }
        // SAFETY: rank k posted gen (`await_round`, Acquire) after writing its slot, and
        // rewrites it only after this rank posts gen + 1, which the caller does only once it
        // has dropped this slice (this function's contract).
        Via::Slot(place) => unsafe {
            seg.bytes(seg.layout.slot(k, (gen % 2) as usize) + place + range.start, range.len())
        },
    }
}

/// Every rank's bytes `range` of round `gen`, by local rank: borrowed from the slots, or
/// gathered from the inline lines into `scratch` (grown as needed). Inline, this rank's own
/// part is not copied: only its length counts, since callers take their own bytes from
/// their input (`reduce_whole`) or skip them.
///
/// # Safety
/// As `part`'s, for every rank k but this one.
pub(super) unsafe fn parts<'a>(
    seg: &'a Segment,
    me: usize,
    gen: u64,
    via: Via,
    range: Range<usize>,
    scratch: &'a mut Vec<u8>,
) -> Vec<&'a [u8]> {
    let n = seg.layout.ranks;
    let gather = if matches!(via, Via::Inline) { range.len() } else { 0 };
    if scratch.len() < n * gather {
        scratch.resize(n * gather, 0);
    }
    let mut into = scratch[..n * gather].chunks_mut(gather.max(1)).chain(std::iter::repeat_with(|| &mut [][..]));
    (0..n)
        .map(|k| match (into.next().unwrap_or_default(), via) {
            (own, Via::Inline) if k == me => &*own,
            // SAFETY: this function's contract is `part`'s.
            (into, _) => unsafe { part(seg, k, gen, via, range.clone(), into) },
        })
        .collect()
}

/// What every direct operation starts from: the segment, and the digest of this call and the
/// one before (`Calls::digest`) that every rank's must equal. A transport that failed already
/// writes nothing more: a peer still in the failed call could read it as that call's data.
pub(super) fn start(t: &Transport) -> Result<(Arc<Segment>, u64), LinkError> {
    if let Some(e) = &t.broken {
        return Err(e.clone());
    }
    let seg = t.waiter.seg.clone().expect("direct algorithm needs a segment");
    Ok((seg, t.waiter.calls.digest()))
}

/// all_reduce of `input` (or `out` itself, in place) into `out`: consecutive pieces that
/// form one buffer, so that many tensors reduce as one message without first being copied
/// together. `input`
/// is given only with a single piece. Avg is left as a sum.
pub(crate) fn all_reduce(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [&mut [u8]],
    (dtype, op): (DataType, ReduceOp),
) -> Result<(), LinkError> {
    debug_assert!(input.is_none() || out.len() == 1);
    // Every rank's call, and the one before, must be this rank's (see transport/fingerprint.rs).
    let (seg, digest) = start(cx.t)?;
    let total: usize = out.iter().map(|p| p.len()).sum();
    if total <= INLINE_DATA {
        return all_reduce_inline(cx, &seg, input, out, (dtype, op), digest);
    }
    let (t, s) = (&mut *cx.t, &cx.s);
    let l = seg.layout;
    let (n, me) = (l.ranks, t.waiter.me_local);
    let esize = dtype.size();
    let chunk = l.chunk / (esize * n) * (esize * n);
    let mut at = 0;
    loop {
        let len = (total - at).min(chunk);
        t.direct_gen += 1;
        let gen = t.direct_gen;
        let p = (gen % 2) as usize;
        let small = total / n <= SMALL || len <= SMALL;
        let place = placement(gen, len, l.chunk, small && !cx.topo.oversubscribed());
        let fill = |dst: &mut [u8], r: Range<usize>| match input {
            Some(i) => dst.copy_from_slice(&i[at + r.start..at + r.end]),
            None => {
                each_span(out, at + r.start..at + r.end, |span, off| dst[off..off + span.len()].copy_from_slice(span))
            }
        };
        // SAFETY: gen is the next round; every round before it ended in an `await_round` that
        // returned Ok (an error ends the call, and `start` refuses the next one), and its parts
        // were dropped with its iteration or call. placement keeps place + len in the slot.
        unsafe { publish(&seg, me, gen, Via::Slot(place), len, digest, fill) };
        await_round(t, s, &seg, gen, Via::Slot(place), |_| len, digest)?;
        // SAFETY: round gen was awaited with every rank's length `len`; the slices go with this
        // iteration, before the next publish.
        let slots: Vec<&[u8]> =
            (0..n).map(|k| unsafe { part(&seg, k, gen, Via::Slot(place), 0..len, &mut []) }).collect();
        if small {
            reduce_whole(&slots, me, input, out, at, (dtype, op));
        } else {
            let elems = len / esize;
            let mine = (elems * me / n) * esize..(elems * (me + 1) / n) * esize;
            let parts: Vec<&[u8]> = slots.iter().map(|sl| &sl[mine.clone()]).collect();
            // SAFETY: slice `me` of result(p) is written only by this rank, and nobody reads it
            // until this rank publishes reduced[me] = gen.
            let res = unsafe { seg.bytes_mut(l.result(p) + mine.start, mine.len()) };
            reduce::reduce_many(dtype, op, res, &parts);
            seg.u64_at(l.reduced(me)).store(gen, Ordering::Release);
            ring_all(&seg, me);
            let all_reduced = || (0..n).all(|k| seg.u64_at(l.reduced(k)).load(Ordering::Acquire) >= gen);
            let not_reduced = || (0..n).filter(|&k| seg.u64_at(l.reduced(k)).load(Ordering::Acquire) < gen).collect();
            t.wait_until(s.deadline, all_reduced, not_reduced)?;
            // SAFETY: every rank published its slice of result(p); none rewrites it before all
            // ranks (this one included) post gen + 2.
            let result = unsafe { seg.bytes(l.result(p), len) };
            each_span(out, at..at + len, |span, off| span.copy_from_slice(&result[off..off + span.len()]));
        }
        at += len;
        if at >= total {
            return Ok(());
        }
        t.give_way();
    }
}

/// Reduces every rank's copy of bytes `at..at + slots[k].len()` of the message (`slots`, by
/// local rank) into `out`.
pub(super) fn reduce_whole(
    slots: &[&[u8]],
    me: usize,
    input: Option<&[u8]>,
    out: &mut [&mut [u8]],
    at: usize,
    (dtype, op): (DataType, ReduceOp),
) {
    let len = slots[me].len();
    each_span(out, at..at + len, |span, off| {
        let mut parts: Vec<&[u8]> = slots.iter().map(|sl| &sl[off..off + span.len()]).collect();
        // This rank's own part comes from its private buffer (its input, or in place the
        // output itself), not its slot, whose lines every peer is reading at the same moment:
        // read here too, they cost as much as a peer's (bf16 at 2 ranks: the reduction took
        // 1.4x longer). Same bytes in the same order, same result.
        match input {
            Some(i) => {
                parts[me] = &i[at + off..at + off + span.len()];
                reduce::reduce_many(dtype, op, span, &parts);
            }
            None => {
                parts.remove(me);
                reduce::reduce_many_with_dst(dtype, op, span, me, &parts);
            }
        }
    });
}

/// The whole all_reduce of at most `INLINE_DATA` bytes, through the inline blocks (Inline above).
fn all_reduce_inline(
    cx: &mut Ctx<'_>,
    seg: &Segment,
    input: Option<&[u8]>,
    out: &mut [&mut [u8]],
    kind: (DataType, ReduceOp),
    digest: u64,
) -> Result<(), LinkError> {
    let (t, s) = (&mut *cx.t, &cx.s);
    let me = t.waiter.me_local;
    let len: usize = out.iter().map(|p| p.len()).sum();
    t.direct_gen += 1;
    let gen = t.direct_gen;
    let fill = |dst: &mut [u8], r: Range<usize>| match input {
        Some(i) => dst.copy_from_slice(&i[r]),
        None => each_span(out, r, |span, off| dst[off..off + span.len()].copy_from_slice(span)),
    };
    // SAFETY: as in `all_reduce`'s loop: the next round, after rounds that all ended awaited.
    unsafe { publish(seg, me, gen, Via::Inline, len, digest, fill) };
    await_round(t, s, seg, gen, Via::Inline, |_| len, digest)?;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: round gen was awaited with every rank's length `len`; the slices are gone when
    // this call returns.
    let slots = unsafe { parts(seg, me, gen, Via::Inline, 0..len, cx.staging) };
    reduce_whole(&slots, me, input, out, 0, kind);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{placement, ROTATE_FROM};

    #[test]
    fn placements_stay_in_the_slot_aligned_and_move_on() {
        let slot = 256 << 10;
        for len in (ROTATE_FROM..=slot).step_by(4093).chain([ROTATE_FROM, slot - 1, slot]) {
            for gen in 0..600u64 {
                let at = placement(gen, len, slot, true);
                assert!(at.is_multiple_of(64) && at + len <= slot, "len {len} gen {gen}: at {at}");
                // The same parity's next chunk goes elsewhere whenever two positions fit.
                if slot / len.div_ceil(64) / 64 >= 2 {
                    assert_ne!(at, placement(gen + 2, len, slot, true), "len {len} gen {gen}");
                }
            }
        }
        for gen in 0..8 {
            assert_eq!(placement(gen, 64 << 10, slot, false), 0);
            assert_eq!(placement(gen, ROTATE_FROM - 1, slot, true), 0);
        }
    }
}
