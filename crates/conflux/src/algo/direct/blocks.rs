//! The direct algorithm for all_gather and reduce_scatter, in the rounds of `direct` (its
//! protocol, reuse argument and inline blocks are written there).
//!
//! all_gather: in each round every rank publishes a window of its block and copies every other
//! rank's window into place. Each block is written once and read by the N - 1 others, where
//! the ring copies it into and out of a link at each of N - 1 hops.
//!
//! reduce_scatter: in each round every rank publishes the same window of each of its N blocks
//! but its own, side by side at a stride of the window, and reduces window `rank` of every
//! rank's part into its own block, its own part taken from its input rather than its slot.
//!
//! A window is a whole block while the parts fit a slot (an inline block when they are at most
//! `INLINE_DATA` bytes), else as much of it as does. Blocks are numbered by rank and parts by
//! place in the segment; the two agree, since the direct algorithm serves only when every
//! rank maps the one segment, where they sit in rank order (`comm/bootstrap.rs`).

use std::ops::Range;

use super::{await_round, copy_part, part, placement, publish, reduce_whole, start, Via};
use crate::algo::Step;
use crate::dtype::{DataType, ReduceOp};
use crate::transport::{LinkError, Transport};

/// Window `i` of `window` bytes of `block`, cut to the block.
fn window_of(block: &Range<usize>, i: usize, window: usize) -> Range<usize> {
    (block.start + i * window).min(block.end)..(block.start + (i + 1) * window).min(block.end)
}

/// all_gather in place: `buf` holds every rank's block (`blocks`, by rank), this rank's filled.
pub(crate) fn all_gather(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    blocks: &[Range<usize>],
) -> Result<(), LinkError> {
    let (seg, digest) = start(t)?;
    let (n, me) = (blocks.len(), t.waiter.me_local);
    debug_assert_eq!((me, n), (s.rank, seg.layout.ranks));
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    // The slot is a whole number of pages, so a window holds whole elements.
    let window = most.min(seg.layout.chunk);
    let rotate = !t.topo.oversubscribed();
    for i in 0..most.div_ceil(window.max(1)).max(1) {
        let win = |k: usize| window_of(&blocks[k], i, window);
        t.direct_gen += 1;
        let gen = t.direct_gen;
        let via = Via::for_len(most, placement(gen, window, seg.layout.chunk, rotate));
        let mine = win(me);
        let fill =
            |dst: &mut [u8], r: Range<usize>| dst.copy_from_slice(&buf[mine.start + r.start..mine.start + r.end]);
        // SAFETY: gen is the next round; every round before it ended in an `await_round` that
        // returned Ok (an error ends the call, and `start` refuses the next one), with its
        // reads done. placement keeps place + window, at least this part, in the slot.
        unsafe { publish(&seg, me, gen, via, mine.len(), digest, fill) };
        await_round(t, s, &seg, gen, via, |k| win(k).len(), digest)?;
        for k in (0..n).filter(|&k| k != me) {
            let w = win(k);
            // SAFETY: round gen was awaited with rank k's length w.len(); nothing is published
            // until the copy is done.
            unsafe { copy_part(&seg, k, gen, via, 0..w.len(), &mut buf[w]) };
        }
        t.give_way();
    }
    Ok(())
}

/// reduce_scatter of `input` (every rank's block, `blocks`), or in place of `buf`, into this
/// rank's block: `buf` itself with `input`, else its block of `buf`. Avg is left as a sum.
pub(crate) fn reduce_scatter(
    t: &mut Transport,
    s: &Step,
    input: Option<&[u8]>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let (seg, digest) = start(t)?;
    let (n, me) = (blocks.len(), t.waiter.me_local);
    debug_assert_eq!((me, n), (s.rank, seg.layout.ranks));
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let esize = dtype.size();
    // At least one element: the slot holds 64 bytes a rank or more (`Layout::new`).
    let window = most.min(seg.layout.chunk / n / esize * esize);
    let rotate = !t.topo.oversubscribed();
    let mut scratch = std::mem::take(&mut t.staging);
    for i in 0..most.div_ceil(window.max(1)).max(1) {
        let win = |b: usize| window_of(&blocks[b], i, window);
        // Block b's window sits at b x window in every rank's part.
        let at = |b: usize| b * window..b * window + win(b).len();
        let len = at(n - 1).end;
        t.direct_gen += 1;
        let gen = t.direct_gen;
        let via = Via::for_len(n * most, placement(gen, n * window, seg.layout.chunk, rotate));
        let src: &[u8] = input.unwrap_or(buf);
        // Its own block's window no peer reads: left unwritten.
        let fill = |dst: &mut [u8], r: Range<usize>| {
            for b in (0..n).filter(|&b| b != me) {
                let (lo, hi) = (at(b).start.max(r.start), at(b).end.min(r.end));
                if lo < hi {
                    let from = win(b).start + lo - at(b).start;
                    dst[lo - r.start..hi - r.start].copy_from_slice(&src[from..from + hi - lo]);
                }
            }
        };
        // SAFETY: as in `all_gather`: the next round, after rounds that all ended awaited and
        // read; placement keeps place + n x window, at least len, in the slot.
        unsafe { publish(&seg, me, gen, via, len, digest, fill) };
        if let Err(e) = await_round(t, s, &seg, gen, via, |_| len, digest) {
            t.staging = scratch;
            return Err(e);
        }
        let mine = at(me);
        // Inline parts are gathered into one buffer per rank; slot parts are read in place.
        let gather = if matches!(via, Via::Inline) { mine.len() } else { 0 };
        if scratch.len() < n * gather {
            scratch.resize(n * gather, 0);
        }
        let mut into = scratch[..n * gather].chunks_mut(gather.max(1)).chain(std::iter::repeat_with(|| &mut [][..]));
        // SAFETY: round gen was awaited with every rank's length len, which `mine` is within;
        // the slices go with this iteration, before the next publish.
        let parts: Vec<&[u8]> =
            (0..n).map(|k| unsafe { part(&seg, k, gen, via, mine.clone(), into.next().unwrap_or_default()) }).collect();
        let w = win(me);
        match input {
            Some(i) => {
                let out = &mut buf[w.start - blocks[me].start..w.end - blocks[me].start];
                reduce_whole(&parts, me, Some(&i[w.clone()]), &mut [out], 0, (dtype, op));
            }
            None => reduce_whole(&parts, me, None, &mut [&mut buf[w]], 0, (dtype, op)),
        }
        t.give_way();
    }
    t.staging = scratch;
    Ok(())
}
