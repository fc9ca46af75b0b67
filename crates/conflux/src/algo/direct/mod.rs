//! The direct shared-segment all_reduce, for communicators whose ranks all share one host;
//! all_gather, reduce_scatter and all_to_all take the same rounds (`blocks.rs`).
//!
//! Every rank copies a chunk of its input into its own slot, each rank reduces one slice of
//! that chunk across all slots into the shared result, and every rank copies the whole result
//! out: one read of each input and one write of each output, with the chunk staying in cache.
//! Small messages skip the slices: each rank reduces the whole chunk itself (one sync, not two).
//!
//! The rounds themselves (publish a part, wait for every rank's, read theirs; the protocol,
//! its reuse argument and the inline blocks) are the transport's, `transport/rounds.rs`: this
//! module decides what goes in them and where.
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
//! their --report-auto cells at 2 ranks stayed at 0.91 of the best or above). The reuse argument
//! covers the whole slot, whatever the position (`transport/rounds.rs`).
//!
//! Every element is reduced over ranks 0..N in that order, so the result is the same bitwise on
//! every rank, and f16/bf16 accumulate in f32 across all ranks before one rounding.

use std::ops::Range;

use super::Ctx;
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;
use crate::transport::rounds::Via;
use crate::transport::shm::INLINE_DATA;
use crate::transport::{LinkError, Parts};

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

/// all_reduce of `input` (or `out` itself, in place) into `out`: consecutive pieces that
/// form one buffer, so that many tensors reduce as one message without first being copied
/// together. `input` is given only with a single piece. Avg is left as a sum.
pub(crate) fn all_reduce(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [&mut [u8]],
    (dtype, op): (DataType, ReduceOp),
) -> Result<(), LinkError> {
    debug_assert!(input.is_none() || out.len() == 1);
    let total: usize = out.iter().map(|p| p.len()).sum();
    let deadline = cx.s.deadline;
    let rotate = !cx.topo.oversubscribed();
    // Every rank's call, and the one before, must be this rank's (see call/fingerprint.rs).
    let mut rounds = cx.t.rounds()?;
    let (n, me) = (rounds.ranks(), rounds.local_rank());
    if total <= INLINE_DATA {
        let fill = |dst: &mut [u8], r: Range<usize>| match input {
            Some(i) => crate::bytes::copy(dst, &i[r]),
            None => each_span(out, r, |span, off| crate::bytes::copy(&mut dst[off..off + span.len()], span)),
        };
        let round = rounds.round(Via::Inline, total, |_| total, fill, deadline)?;
        if total > 0 {
            let slots = round.parts(0..total);
            reduce_whole(&slots, me, input, out, 0, (dtype, op));
        }
        return Ok(());
    }
    let esize = dtype.size();
    let chunk = rounds.slot_len() / (esize * n) * (esize * n);
    let mut at = 0;
    loop {
        let len = (total - at).min(chunk);
        let small = total / n <= SMALL || len <= SMALL;
        let place = placement(rounds.next_gen(), len, rounds.slot_len(), small && rotate);
        let fill = |dst: &mut [u8], r: Range<usize>| match input {
            Some(i) => dst.copy_from_slice(&i[at + r.start..at + r.end]),
            None => {
                each_span(out, at + r.start..at + r.end, |span, off| dst[off..off + span.len()].copy_from_slice(span))
            }
        };
        let round = rounds.round(Via::Slot(place), len, |_| len, fill, deadline)?;
        if small {
            let slots = round.parts(0..len);
            reduce_whole(&slots, me, input, out, at, (dtype, op));
        } else {
            let reduce = |res: &mut [u8], parts: &[&[u8]]| reduce::reduce_many(dtype, op, res, parts);
            let read = |result: &[u8]| {
                each_span(out, at..at + len, |span, off| span.copy_from_slice(&result[off..off + span.len()]))
            };
            round.share((len, esize), reduce, read, deadline)?;
        }
        at += len;
        if at >= total {
            return Ok(());
        }
        rounds.give_way();
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
        let bytes = off..off + span.len();
        let part = |k: usize| &slots[k][bytes.clone()];
        // This rank's own part comes from its private buffer (its input, or in place the
        // output itself), not its slot, whose lines every peer is reading at the same moment:
        // read here too, they cost as much as a peer's (bf16 at 2 ranks: the reduction took
        // 1.4x longer). Same bytes in the same order, same result.
        match input {
            Some(i) => {
                let mut parts: Parts<'_> = (0..slots.len()).map(part).collect();
                parts[me] = &i[at + off..at + off + span.len()];
                reduce::reduce_many(dtype, op, span, &parts);
            }
            None => {
                let others: Parts<'_> = (0..slots.len()).filter(|&k| k != me).map(part).collect();
                reduce::reduce_many_with_dst(dtype, op, span, me, &others);
            }
        }
    });
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
