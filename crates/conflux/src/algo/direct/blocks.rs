//! The direct algorithm for all_gather, reduce_scatter and all_to_all, in the rounds of `direct` (its
//! protocol, reuse argument and inline blocks are written there).
//!
//! all_gather: in each round every rank publishes a window of its block and copies every other
//! rank's window into place. Each block is written once and read by the N - 1 others, where
//! the ring copies it into and out of a link at each of N - 1 hops.
//!
//! reduce_scatter: in each round every rank publishes the same window of each of its N blocks
//! but its own, side by side at a stride of the window, and reduces window `rank` of every
//! rank's part into its own block, its own part taken from its input rather than its slot.
//! all_to_all (equal blocks) is the same transpose with copies for the reduction.
//!
//! A window is a whole block while the parts fit a slot (an inline block when they are at most
//! `INLINE_DATA` bytes), else as much of it as does. Blocks are numbered by rank and parts by
//! place in the segment; the two agree, since the direct algorithm serves only when every
//! rank maps the one segment, where they sit in rank order (`comm/bootstrap.rs`).

use std::ops::Range;

use super::{await_round, copy_part, parts, placement, publish, reduce_whole, start, Via};
use crate::algo::Ctx;
use crate::dtype::{DataType, ReduceOp};
use crate::transport::LinkError;

/// Window `i` of `window` bytes of `block`, cut to the block.
fn window_of(block: &Range<usize>, i: usize, window: usize) -> Range<usize> {
    (block.start + i * window).min(block.end)..(block.start + (i + 1) * window).min(block.end)
}

/// all_gather in place: `buf` holds every rank's block (`blocks`, by rank), this rank's filled.
pub(crate) fn all_gather(cx: &mut Ctx<'_>, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<(), LinkError> {
    let (t, s) = (&mut *cx.t, &cx.s);
    let (seg, digest) = start(t)?;
    let (n, me) = (blocks.len(), t.waiter.me_local);
    debug_assert_eq!((me, n), (s.rank, seg.layout.ranks));
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    // The slot is a whole number of pages, so a window holds whole elements.
    let window = most.min(seg.layout.chunk);
    let rotate = !cx.topo.oversubscribed();
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
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    (dtype, op): (DataType, ReduceOp),
) -> Result<(), LinkError> {
    let (me, own) = (cx.s.rank, blocks[cx.s.rank].start);
    transposed(cx, input, buf, blocks, dtype.size(), |buf, w, parts| match input {
        Some(i) => {
            reduce_whole(parts, me, Some(&i[w.clone()]), &mut [&mut buf[w.start - own..w.end - own]], 0, (dtype, op))
        }
        None => reduce_whole(parts, me, None, &mut [&mut buf[w]], 0, (dtype, op)),
    })
}

/// all_to_all of blocks of `block` bytes: block k of `send` goes to rank k, block k of `recv`
/// comes from rank k. This rank's own block is the caller's to copy.
pub(crate) fn all_to_all(cx: &mut Ctx<'_>, send: &[u8], recv: &mut [u8], block: usize) -> Result<(), LinkError> {
    let s = cx.s;
    let blocks: Vec<Range<usize>> = (0..s.size).map(|k| k * block..(k + 1) * block).collect();
    let own = s.rank * block;
    // Bytes are only copied, so a window may end anywhere: an element size of 1.
    transposed(cx, Some(send), recv, &blocks, 1, |recv, w, parts| {
        for (k, got) in parts.iter().enumerate().filter(|&(k, _)| k != s.rank) {
            let at = k * block + w.start - own;
            recv[at..at + got.len()].copy_from_slice(got);
        }
    })
}

/// The rounds reduce_scatter and all_to_all share, a transpose: in round i every rank
/// publishes window i of each of its blocks (`blocks` of `input`, or of `data` in place) but
/// its own, side by side at a stride of the window; then `take(data, w, parts)` gets window `w`
/// of this rank's block from every rank's part, by rank (this rank's own part has the length
/// but not the bytes). Windows hold whole elements of `esize` bytes.
fn transposed(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    data: &mut [u8],
    blocks: &[Range<usize>],
    esize: usize,
    mut take: impl FnMut(&mut [u8], Range<usize>, &[&[u8]]),
) -> Result<(), LinkError> {
    let (t, s, scratch) = (&mut *cx.t, &cx.s, &mut *cx.staging);
    let (seg, digest) = start(t)?;
    let (n, me) = (blocks.len(), t.waiter.me_local);
    debug_assert_eq!((me, n), (s.rank, seg.layout.ranks));
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    // At least one element: the slot holds 64 bytes a rank or more (`Layout::new`).
    let window = most.min(seg.layout.chunk / n / esize * esize);
    let rotate = !cx.topo.oversubscribed();
    for i in 0..most.div_ceil(window.max(1)).max(1) {
        let win = |b: usize| window_of(&blocks[b], i, window);
        // Block b's window sits at b x window in every rank's part.
        let at = |b: usize| b * window..b * window + win(b).len();
        let len = at(n - 1).end;
        t.direct_gen += 1;
        let gen = t.direct_gen;
        let via = Via::for_len(n * most, placement(gen, n * window, seg.layout.chunk, rotate));
        let src: &[u8] = input.unwrap_or(data);
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
        await_round(t, s, &seg, gen, via, |_| len, digest)?;
        // This rank's own part has the length but not the bytes (its block was not written),
        // which `take` does not read.
        // SAFETY: round gen was awaited with every rank's length len, which `at(me)` is within;
        // the slices go with this iteration, before the next publish.
        let got = unsafe { parts(&seg, me, gen, via, at(me), scratch) };
        take(data, win(me), &got);
        t.give_way();
    }
    Ok(())
}
