//! Pipelined chains: the message flows along the ranks in chunks, each rank passing a chunk
//! on while it takes the next. Time ≈ (chunks + N - 2) chunk transfers: every link busy at
//! once, for large messages.
//!
//! - broadcast: from the root towards root + 1, root + 2, ...
//! - reduce: from root - 1 (the far end) back to the root, each rank adding its own part.

use smallvec::SmallVec;

use super::{split2, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// Chunk of the pipeline: small enough that the chain fills fast, large enough that the
/// per-step cost stays small against the copy.
pub(crate) const CHUNK: usize = 256 << 10;

pub(crate) fn broadcast(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    root: usize,
    esize: usize,
) -> Result<(), LinkError> {
    let n = s.size;
    let pos = (s.rank + n - root) % n;
    pipeline(t, s, buf, pos, (s.left(), s.right()), esize, |into| Sink::Copy(into))
}

/// Non-root ranks' `buf` ends as scratch (the caller passes a copy).
pub(crate) fn reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    root: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let n = s.size;
    // Position along the chain, counted from its far end (root - 1) at 0 to the root at n - 1.
    let pos = (root + n - 1 - s.rank) % n;
    pipeline(t, s, buf, pos, (s.right(), s.left()), dtype.size(), |into| Sink::Reduce { buf: into, dtype, op })
}

/// The far end of the reduce's chain (root - 1) has nothing to reduce: it sends `data` in the
/// pipeline's chunks, as it is, and needs no working copy. None: not the far end.
pub(crate) fn reduce_as_leaf(
    t: &mut Transport,
    s: &Step,
    data: &[u8],
    root: usize,
    esize: usize,
) -> Option<Result<(), LinkError>> {
    let n = s.size;
    if n < 2 || s.rank != (root + n - 1) % n {
        return None;
    }
    let chunk = (CHUNK / esize).max(1) * esize;
    let mut send = |piece: &[u8]| t.exchange(&mut [Xfer::Send { peer: s.left(), tag: s.tag, data: piece }], s.deadline);
    // As `pipeline` at position 0: a chunk a step, and an empty buffer is one empty message.
    Some(if data.is_empty() { send(data) } else { data.chunks(chunk).try_for_each(send) })
}

/// The chain's steps at position `pos` (0 starts, n - 1 ends), receiving from `from` and
/// sending to `to`: at step k it takes chunk k - pos + 1 and passes on chunk k - pos.
fn pipeline(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    pos: usize,
    (from, to): (usize, usize),
    esize: usize,
    sink: impl for<'a> Fn(&'a mut [u8]) -> Sink<'a>,
) -> Result<(), LinkError> {
    let n = s.size;
    let chunk = (CHUNK / esize).max(1) * esize;
    let chunks = buf.len().div_ceil(chunk).max(1);
    let len = buf.len();
    let range = |j: usize| (j * chunk).min(len)..((j + 1) * chunk).min(len);
    for k in 0..chunks + n - 2 {
        let recv = (pos > 0).then(|| (k + 1).checked_sub(pos)).flatten().filter(|&j| j < chunks);
        let send = (pos < n - 1).then(|| k.checked_sub(pos)).flatten().filter(|&j| j < chunks);
        let (send_r, recv_r) = (send.map(range), recv.map(range));
        let empty = 0..0;
        let (out, into) = split2(buf, send_r.as_ref().unwrap_or(&empty), recv_r.as_ref().unwrap_or(&empty));
        let mut xfers: SmallVec<[Xfer<'_>; 2]> = SmallVec::new();
        if send.is_some() {
            xfers.push(Xfer::Send { peer: to, tag: s.tag, data: out });
        }
        if recv.is_some() {
            xfers.push(Xfer::Recv { peer: from, tag: s.tag, sink: sink(into) });
        }
        if !xfers.is_empty() {
            t.exchange(&mut xfers, s.deadline)?;
        }
    }
    Ok(())
}
