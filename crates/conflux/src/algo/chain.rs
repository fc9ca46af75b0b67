//! Pipelined chain broadcast: the root streams chunks to its right neighbour, which forwards
//! each chunk while it receives the next. Time ≈ (chunks + N - 2) chunk transfers.

use super::{split2, Step};
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// Chunk of the pipeline: small enough that the chain fills fast, large enough that the
/// per-step cost stays small against the copy.
const CHUNK: usize = 256 << 10;

pub(crate) fn broadcast(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    root: usize,
    esize: usize,
) -> Result<(), LinkError> {
    let n = s.size;
    let pos = (s.rank + n - root) % n;
    let chunk = (CHUNK / esize).max(1) * esize;
    let chunks = buf.len().div_ceil(chunk).max(1);
    let len = buf.len();
    let range = |j: usize| (j * chunk).min(len)..((j + 1) * chunk).min(len);
    let (left, right) = (s.left(), s.right());
    // At step k, position p receives chunk k - p + 1 and sends chunk k - p.
    for k in 0..chunks + n - 2 {
        let recv = (pos > 0).then(|| (k + 1).checked_sub(pos)).flatten().filter(|&j| j < chunks);
        let send = (pos < n - 1).then(|| k.checked_sub(pos)).flatten().filter(|&j| j < chunks);
        let (send_r, recv_r) = (send.map(range), recv.map(range));
        let empty = 0..0;
        let (out, into) = split2(buf, send_r.as_ref().unwrap_or(&empty), recv_r.as_ref().unwrap_or(&empty));
        let mut xfers = Vec::with_capacity(2);
        if send.is_some() {
            xfers.push(Xfer::Send { peer: right, tag: s.tag, data: out });
        }
        if recv.is_some() {
            xfers.push(Xfer::Recv { peer: left, tag: s.tag, sink: Sink::Copy(into) });
        }
        if !xfers.is_empty() {
            t.exchange(&mut xfers, s.deadline)?;
        }
    }
    Ok(())
}
