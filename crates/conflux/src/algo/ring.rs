//! Ring reduce-scatter and all-gather over arbitrary block partitions (Patarasuk & Yuan's
//! bandwidth-optimal schedule): N-1 steps each, every rank sending one block to its right
//! neighbour while it receives one from its left. all_reduce is the two in sequence.

use std::ops::Range;

use super::moves::{run_step, Move};
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
    red: Red,
) -> Result<(), LinkError> {
    pass(t, s, c, buf, blocks, shift, Some(red))
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
    pass(t, s, c, buf, blocks, shift, None)
}

/// The ring's N-1 steps among `c` over `blocks`, as data: at step k send block
/// `pos - k + shift` right and take block `pos - k - 1 + shift` from the left, reduced or
/// copied. Reduce-scatter leaves position p holding block p + 1 + shift reduced; all-gather
/// starts from position p holding block p + shift.
/// Lazily, so that running them allocates nothing.
pub(crate) fn moves<'a>(
    c: &'a Circle<'a>,
    blocks: &'a [Range<usize>],
    shift: isize,
    reduce: bool,
) -> impl Iterator<Item = Move> + 'a {
    let r = c.pos as isize;
    (0..c.len as isize - 1).map(move |k| Move {
        to: c.right(),
        send: block(blocks, r - k + shift).clone(),
        from: c.left(),
        recv: block(blocks, r - k - 1 + shift).clone(),
        reduce,
    })
}

/// Runs the ring's steps (`moves`), reducing with `red` if given, else copying.
fn pass(
    t: &mut Transport,
    s: &Step,
    c: &Circle<'_>,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    shift: isize,
    red: Option<Red>,
) -> Result<(), LinkError> {
    for m in moves(c, blocks, shift, red.is_some()) {
        run_step(t, s, buf, &[&m], red)?;
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

/// all_reduce of a separate `input` into `buf`, nothing copied first: the reduce-scatter
/// combines each block it receives (every block but this rank's own, once each) with that
/// block of `input`, straight into `buf`, and its first send is this rank's own block of
/// `input`; the all-gather then fills the rest of `buf`, own block included.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce_from(
    t: &mut Transport,
    s: &Step,
    c: &Circle<'_>,
    input: &[u8],
    buf: &mut [u8],
    blocks: &[Range<usize>],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    for (k, m) in moves(c, blocks, 0, true).enumerate() {
        let (out, into) = split2(buf, &m.send, &m.recv);
        let data = if k == 0 { &input[m.send.clone()] } else { out };
        let sink = Sink::ReduceFrom { buf: into, src: &input[m.recv.clone()], dtype, op };
        let mut xfers = [Xfer::Send { peer: m.to, tag: s.tag, data }, Xfer::Recv { peer: m.from, tag: s.tag, sink }];
        t.exchange(&mut xfers, s.deadline)?;
    }
    all_gather(t, s, c, buf, blocks, 1)
}

/// reduce_scatter of a separate `input` (in `blocks`, one per rank) into `out`, this rank's
/// block, nothing copied first: each block received is combined with the input's straight
/// into `work` (scratch as long as `input`), or into `out` for the last, this rank's own; the
/// first send is taken from the input.
pub(crate) fn reduce_scatter_from(
    t: &mut Transport,
    s: &Step,
    input: &[u8],
    work: &mut [u8],
    out: &mut [u8],
    blocks: &[Range<usize>],
    (dtype, op): Red,
) -> Result<(), LinkError> {
    let c = Circle::whole(s);
    for (k, m) in moves(&c, blocks, -1, true).enumerate() {
        let (sent, into) = split2(work, &m.send, &m.recv);
        let data = if k == 0 { &input[m.send.clone()] } else { sent };
        let into = if k + 2 == c.len { &mut *out } else { into };
        let sink = Sink::ReduceFrom { buf: into, src: &input[m.recv.clone()], dtype, op };
        let mut xfers = [Xfer::Send { peer: m.to, tag: s.tag, data }, Xfer::Recv { peer: m.from, tag: s.tag, sink }];
        t.exchange(&mut xfers, s.deadline)?;
    }
    Ok(())
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
