//! The algorithm table: every schedule conflux has, one row each. A row names the algorithm,
//! the operation it serves (given by its entry point's kind, so the two cannot disagree),
//! the forms of call it takes, what it needs of the topology, and its entry point. The
//! planner asks the table what can serve a call (`select::serves`), the cost model prices
//! what it allows, and `run` calls the row's entry point: there is no other list to keep in
//! step, and no fallback to another schedule. Adding an algorithm is a module and its rows
//! here, its name in `call::Algo`, and its cost arm in `select::predict`, the one cost model
//! (its arms share some twenty derived terms, which is why they stay together); the test
//! `every_row_of_the_table_is_priced_and_nothing_else_is` fails until all of them agree.

use std::ops::Range;

use super::coll::Coll;
use super::forms::{finish_avg, on_reduce_buffer, on_reduce_scratch, on_scatter_buffer, on_scratch, ring_pieces};
use super::{bruck, chain, direct, even_blocks, hier, ordered, pairwise, rabenseifner, rd, ring, sag, tree};
use super::{Algo, Blocks, Circle, Ctx, OpKind, Red};
use crate::dtype::DataType;
use crate::transport::LinkError;

type R = Result<(), LinkError>;

// Entry points' types, by kind (see `Run`).
type AllReduceFn = fn(&mut Ctx<'_>, &mut [&mut [u8]], Red) -> R;
type AllReduceFromFn = fn(&mut Ctx<'_>, Option<&[u8]>, &mut [&mut [u8]], Red) -> R;
type BroadcastFn = fn(&mut Ctx<'_>, &mut [u8], usize, usize) -> R;
type ReduceFn = fn(&mut Ctx<'_>, Option<&[u8]>, &mut [u8], usize, Red) -> R;
type AllGatherFn = fn(&mut Ctx<'_>, &mut [u8], &[Range<usize>]) -> R;
type ReduceScatterFn = fn(&mut Ctx<'_>, &mut [u8], &[Range<usize>], Red) -> R;
type ReduceScatterFromFn = fn(&mut Ctx<'_>, Option<&[u8]>, &mut [u8], &[Range<usize>], Red) -> R;
type AllToAllFn = fn(&mut Ctx<'_>, &[u8], &[Range<usize>], &mut [u8], &[Range<usize>]) -> R;

/// A row's entry point, by the operation it serves. Buffers are as each kind's doc says;
/// `run` brings a call's buffers into that form and finishes Avg.
#[derive(Clone, Copy)]
pub(crate) enum Run {
    /// Reduces `out` (consecutive pieces of one buffer, holding this rank's data) in place.
    AllReduce(AllReduceFn),
    /// The same, reading a separate `input` where it is (single piece only) instead of a copy.
    AllReduceFrom(AllReduceFromFn),
    /// Sends the root's buffer to every rank (root, element size).
    Broadcast(BroadcastFn),
    /// Reduces every rank's data (`input`, or else the buffer) into the root's buffer (root,
    /// reduction); other ranks' buffers stay as they were.
    Reduce(ReduceFn),
    /// Fills every rank's block (`blocks`, by rank) of the buffer; this rank's is in place.
    AllGather(AllGatherFn),
    /// Reduces the buffer's blocks in place so that this rank's block holds its share.
    ReduceScatter(ReduceScatterFn),
    /// The same, reading a separate `input` where it is and writing only this rank's block:
    /// into `buf` itself with an input, else into its block of `buf`.
    ReduceScatterFrom(ReduceScatterFromFn),
    /// Block k of `send` to rank k, block k of `recv` from rank k, this rank's own included.
    AllToAll(AllToAllFn),
}

impl Run {
    pub fn op(self) -> OpKind {
        match self {
            Run::AllReduce(_) | Run::AllReduceFrom(_) => OpKind::AllReduce,
            Run::Broadcast(_) => OpKind::Broadcast,
            Run::Reduce(_) => OpKind::Reduce,
            Run::AllGather(_) => OpKind::AllGather,
            Run::ReduceScatter(_) | Run::ReduceScatterFrom(_) => OpKind::ReduceScatter,
            Run::AllToAll(_) => OpKind::AllToAll,
        }
    }
}

/// What a row needs of where the ranks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Needs {
    /// Any communicator.
    Any,
    /// Every rank maps one shared segment (all on one host, shared memory on).
    OneSegment,
    /// At least two nodes, each with the same number of ranks.
    EvenNodes,
}

#[derive(Clone, Copy)]
pub(crate) struct Row {
    pub algo: Algo,
    pub run: Run,
    /// Takes a coalesced all_reduce (several pieces).
    pub pieces: bool,
    /// Takes an all_to_all whose blocks differ in size (all_to_all_v).
    pub uneven: bool,
    pub needs: Needs,
}

impl Row {
    pub fn op(&self) -> OpKind {
        self.run.op()
    }
}

const fn row(algo: Algo, run: Run) -> Row {
    Row { algo, run, pieces: false, uneven: true, needs: Needs::Any }
}

/// Every schedule conflux has.
pub(crate) const TABLE: &[Row] = &[
    Row { pieces: true, ..row(Algo::Ring, Run::AllReduceFrom(ring_all_reduce)) },
    row(Algo::Ring, Run::Reduce(ring_reduce)),
    row(Algo::Ring, Run::AllGather(|cx, buf, b| ring::all_gather(cx.t, &cx.s, &Circle::whole(&cx.s), buf, b, 0))),
    row(Algo::Ring, Run::ReduceScatterFrom(ring_reduce_scatter)),
    Row { pieces: true, needs: Needs::OneSegment, ..row(Algo::Direct, Run::AllReduceFrom(direct::all_reduce)) },
    Row { needs: Needs::OneSegment, ..row(Algo::Direct, Run::AllGather(direct::blocks::all_gather)) },
    Row { needs: Needs::OneSegment, ..row(Algo::Direct, Run::ReduceScatterFrom(direct::blocks::reduce_scatter)) },
    Row { needs: Needs::OneSegment, uneven: false, ..row(Algo::Direct, Run::AllToAll(direct_all_to_all)) },
    row(Algo::Tree, Run::AllReduce(|cx, out, (d, op)| tree::all_reduce(cx.t, &cx.s, single(out), d, op))),
    row(Algo::Tree, Run::Broadcast(|cx, buf, root, _| tree::broadcast(cx.t, &cx.s, buf, root))),
    row(Algo::Tree, Run::Reduce(tree_reduce)),
    row(Algo::Rd, Run::AllReduceFrom(|cx, input, out, (d, op)| rd::all_reduce(cx, input, single(out), d, op))),
    row(Algo::Rd, Run::AllGather(|cx, buf, b| rd::all_gather(cx.t, &cx.s, buf, b))),
    row(Algo::Rd, Run::ReduceScatter(|cx, buf, b, (d, op)| rd::reduce_scatter(cx.t, &cx.s, buf, b, d, op))),
    row(
        Algo::Rabenseifner,
        Run::AllReduce(|cx, out, (d, op)| rabenseifner::all_reduce(cx.t, &cx.s, single(out), d, op)),
    ),
    Row {
        needs: Needs::EvenNodes,
        ..row(Algo::Hier, Run::AllReduce(|cx, out, (d, op)| hier::all_reduce(cx, single(out), d, op)))
    },
    row(Algo::Chain, Run::Broadcast(|cx, buf, root, es| chain::broadcast(cx.t, &cx.s, buf, root, es))),
    row(Algo::Chain, Run::Reduce(chain_reduce)),
    row(Algo::ScatterAllGather, Run::Broadcast(|cx, buf, root, es| sag::broadcast(cx.t, &cx.s, buf, root, es))),
    row(Algo::Bruck, Run::AllGather(bruck::all_gather)),
    Row {
        uneven: false,
        ..row(
            Algo::Bruck,
            Run::AllToAll(|cx, send, sb, recv, _| bruck::all_to_all(cx.t, &cx.s, send, recv, sb[0].len())),
        )
    },
    row(Algo::Pairwise, Run::AllToAll(pairwise_all_to_all)),
];

/// The row of `algo` for `op`, if it has one.
#[inline]
pub(crate) fn find(algo: Algo, op: OpKind) -> Option<&'static Row> {
    TABLE.iter().find(|r| r.algo == algo && r.op() == op)
}

/// The one piece of an all_reduce whose row takes no pieces (`Row::pieces`); the planner
/// never gives such a row a coalesced call.
fn single<'a>(out: &'a mut [&mut [u8]]) -> &'a mut [u8] {
    debug_assert_eq!(out.len(), 1, "a row without pieces got a coalesced all_reduce");
    &mut *out[0]
}

/// The ring reads a separate input of one piece where it is; pieces go as `ring_pieces`
/// has them, from a copy of the input.
fn ring_all_reduce(cx: &mut Ctx<'_>, input: Option<&[u8]>, out: &mut [&mut [u8]], (dtype, op): Red) -> R {
    match (input, &mut *out) {
        (Some(i), [one]) => {
            let blocks = even_blocks(one.len() / dtype.size(), cx.s.size, dtype.size());
            ring::all_reduce_from(cx.t, &cx.s, &Circle::whole(&cx.s), i, one, &blocks, dtype, op)
        }
        _ => {
            if let Some(i) = input {
                out[0].copy_from_slice(i);
            }
            ring_pieces(cx, out, dtype, op)
        }
    }
}

fn ring_reduce(cx: &mut Ctx<'_>, input: Option<&[u8]>, buf: &mut [u8], root: usize, (dtype, op): Red) -> R {
    let blocks = even_blocks(buf.len() / dtype.size(), cx.s.size, dtype.size());
    on_reduce_buffer(cx, root, input, buf, |cx, work| ring::reduce(cx.t, &cx.s, work, &blocks, root, (dtype, op)))
}

fn tree_reduce(cx: &mut Ctx<'_>, input: Option<&[u8]>, buf: &mut [u8], root: usize, (dtype, op): Red) -> R {
    on_reduce_scratch(cx, root, input, buf, |cx, work, src| tree::reduce(cx.t, &cx.s, work, src, root, dtype, op))
}

fn chain_reduce(cx: &mut Ctx<'_>, input: Option<&[u8]>, buf: &mut [u8], root: usize, (dtype, op): Red) -> R {
    on_reduce_scratch(cx, root, input, buf, |cx, work, src| chain::reduce(cx.t, &cx.s, work, src, root, dtype, op))
}

/// In place on `buf`, or from a separate input into `buf` with the lane's staging buffer as
/// scratch (`on_scratch`), nothing copied.
fn ring_reduce_scatter(cx: &mut Ctx<'_>, input: Option<&[u8]>, buf: &mut [u8], blocks: &[Range<usize>], red: Red) -> R {
    match input {
        None => ring::reduce_scatter(cx.t, &cx.s, &Circle::whole(&cx.s), buf, blocks, -1, red),
        Some(i) => {
            on_scratch(cx, i.len(), |cx, work| ring::reduce_scatter_from(cx.t, &cx.s, i, work, buf, blocks, red))
        }
    }
}

/// Copies this rank's own block of an all_to_all, which schedules that exchange only with
/// others leave to the caller.
fn own_block(cx: &Ctx<'_>, send: &[u8], sb: &[Range<usize>], recv: &mut [u8], rb: &[Range<usize>]) {
    let me = cx.s.rank;
    recv[rb[me].clone()].copy_from_slice(&send[sb[me].clone()]);
}

fn direct_all_to_all(cx: &mut Ctx<'_>, send: &[u8], sb: &[Range<usize>], recv: &mut [u8], rb: &[Range<usize>]) -> R {
    own_block(cx, send, sb, recv, rb);
    direct::blocks::all_to_all(cx, send, recv, sb)
}

fn pairwise_all_to_all(cx: &mut Ctx<'_>, send: &[u8], sb: &[Range<usize>], recv: &mut [u8], rb: &[Range<usize>]) -> R {
    own_block(cx, send, sb, recv, rb);
    pairwise::all_to_all(cx.t, &cx.s, send, sb, recv, rb)
}

/// Runs `row` on a call of its operation: brings the call's buffers into the row's form, runs
/// it if there is anyone to talk to, and finishes Avg. `coll` must be of the row's operation
/// (the planner finds rows by it).
#[inline]
pub(crate) fn run(cx: &mut Ctx<'_>, row: &Row, coll: &mut Coll<'_>, dtype: DataType) -> R {
    let (n, esize) = (cx.s.size, dtype.size());
    match (coll, row.run) {
        (Coll::AllReduce { input, out, op }, run) => {
            let red = (dtype, *op);
            match run {
                Run::AllReduceFrom(f) if n > 1 => f(cx, *input, out, red)?,
                Run::AllReduce(_) | Run::AllReduceFrom(_) => {
                    if let Some(i) = input {
                        out[0].copy_from_slice(i);
                    }
                    if let (Run::AllReduce(f), true) = (run, n > 1) {
                        f(cx, out, red)?;
                    }
                }
                _ => unreachable!("rows are found by their operation"),
            }
            for p in out.iter_mut() {
                finish_avg(*op, dtype, p, n);
            }
        }
        (Coll::Broadcast { buf, root }, Run::Broadcast(f)) => {
            if n > 1 {
                f(cx, buf, *root, esize)?;
            }
        }
        (Coll::Reduce { input, buf, op, root }, Run::Reduce(f)) => {
            if n > 1 {
                f(cx, *input, buf, *root, (dtype, *op))?;
            } else if let Some(i) = input {
                buf.copy_from_slice(i);
            }
            if cx.s.rank == *root {
                finish_avg(*op, dtype, buf, n);
            }
        }
        (Coll::AllGather { buf }, Run::AllGather(f)) => {
            if n > 1 {
                let blocks = even_blocks(buf.len() / esize, n, esize);
                f(cx, buf, &blocks)?;
            }
        }
        (Coll::ReduceScatter { input, buf, op }, run) => {
            let red = (dtype, *op);
            let blocks = even_blocks(input.unwrap_or(buf).len() / esize, n, esize);
            let mine = match run {
                Run::ReduceScatterFrom(f) if n > 1 => {
                    f(cx, *input, buf, &blocks, red)?;
                    if input.is_some() {
                        &mut **buf
                    } else {
                        &mut buf[blocks[cx.s.rank].clone()]
                    }
                }
                Run::ReduceScatter(_) | Run::ReduceScatterFrom(_) => {
                    on_scatter_buffer(cx, &blocks, *input, buf, |cx, work| match run {
                        Run::ReduceScatter(f) if n > 1 => f(cx, work, &blocks, red),
                        _ => Ok(()),
                    })?
                }
                _ => unreachable!("rows are found by their operation"),
            };
            finish_avg(*op, dtype, mine, n);
        }
        (Coll::AllToAll { send, recv, uneven }, Run::AllToAll(f)) => {
            // Even: both buffers have the same length (checked by the caller), so one split.
            let even: Blocks;
            let (sb, rb) = match uneven {
                Some(v) => (&v.send[..], &v.recv[..]),
                None => {
                    even = even_blocks(send.len() / esize, n, esize);
                    (&even[..], &even[..])
                }
            };
            if n > 1 {
                f(cx, send, sb, recv, rb)?;
            } else {
                own_block(cx, send, sb, recv, rb);
            }
        }
        _ => unreachable!("rows are found by their operation"),
    }
    Ok(())
}

/// A floating-point reduction in deterministic mode (`ordered.rs`), which has one schedule
/// whatever the table offers.
pub(crate) fn run_ordered(cx: &mut Ctx<'_>, coll: &mut Coll<'_>, dtype: DataType) -> R {
    let n = cx.s.size;
    match coll {
        Coll::AllReduce { input, out, op } => {
            if let Some(i) = input {
                out[0].copy_from_slice(i);
            }
            ordered::all_reduce(cx.t, &cx.s, out, dtype, *op)?;
            for p in out.iter_mut() {
                finish_avg(*op, dtype, p, n);
            }
        }
        Coll::Reduce { input, buf, op, root } => {
            let op = *op;
            on_reduce_buffer(cx, *root, *input, buf, |cx, work| ordered::reduce(cx.t, &cx.s, work, *root, dtype, op))?;
            if cx.s.rank == *root {
                finish_avg(op, dtype, buf, n);
            }
        }
        Coll::ReduceScatter { input, buf, op } => {
            let op = *op;
            let blocks = even_blocks(input.unwrap_or(buf).len() / dtype.size(), n, dtype.size());
            let reduce =
                |cx: &mut Ctx<'_>, work: &mut [u8]| ordered::reduce_scatter(cx.t, &cx.s, work, &blocks, dtype, op);
            let mine = on_scatter_buffer(cx, &blocks, *input, buf, reduce)?;
            finish_avg(op, dtype, mine, n);
        }
        _ => unreachable!("only reductions are ordered"),
    }
    Ok(())
}
