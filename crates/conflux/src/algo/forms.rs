//! The forms a call's buffers take on their way into a schedule, shared by the table's rows:
//! a reduce's working buffer on the ranks that are not its root (a copy, or scratch for a
//! schedule that reads the data where it is), a reduce_scatter's staged input, a coalesced
//! all_reduce's small pieces packed into one message, and Avg's final division.

use std::ops::Range;

use super::{even_blocks, ring, Circle, Ctx};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;
use crate::transport::LinkError;

/// Runs `f` on `srcs`, concatenated into the lane's staging buffer, whose pages stay faulted
/// in from call to call (a fresh copy of a large message faults in every page: 5x the time of
/// a 512 KiB reduce at 2 ranks). The buffer keeps what `f` left until the next call.
fn in_staging<'s, R>(
    cx: &mut Ctx<'_>,
    srcs: impl IntoIterator<Item = &'s [u8]>,
    f: impl FnOnce(&mut Ctx<'_>, &mut [u8]) -> R,
) -> R {
    let mut work = std::mem::take(cx.staging);
    work.clear();
    srcs.into_iter().for_each(|src| work.extend_from_slice(src));
    let r = f(cx, &mut work);
    *cx.staging = work;
    r
}

/// A reduce's working buffer: the root reduces in `buf` (filled from `input` first), the other
/// ranks in a staged copy, leaving their buffers as they were.
pub(crate) fn on_reduce_buffer(
    cx: &mut Ctx<'_>,
    root: usize,
    input: Option<&[u8]>,
    buf: &mut [u8],
    f: impl FnOnce(&mut Ctx<'_>, &mut [u8]) -> Result<(), LinkError>,
) -> Result<(), LinkError> {
    if cx.s.rank != root {
        return in_staging(cx, [input.unwrap_or(buf)], f);
    }
    if let Some(i) = input {
        buf.copy_from_slice(i);
    }
    f(cx, buf)
}

/// A reduce's buffers for a schedule that combines this rank's data with the first data it
/// receives, with no copy first (`f(cx, work, src)`, `src` None: the data is in `work`): the
/// root works in `buf`, reading `input` where it is; the other ranks read their data where it
/// is and work in the lane's staging buffer, its contents left over, leaving `buf` as it was.
pub(crate) fn on_reduce_scratch(
    cx: &mut Ctx<'_>,
    root: usize,
    input: Option<&[u8]>,
    buf: &mut [u8],
    f: impl FnOnce(&mut Ctx<'_>, &mut [u8], Option<&[u8]>) -> Result<(), LinkError>,
) -> Result<(), LinkError> {
    if cx.s.rank == root {
        return f(cx, buf, input);
    }
    let len = buf.len();
    on_scratch(cx, len, |cx, work| f(cx, work, Some(input.unwrap_or(buf))))
}

/// Runs `f` on `len` bytes of the lane's staging buffer as scratch: their contents are left
/// over from earlier calls, and its pages stay faulted in (see `in_staging`).
pub(crate) fn on_scratch<R>(cx: &mut Ctx<'_>, len: usize, f: impl FnOnce(&mut Ctx<'_>, &mut [u8]) -> R) -> R {
    let mut work = std::mem::take(cx.staging);
    if work.len() < len {
        work.resize(len, 0);
    }
    let r = f(cx, &mut work[..len]);
    *cx.staging = work;
    r
}

/// A reduce_scatter's working buffer: `buf` itself in place, or a staged copy of `input`
/// whose block `rank` lands in `buf`. Returns this rank's reduced block.
pub(crate) fn on_scatter_buffer<'b>(
    cx: &mut Ctx<'_>,
    blocks: &[Range<usize>],
    input: Option<&[u8]>,
    buf: &'b mut [u8],
    f: impl FnOnce(&mut Ctx<'_>, &mut [u8]) -> Result<(), LinkError>,
) -> Result<&'b mut [u8], LinkError> {
    let mine = blocks[cx.s.rank].clone();
    match input {
        None => {
            f(cx, buf)?;
            Ok(&mut buf[mine])
        }
        Some(i) => {
            in_staging(cx, [i], |cx, work| {
                f(cx, work)?;
                buf.copy_from_slice(&work[mine]);
                Ok(())
            })?;
            Ok(buf)
        }
    }
}

/// Pieces at least this large are reduced where they are; runs of smaller ones are staged
/// together up to this size, which keeps the staging buffer in cache and the copies small.
const STAGE: usize = 1 << 20;

/// The ring over a buffer in pieces: it needs contiguous memory, so large pieces (and a small
/// one with no small neighbour) go one by one, in place, and runs of small neighbours are
/// packed into one staged message. Every rank derives the same sequence of messages from the
/// same lengths.
pub(crate) fn ring_pieces(
    cx: &mut Ctx<'_>,
    out: &mut [&mut [u8]],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let (n, esize) = (cx.s.size, dtype.size());
    let mut i = 0;
    while i < out.len() {
        let (start, mut bytes) = (i, 0);
        while i < out.len() && out[i].len() < STAGE && bytes + out[i].len() <= STAGE {
            bytes += out[i].len();
            i += 1;
        }
        if i - start <= 1 {
            i = start + 1;
            let blocks = even_blocks(out[start].len() / esize, n, esize);
            ring::all_reduce(cx.t, &cx.s, &Circle::whole(&cx.s), out[start], &blocks, dtype, op)?;
            continue;
        }
        let r = in_staging(cx, out[start..i].iter().map(|p| &**p), |cx, flat| {
            let blocks = even_blocks(flat.len() / esize, n, esize);
            ring::all_reduce(cx.t, &cx.s, &Circle::whole(&cx.s), flat, &blocks, dtype, op)
        });
        let mut at = 0;
        for p in out[start..i].iter_mut() {
            p.copy_from_slice(&cx.staging[at..at + p.len()]);
            at += p.len();
        }
        r?;
    }
    Ok(())
}

/// Avg is a sum until here: divides by the `n` ranks.
#[inline]
pub(crate) fn finish_avg(op: ReduceOp, dtype: DataType, buf: &mut [u8], n: usize) {
    if op == ReduceOp::Avg && n > 1 {
        reduce::divide(dtype, buf, n);
    }
}
