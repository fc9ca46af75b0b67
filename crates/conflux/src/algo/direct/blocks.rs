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

use super::{placement, reduce_whole};
use crate::algo::Ctx;
use crate::dtype::{DataType, ReduceOp};
use crate::transport::rounds::Via;
use crate::transport::LinkError;

/// Window `i` of `window` bytes of `block`, cut to the block.
fn window_of(block: &Range<usize>, i: usize, window: usize) -> Range<usize> {
    (block.start + i * window).min(block.end)..(block.start + (i + 1) * window).min(block.end)
}

/// all_gather in place: `buf` holds every rank's block (`blocks`, by rank), this rank's filled.
pub(crate) fn all_gather(cx: &mut Ctx<'_>, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<(), LinkError> {
    let (deadline, rotate) = (cx.s.deadline, !cx.topo.oversubscribed());
    let mut rounds = cx.t.rounds()?;
    let (n, me) = (blocks.len(), rounds.local_rank());
    debug_assert_eq!((me, n), (cx.s.rank, rounds.ranks()));
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    // The slot is a whole number of pages, so a window holds whole elements.
    let window = most.min(rounds.slot_len());
    for i in 0..most.div_ceil(window.max(1)).max(1) {
        let win = |k: usize| window_of(&blocks[k], i, window);
        let via = Via::for_len(most, placement(rounds.next_gen(), window, rounds.slot_len(), rotate));
        let mine = win(me);
        let fill =
            |dst: &mut [u8], r: Range<usize>| dst.copy_from_slice(&buf[mine.start + r.start..mine.start + r.end]);
        let round = rounds.round(via, mine.len(), |k| win(k).len(), fill, deadline)?;
        for k in (0..n).filter(|&k| k != me) {
            let w = win(k);
            round.copy_part(k, 0..w.len(), &mut buf[w]);
        }
        rounds.give_way();
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

/// all_to_all of equal blocks (`blocks`, by rank, the same in `send` and `recv`): block k of
/// `send` goes to rank k, block k of `recv` comes from rank k. This rank's own block is the
/// caller's to copy.
pub(crate) fn all_to_all(
    cx: &mut Ctx<'_>,
    send: &[u8],
    recv: &mut [u8],
    blocks: &[Range<usize>],
) -> Result<(), LinkError> {
    let s = cx.s;
    let block = blocks[0].len();
    let own = s.rank * block;
    // Bytes are only copied, so a window may end anywhere: an element size of 1.
    transposed(cx, Some(send), recv, blocks, 1, |recv, w, parts| {
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
    let (deadline, rotate) = (cx.s.deadline, !cx.topo.oversubscribed());
    let mut rounds = cx.t.rounds()?;
    let (n, me) = (blocks.len(), rounds.local_rank());
    debug_assert_eq!((me, n), (cx.s.rank, rounds.ranks()));
    let most = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    // At least one element: the slot holds 64 bytes a rank or more (`Layout::new`).
    let window = most.min(rounds.slot_len() / n / esize * esize);
    for i in 0..most.div_ceil(window.max(1)).max(1) {
        let win = |b: usize| window_of(&blocks[b], i, window);
        // Block b's window sits at b x window in every rank's part.
        let at = |b: usize| b * window..b * window + win(b).len();
        let len = at(n - 1).end;
        let via = Via::for_len(n * most, placement(rounds.next_gen(), n * window, rounds.slot_len(), rotate));
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
        let round = rounds.round(via, len, |_| len, fill, deadline)?;
        // This rank's own part has the length but not the bytes (its block's window was not
        // written), which `take` does not read.
        let got = round.parts(at(me));
        take(data, win(me), &got);
        rounds.give_way();
    }
    Ok(())
}
