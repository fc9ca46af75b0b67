//! Recursive doubling and halving: log2 N steps, each with one partner at distance 1, 2, 4...
//! (doubling) or N/2, N/4, ... (halving). Best for small messages, where the step count is
//! the cost. Any world size through `fold.rs`.
//!
//! - all_reduce: every step exchanges the whole buffer with the partner and reduces it.
//! - reduce_scatter: recursive halving; each step sends the half of the remaining blocks that
//!   the partner keeps, and reduces the half this rank keeps.
//! - all_gather: recursive doubling; each step sends every block gathered so far.
//!
//! `halving` and `doubling` also serve Rabenseifner's all_reduce.

use std::ops::Range;

use super::fold::{Fold, Role};
use super::{split2, Ctx, Red, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::transport::{LinkError, Sink, Transport, Xfer};

fn span(vb: &[Range<usize>], group: Range<usize>) -> Range<usize> {
    vb[group.start].start..vb[group.end - 1].end
}

/// Recursive halving among `vb.len()` (a power of two) virtual ranks: afterwards virtual rank
/// `v` holds range `vb[v]` fully reduced. `rank_of` maps virtual ranks to transport ranks.
pub(crate) fn halving(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    vb: &[Range<usize>],
    v: usize,
    rank_of: impl Fn(usize) -> usize,
    (dtype, op): Red,
) -> Result<(), LinkError> {
    let (mut lo, mut hi) = (0, vb.len());
    let mut mask = vb.len() / 2;
    while mask > 0 {
        let mid = lo + mask;
        let (keep, give) = if v < mid { (lo..mid, mid..hi) } else { (mid..hi, lo..mid) };
        let (out, into) = split2(buf, &span(vb, give), &span(vb, keep.clone()));
        let peer = rank_of(v ^ mask);
        trade(t, s, peer, out, Sink::Reduce { buf: into, dtype, op })?;
        (lo, hi) = (keep.start, keep.end);
        mask /= 2;
    }
    Ok(())
}

/// Recursive doubling among `vb.len()` (a power of two) virtual ranks, starting with virtual
/// rank `v` holding `vb[v]`: afterwards every one holds all of them.
pub(crate) fn doubling(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    vb: &[Range<usize>],
    v: usize,
    rank_of: impl Fn(usize) -> usize,
) -> Result<(), LinkError> {
    let mut mask = 1;
    while mask < vb.len() {
        let mine = v & !(mask - 1);
        let theirs = (v ^ mask) & !(mask - 1);
        let (out, into) = split2(buf, &span(vb, mine..mine + mask), &span(vb, theirs..theirs + mask));
        let peer = rank_of(v ^ mask);
        trade(t, s, peer, out, Sink::Copy(into))?;
        mask *= 2;
    }
    Ok(())
}

/// One step with one partner: `data` goes out while the partner's message lands in `sink`.
fn trade(t: &mut Transport, s: &Step, peer: usize, data: &[u8], sink: Sink<'_>) -> Result<(), LinkError> {
    t.exchange(&mut [Xfer::Send { peer, tag: s.tag, data }, Xfer::Recv { peer, tag: s.tag, sink }], s.deadline)
}

/// Moves `data` one way between a folded pair.
fn give(t: &mut Transport, s: &Step, peer: usize, data: &[u8]) -> Result<(), LinkError> {
    t.exchange(&mut [Xfer::Send { peer, tag: s.tag, data }], s.deadline)
}

fn take(t: &mut Transport, s: &Step, peer: usize, sink: Sink<'_>) -> Result<(), LinkError> {
    t.exchange(&mut [Xfer::Recv { peer, tag: s.tag, sink }], s.deadline)
}

/// Runs `body` among the active ranks of `fold.rs` as virtual rank v, with the folded pairs
/// joined around it: an extra rank hands `buf[sent(extra)]` to its partner (which reduces it
/// into its own, with `combine`, or copies it) and takes back `buf[returned(extra)]`.
pub(crate) fn folded(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    sent: impl Fn(usize) -> Range<usize>,
    returned: impl Fn(usize) -> Range<usize>,
    combine: Option<(DataType, ReduceOp)>,
    body: impl FnOnce(&mut Transport, &mut [u8], usize, &Fold) -> Result<(), LinkError>,
) -> Result<(), LinkError> {
    let f = Fold::new(s.size);
    match f.role(s.rank) {
        Role::Extra { active } => {
            give(t, s, active, &buf[sent(s.rank)])?;
            take(t, s, active, Sink::Copy(&mut buf[returned(s.rank)]))
        }
        Role::Active { v, extra } => {
            if let Some(e) = extra {
                let into = &mut buf[sent(e)];
                let sink = match combine {
                    Some((dtype, op)) => Sink::Reduce { buf: into, dtype, op },
                    None => Sink::Copy(into),
                };
                take(t, s, e, sink)?;
            }
            body(t, buf, v, &f)?;
            match extra {
                Some(e) => give(t, s, e, &buf[returned(e)]),
                None => Ok(()),
            }
        }
    }
}

/// `folded` for an all_reduce: an extra rank hands over its whole buffer, which its partner
/// reduces into its own, and takes the whole result back.
pub(crate) fn folded_all_reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
    body: impl FnOnce(&mut Transport, &mut [u8], usize, &Fold) -> Result<(), LinkError>,
) -> Result<(), LinkError> {
    let all = 0..buf.len();
    folded(t, s, buf, |_| all.clone(), |_| all.clone(), Some((dtype, op)), body)
}

/// all_reduce into `buf`, of `input` if given (else of `buf` itself). Without folded ranks
/// the first step sends `input` as it is and combines the partner's data with it straight
/// into `buf`: nothing is copied first.
pub(crate) fn all_reduce(
    cx: &mut Ctx<'_>,
    mut input: Option<&[u8]>,
    buf: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    if Fold::new(cx.s.size).p != cx.s.size {
        // Folded pairs hand whole buffers over first: they work in `buf`.
        if let Some(i) = input.take() {
            buf.copy_from_slice(i);
        }
    }
    let (t, s, mine) = (&mut *cx.t, &cx.s, &mut *cx.staging);
    folded_all_reduce(t, s, buf, dtype, op, |t, buf, v, f| {
        // The partner's data reduces into `buf` while this rank's copy is on its way out.
        let mut mask = 1;
        let mut r = Ok(());
        while mask < f.p && r.is_ok() {
            let peer = f.rank_of(v ^ mask);
            let src = input.take();
            let data = match src {
                Some(src) => src,
                None => {
                    mine.clear();
                    mine.extend_from_slice(buf);
                    &mine[..]
                }
            };
            r = trade(t, s, peer, data, Sink::reduce(&mut *buf, src, dtype, op));
            mask *= 2;
        }
        r
    })
}

/// `buf` holds one block per rank (`blocks`); afterwards this rank's block is fully reduced.
pub(crate) fn reduce_scatter(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let all = 0..buf.len();
    folded(
        t,
        s,
        buf,
        |_| all.clone(),
        |e| blocks[e].clone(),
        Some((dtype, op)),
        |t, buf, v, f| {
            let vb: Vec<Range<usize>> = (0..f.p).map(|v| f.merged(blocks, v)).collect();
            halving(t, s, buf, &vb, v, |v| f.rank_of(v), (dtype, op))
        },
    )
}

/// `buf` holds one block per rank (`blocks`), this rank's in place; afterwards all of them.
pub(crate) fn all_gather(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    blocks: &[Range<usize>],
) -> Result<(), LinkError> {
    let all = 0..buf.len();
    folded(
        t,
        s,
        buf,
        |e| blocks[e].clone(),
        |_| all.clone(),
        None,
        |t, buf, v, f| {
            let vb: Vec<Range<usize>> = (0..f.p).map(|v| f.merged(blocks, v)).collect();
            doubling(t, s, buf, &vb, v, |v| f.rank_of(v))
        },
    )
}
