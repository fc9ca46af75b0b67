//! Reductions in a fixed order (`CONFLUX_DETERMINISTIC=1`): every element is reduced over the
//! ranks' contributions in rank order 0, 1, ..., N-1, by the same kernel, whatever the world's
//! topology, the transport, the chunk sizes or the algorithm the cost model would pick, so
//! floating-point results are bitwise identical from run to run and between configurations
//! (HCCL_DETERMINISTIC's promise; NCCL makes none). f16/bf16 accumulate in f32 across all
//! ranks and round once, as the direct algorithm does, which reduces in the same order.
//!
//! A rank gathers every contribution it reduces before reducing: reduce_scatter is an
//! all-to-all of the blocks (the ring's volume, in one step), all_reduce that plus the ring's
//! all-gather, reduce a gather at the root (N-1 buffers into one rank). The price is the
//! staging memory (N blocks) and a non-pipelined exchange; `conflux bench` with and without
//! the variable measures it.

use std::ops::Range;

use super::{carve, even_blocks, pairwise, ring, Circle, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// `out` (consecutive pieces of one buffer) becomes the ordered reduction over all ranks:
/// block k of the buffer is reduced in rank order by rank k (`reduce_scatter`), then the
/// blocks go round the ring, so the data moved is the ring's.
pub(crate) fn all_reduce(
    t: &mut Transport,
    s: &Step,
    out: &mut [&mut [u8]],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let esize = dtype.size();
    if let [whole] = out {
        let blocks = even_blocks(whole.len() / esize, s.size, esize);
        reduce_scatter(t, s, whole, &blocks, dtype, op)?;
        return ring::all_gather(t, s, &Circle::whole(s), whole, &blocks, 0);
    }
    let mut flat: Vec<u8> = out.iter().flat_map(|p| p.iter().copied()).collect();
    all_reduce(t, s, &mut [&mut flat], dtype, op)?;
    let mut at = 0;
    for p in out.iter_mut() {
        let n = p.len();
        p.copy_from_slice(&flat[at..at + n]);
        at += n;
    }
    Ok(())
}

/// The root's `buf` becomes the ordered reduction; the others send theirs (their `buf` is
/// a copy the caller made).
pub(crate) fn reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    root: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    if s.rank != root {
        return t.exchange(&mut [Xfer::Send { peer: root, tag: s.tag, data: buf }], s.deadline);
    }
    let len = buf.len();
    let mut all = vec![0u8; s.size * len];
    all[root * len..(root + 1) * len].copy_from_slice(buf);
    {
        let mut xfers: Vec<Xfer<'_>> = Vec::with_capacity(s.size);
        let each: Vec<Range<usize>> = (0..s.size).map(|k| k * len..(k + 1) * len).collect();
        for (k, piece) in carve(&mut all, &each).into_iter().enumerate().filter(|&(k, _)| k != root) {
            xfers.push(Xfer::Recv { peer: k, tag: s.tag, sink: Sink::Copy(piece) });
        }
        t.exchange(&mut xfers, s.deadline)?;
    }
    let parts: Vec<&[u8]> = (0..s.size).map(|k| &all[k * len..(k + 1) * len]).collect();
    reduce::reduce_many(dtype, op, buf, &parts);
    Ok(())
}

/// Block `blocks[rank]` of `buf` becomes the ordered reduction of every rank's block there.
pub(crate) fn reduce_scatter(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let mine = blocks[s.rank].clone();
    let b = mine.len();
    let recv_blocks: Vec<Range<usize>> = (0..s.size).map(|k| k * b..(k + 1) * b).collect();
    let mut gathered = vec![0u8; s.size * b];
    gathered[recv_blocks[s.rank].clone()].copy_from_slice(&buf[mine.clone()]);
    pairwise::all_to_all(t, s, buf, blocks, &mut gathered, &recv_blocks)?;
    let parts: Vec<&[u8]> = recv_blocks.iter().map(|r| &gathered[r.clone()]).collect();
    reduce::reduce_many(dtype, op, &mut buf[mine], &parts);
    Ok(())
}
