//! The direct algorithm for all_gather and reduce_scatter, in the rounds of `direct` (its
//! protocol, reuse argument and inline blocks are written there).
//!
//! all_gather: in each round every rank publishes a window of its block and copies every other
//! rank's window into place. Each block is written once and read by the N - 1 others, where
//! the ring copies it into and out of a link at each of N - 1 hops.
//!
//! reduce_scatter: in each round every rank publishes the same window of each of its N blocks,
//! side by side at a stride of the window, and reduces window `rank` of every rank's part into
//! its own block, its own part taken from its input rather than its slot.
//!
//! A window is a whole block while the parts fit a slot (an inline block when they are at most
//! `INLINE_DATA` bytes), else as much of it as does. Blocks are a rank's by its rank, parts a
//! rank's by its place in the segment (`Waiter::seg_ranks`).

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
    let me = t.waiter.me_local;
    let ranks = t.waiter.seg_ranks.clone();
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    // The slot is a whole number of pages, so a window holds whole elements.
    let window = if most <= seg.layout.chunk { most } else { seg.layout.chunk };
    let rotate = !t.topo.oversubscribed();
    for i in 0..most.div_ceil(window.max(1)).max(1) {
        let win = |k: usize| window_of(&blocks[ranks[k]], i, window);
        t.direct_gen += 1;
        let gen = t.direct_gen;
        let via = Via::for_len(most, placement(gen, window, seg.layout.chunk, rotate));
        let mine = win(me);
        publish(&seg, me, gen, via, mine.len(), digest, |dst, r| {
            dst.copy_from_slice(&buf[mine.start + r.start..mine.start + r.end]);
        });
        await_round(t, s, &seg, gen, via, |k| win(k).len(), digest)?;
        for k in (0..ranks.len()).filter(|&k| k != me) {
            let w = win(k);
            copy_part(&seg, k, gen, via, 0..w.len(), &mut buf[w]);
        }
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
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let esize = dtype.size();
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
        publish(&seg, me, gen, via, len, digest, |dst, r| {
            for b in 0..n {
                let (lo, hi) = (at(b).start.max(r.start), at(b).end.min(r.end));
                if lo < hi {
                    let from = win(b).start + lo - at(b).start;
                    dst[lo - r.start..hi - r.start].copy_from_slice(&src[from..from + hi - lo]);
                }
            }
        });
        if let Err(e) = await_round(t, s, &seg, gen, via, |_| len, digest) {
            t.staging = scratch;
            return Err(e);
        }
        let mine = at(s.rank);
        if scratch.len() < n * mine.len() {
            scratch.resize(n * mine.len(), 0);
        }
        let parts: Vec<&[u8]> = scratch[..n * mine.len()]
            .chunks_mut(mine.len().max(1))
            .chain(std::iter::repeat_with(|| &mut [][..]))
            .take(n)
            .enumerate()
            .map(|(k, into)| part(&seg, k, gen, via, mine.clone(), into))
            .collect();
        let w = win(s.rank);
        match input {
            Some(i) => {
                let out = &mut buf[w.start - blocks[s.rank].start..w.end - blocks[s.rank].start];
                reduce_whole(&parts, me, Some(&i[w.clone()]), &mut [out], 0, (dtype, op));
            }
            None => reduce_whole(&parts, me, None, &mut [&mut buf[w]], 0, (dtype, op)),
        }
    }
    t.staging = scratch;
    Ok(())
}
