//! Ring reduce-scatter and all-gather over arbitrary block partitions (Patarasuk & Yuan's
//! bandwidth-optimal schedule): N-1 steps each, every rank sending one block to its right
//! neighbour while it receives one from its left. all_reduce is the two in sequence.

use std::ops::Range;

use super::{carve, split2, Circle, Red, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::transport::{LinkError, Sink, Transport, Xfer};

fn block(blocks: &[Range<usize>], k: isize) -> &Range<usize> {
    &blocks[k.rem_euclid(blocks.len() as isize) as usize]
}

/// Reduces `buf` (partitioned into `blocks`, one per ring position) so that afterwards this
/// rank holds the fully reduced block `pos + 1 + shift`. Other blocks hold partial results.
pub(crate) fn reduce_scatter(
    t: &mut Transport,
    s: &Step,
    c: &Circle<'_>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    shift: isize,
    (dtype, op): Red,
) -> Result<(), LinkError> {
    pass(t, s, c, buf, blocks, shift, |into| Sink::Reduce { buf: into, dtype, op })
}

/// Starting with this rank holding block `pos + shift`, leaves every rank with every block.
pub(crate) fn all_gather(
    t: &mut Transport,
    s: &Step,
    c: &Circle<'_>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    shift: isize,
) -> Result<(), LinkError> {
    pass(t, s, c, buf, blocks, shift, |into| Sink::Copy(into))
}

/// N-1 steps around the ring: send block `pos - k + shift` right, take block
/// `pos - k - 1 + shift` from the left into the sink `sink` makes of it.
fn pass(
    t: &mut Transport,
    s: &Step,
    c: &Circle<'_>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    shift: isize,
    sink: impl for<'a> Fn(&'a mut [u8]) -> Sink<'a>,
) -> Result<(), LinkError> {
    let r = c.pos as isize;
    for k in 0..c.len as isize - 1 {
        let (out, into) = split2(buf, block(blocks, r - k + shift), block(blocks, r - k - 1 + shift));
        t.exchange(
            &mut [
                Xfer::Send { peer: c.right(), tag: s.tag, data: out },
                Xfer::Recv { peer: c.left(), tag: s.tag, sink: sink(into) },
            ],
            s.deadline,
        )?;
    }
    Ok(())
}

/// all_reduce in place: reduce-scatter, then all-gather of the reduced blocks.
pub(crate) fn all_reduce(
    t: &mut Transport,
    s: &Step,
    c: &Circle<'_>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    reduce_scatter(t, s, c, buf, blocks, 0, (dtype, op))?;
    all_gather(t, s, c, buf, blocks, 1)
}

/// reduce to `root`: ring reduce-scatter (rank r ends with block r), then every rank sends its
/// block to the root. Non-root ranks' `buf` ends as scratch (the caller passes a copy).
pub(crate) fn reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    root: usize,
    red: Red,
) -> Result<(), LinkError> {
    reduce_scatter(t, s, &Circle::whole(s), buf, blocks, -1, red)?;
    if s.rank != root {
        let data = &buf[blocks[s.rank].clone()];
        return t.exchange(&mut [Xfer::Send { peer: root, tag: s.tag, data }], s.deadline);
    }
    let mut xfers = Vec::with_capacity(s.size);
    for (p, piece) in carve(buf, blocks).into_iter().enumerate().filter(|&(p, _)| p != root) {
        xfers.push(Xfer::Recv { peer: p, tag: s.tag, sink: Sink::Copy(piece) });
    }
    t.exchange(&mut xfers, s.deadline)
}
