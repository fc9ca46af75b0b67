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
    pipeline(t, s, buf, None, pos, (s.left(), s.right()), esize, |into, _| Sink::Copy(into))
}

/// This rank's data is `src`, or `buf` itself when `src` is None; each chunk received is
/// combined with it straight into `buf` (no copy first), and the far end sends `src` as it is.
/// Non-root ranks' `buf` ends as scratch.
pub(crate) fn reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    src: Option<&[u8]>,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let n = s.size;
    // Position along the chain, counted from its far end (root - 1) at 0 to the root at n - 1.
    let pos = (root + n - 1 - s.rank) % n;
    pipeline(t, s, buf, src, pos, (s.right(), s.left()), dtype.size(), |into, mine| Sink::reduce(into, mine, dtype, op))
}

/// The chain's steps at position `pos` (0 starts, n - 1 ends), receiving from `from` and
/// sending to `to`: at step k it takes chunk k - pos + 1 and passes on chunk k - pos. `sink`
/// makes a chunk's receive, given that chunk of `src` (this rank's data where it is not in
/// `buf`); position 0, which receives nothing, sends `src` itself.
#[allow(clippy::too_many_arguments)]
fn pipeline(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    src: Option<&[u8]>,
    pos: usize,
    (from, to): (usize, usize),
    esize: usize,
    sink: impl for<'a> Fn(&'a mut [u8], Option<&'a [u8]>) -> Sink<'a>,
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
        if let Some(r) = send_r {
            let data = match src {
                Some(src) if pos == 0 => &src[r],
                _ => out,
            };
            xfers.push(Xfer::Send { peer: to, tag: s.tag, data });
        }
        if let Some(r) = recv_r {
            xfers.push(Xfer::Recv { peer: from, tag: s.tag, sink: sink(into, src.map(|d| &d[r])) });
        }
        if !xfers.is_empty() {
            t.exchange(&mut xfers, s.deadline)?;
        }
    }
    Ok(())
}
