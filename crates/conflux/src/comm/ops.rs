//! One collective call, described once, dispatched to an algorithm. Blocking and asynchronous
//! entry points both end here.

use std::fmt;
use std::ops::Range;
use std::time::Instant;

use crate::algo::select::{self, Call};
use crate::algo::{bruck, chain, direct, even_blocks, hier, ordered, pairwise, rabenseifner, rd, ring, sag, tree};
use crate::algo::{Algo, Circle, OpKind, Step};
use crate::config::AlgoSpec;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::recorder::What;
use crate::transport::{CallShape, Fingerprint, LinkError, Sink, Transport, Xfer, COLL_BIT};

/// A call's buffers, as bytes, in the in-place form every algorithm works on.
pub(crate) enum Coll<'a> {
    /// `out` is one buffer in consecutive pieces (several for coalesced calls); `input`, if
    /// given, is a separate source for a single piece.
    AllReduce {
        input: Option<&'a [u8]>,
        out: &'a mut [&'a mut [u8]],
        op: ReduceOp,
    },
    Broadcast {
        buf: &'a mut [u8],
        root: usize,
    },
    /// Result in `buf` at the root; other ranks' buffers are left unchanged. `input`, if
    /// given, is the data to reduce (of `buf`'s length) and `buf` only receives the result.
    Reduce {
        input: Option<&'a [u8]>,
        buf: &'a mut [u8],
        op: ReduceOp,
        root: usize,
    },
    /// `buf` holds size blocks; this rank's own block is already in place.
    AllGather {
        buf: &'a mut [u8],
    },
    /// `buf` holds size blocks; afterwards this rank's own block holds its reduced share. With
    /// `input` (the size blocks, left unchanged), `buf` is one block and receives that share.
    ReduceScatter {
        input: Option<&'a [u8]>,
        buf: &'a mut [u8],
        op: ReduceOp,
    },
    /// `even`: called as all_to_all, whose blocks are equal on every rank. all_to_all_v is
    /// never even, whatever this rank's counts: another rank's may differ, and every rank must
    /// choose the same algorithm.
    AllToAll {
        send: &'a [u8],
        send_blocks: Vec<Range<usize>>,
        recv: &'a mut [u8],
        recv_blocks: Vec<Range<usize>>,
        even: bool,
    },
    Send {
        data: &'a [u8],
        peer: usize,
        tag: u32,
    },
    Recv {
        buf: &'a mut [u8],
        peer: usize,
        tag: u32,
    },
    Barrier,
}

/// What the communicator knows that every call needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub rank: usize,
    pub size: usize,
    pub timeout: std::time::Duration,
    /// Algorithms the configuration forces.
    pub algo: AlgoSpec,
    /// The algorithm this call's handle forces (`Communicator::with_algo`), before `algo`.
    pub call_algo: Option<Algo>,
    /// Floating-point reductions in rank order (`Config::deterministic`, algo/ordered.rs).
    pub deterministic: bool,
}

/// A call as a person reads it in an error message: `all_reduce(float x 1024, sum)`.
pub(crate) struct Describe<'a, 'b>(pub &'a Coll<'b>, pub DataType);

impl fmt::Display for Describe<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.1;
        let n = |b: &[u8]| b.len() / d.size();
        match self.0 {
            Coll::AllReduce { out, op, .. } => {
                let len: usize = out.iter().map(|p| p.len()).sum();
                write!(f, "all_reduce({d} x {}, {op})", len / d.size())?;
                if out.len() > 1 {
                    write!(f, " of {} tensors", out.len())?;
                }
                Ok(())
            }
            Coll::Broadcast { buf, root } => write!(f, "broadcast({d} x {}, root={root})", n(buf)),
            Coll::Reduce { buf, op, root, .. } => {
                write!(f, "reduce({d} x {}, {op}, root={root})", n(buf))
            }
            Coll::AllGather { buf } => write!(f, "all_gather({d} x {} in all)", n(buf)),
            Coll::ReduceScatter { input, buf, op } => {
                write!(f, "reduce_scatter({d} x {} in all, {op})", n(input.unwrap_or(buf)))
            }
            Coll::AllToAll { send, .. } => write!(f, "all_to_all({d} x {} sent)", n(send)),
            Coll::Send { data, peer, tag } => {
                write!(f, "send({d} x {} to rank {peer}, tag {tag})", n(data))
            }
            Coll::Recv { buf, peer, tag } => {
                write!(f, "recv({d} x {} from rank {peer}, tag {tag})", n(buf))
            }
            Coll::Barrier => write!(f, "barrier"),
        }
    }
}

impl Coll<'_> {
    /// What the algorithm choice looks at, for the calls that have one.
    fn call(&self, dtype: DataType) -> Option<Call> {
        let half = dtype.is_half();
        let c = |op, bytes| Some(Call { op, bytes, even: true, pieces: false, half });
        match self {
            Coll::AllReduce { out, .. } => Some(Call {
                op: OpKind::AllReduce,
                bytes: out.iter().map(|p| p.len()).sum(),
                even: true,
                pieces: out.len() > 1,
                half,
            }),
            Coll::Broadcast { buf, .. } => c(OpKind::Broadcast, buf.len()),
            Coll::Reduce { buf, .. } => c(OpKind::Reduce, buf.len()),
            Coll::AllGather { buf } => c(OpKind::AllGather, buf.len()),
            Coll::ReduceScatter { input, buf, .. } => c(OpKind::ReduceScatter, input.unwrap_or(buf).len()),
            Coll::AllToAll { send, even, .. } => {
                Some(Call { op: OpKind::AllToAll, bytes: send.len(), even: *even, pieces: false, half })
            }
            Coll::Send { .. } | Coll::Recv { .. } | Coll::Barrier => None,
        }
    }

    /// The fingerprint its messages carry (see `transport/fingerprint.rs`).
    fn fingerprint(&self, dtype: DataType, algo: Option<Algo>, ordered: bool) -> Fingerprint {
        let elems = |b: &[u8]| b.len() / dtype.size();
        let (op, elems, pieces, root) = match self {
            Coll::AllReduce { out, .. } => {
                (Some(OpKind::AllReduce), out.iter().map(|p| elems(p)).sum(), out.len(), None)
            }
            Coll::Broadcast { buf, root } => (Some(OpKind::Broadcast), elems(buf), 1, Some(*root)),
            Coll::Reduce { buf, root, .. } => (Some(OpKind::Reduce), elems(buf), 1, Some(*root)),
            Coll::AllGather { buf } => (Some(OpKind::AllGather), elems(buf), 1, None),
            Coll::ReduceScatter { input, buf, .. } => {
                (Some(OpKind::ReduceScatter), elems(input.unwrap_or(buf)), 1, None)
            }
            Coll::AllToAll { send, .. } => (Some(OpKind::AllToAll), elems(send), 1, None),
            Coll::Barrier => (None, 0, 1, None),
            Coll::Send { .. } | Coll::Recv { .. } => return Fingerprint::NONE,
        };
        let uneven = matches!(self, Coll::AllToAll { even: false, .. });
        Fingerprint::new(&CallShape { op, dtype, elems, pieces, uneven, reduce: self.op(), root, algo, ordered })
    }

    /// What the flight recorder keeps of this call.
    fn recorded(&self, seq: u64, call: Fingerprint, dtype: DataType) -> What {
        let count = |b: &[u8]| b.len() / dtype.size();
        match self {
            Coll::Send { data, peer, tag } => {
                What::P2p { send: true, peer: *peer, tag: *tag, dtype, count: count(data) }
            }
            Coll::Recv { buf, peer, tag } => {
                What::P2p { send: false, peer: *peer, tag: *tag, dtype, count: count(buf) }
            }
            _ => What::Coll { seq, call },
        }
    }

    /// The reduce op of a reducing call.
    fn op(&self) -> Option<ReduceOp> {
        match self {
            Coll::AllReduce { op, .. } | Coll::Reduce { op, .. } | Coll::ReduceScatter { op, .. } => Some(*op),
            _ => None,
        }
    }
}

/// Runs one call on the transport. A call every rank rejects (an op its dtype lacks) is
/// rejected before it takes a sequence number, so the ranks stay in step.
pub(crate) fn run(t: &mut Transport, plan: &Plan, coll: Coll<'_>, dtype: DataType) -> Result<()> {
    if let Some(op) = coll.op().filter(|op| !op.accepts(dtype)) {
        return Err(Error::InvalidArgument(format!("{op} is not defined on {dtype}")));
    }
    // In deterministic mode a floating-point reduction has one schedule, whatever is forced.
    let ordered = plan.deterministic && plan.size > 1 && dtype.is_float() && coll.op().is_some();
    let algo = match coll.call(dtype) {
        Some(_) if ordered => Algo::Ring,
        Some(call) => {
            pick(t, plan, &call).map_err(|why| Error::InvalidArgument(format!("{}: {why}", Describe(&coll, dtype))))?
        }
        // send, recv and barrier have one schedule each; dispatch does not look at this.
        None => Algo::Pairwise,
    };
    let started = Instant::now();
    let step = Step { rank: plan.rank, size: plan.size, tag: 0, deadline: started + plan.timeout };
    let is_p2p = matches!(coll, Coll::Send { .. } | Coll::Recv { .. });
    let step = if is_p2p {
        step
    } else {
        t.seq += 1;
        Step { tag: COLL_BIT | t.seq, ..step }
    };
    let mut coll = coll;
    let call = coll.fingerprint(dtype, coll.call(dtype).filter(|_| !ordered).map(|_| algo), ordered);
    let mark = t.calls_log.started(coll.recorded(t.seq, call, dtype), started);
    if !is_p2p {
        t.waiter.enter_call(t.seq, call);
    }
    let r =
        if ordered { dispatch_ordered(t, &step, &mut coll, dtype) } else { dispatch(t, algo, &step, &mut coll, dtype) };
    // A local peer whose board shows another call, at this number or the one before, fails
    // the call (the direct algorithm compared both in its descriptors already).
    let compared = is_p2p || (algo == Algo::Direct && !ordered);
    let r = r.and_then(|()| if compared { Ok(()) } else { t.leave_call().map_err(|e| t.fail(e)) });
    if r.is_ok() && !is_p2p {
        t.waiter.calls.finished = t.seq;
    }
    t.calls_log.ended(mark, r.is_ok());
    r.map_err(|source| Error::Link { op: Describe(&coll, dtype).to_string(), source })
}

/// The algorithm forced for `call`: this handle's, then the operation's, then the one for
/// all if it has a schedule for this form of call (`select::implements_call`: CONFLUX_ALGO=
/// direct leaves all_to_all_v to the model, as it leaves broadcast).
pub(crate) fn forced(plan: &Plan, call: &Call) -> Option<Algo> {
    match (plan.call_algo, plan.algo.forced(call.op)) {
        (Some(a), _) | (None, Some((a, true))) => Some(a),
        (None, Some((a, false))) if select::implements_call(a, call) => Some(a),
        _ => None,
    }
}

/// The forced algorithm (`forced`) or the cost model's choice, cached per call shape; logged
/// once per operation and size class at CONFLUX_DEBUG=info.
fn pick(t: &mut Transport, plan: &Plan, call: &Call) -> std::result::Result<Algo, String> {
    let forced = forced(plan, call);
    if let Some(&a) = t.chosen.get(&(*call, forced)) {
        return Ok(a);
    }
    let algo = select::choose(&t.model, call, &t.topo, forced)?;
    if t.chosen.len() >= 4096 {
        t.chosen.clear();
    }
    t.chosen.insert((*call, forced), algo);
    let class = usize::BITS - call.bytes.leading_zeros();
    if tracing::enabled!(tracing::Level::INFO) && t.logged.insert((call.op, class)) {
        let ranked = select::ranked(&t.model, call, &t.topo);
        let predicted: Vec<String> = ranked.iter().map(|(a, us)| format!("{a} {us:.1}us")).collect();
        tracing::info!(
            op = call.op.name(),
            bytes = call.bytes,
            chosen = algo.name(),
            forced = forced.is_some(),
            predicted = predicted.join(", "),
            "algorithm"
        );
    }
    Ok(algo)
}

fn dispatch(t: &mut Transport, algo: Algo, s: &Step, coll: &mut Coll<'_>, dtype: DataType) -> Result<(), LinkError> {
    let n = s.size;
    let esize = dtype.size();
    let whole = Circle::whole(s);
    match coll {
        Coll::AllReduce { input, out, op } => {
            if n == 1 || algo != Algo::Direct {
                if let Some(i) = input {
                    out[0].copy_from_slice(i);
                }
            }
            if n > 1 {
                match algo {
                    Algo::Direct => direct::all_reduce(t, s, *input, out, dtype, *op)?,
                    Algo::Ring => ring_pieces(t, s, out, dtype, *op)?,
                    Algo::Tree => tree::all_reduce(t, s, out[0], dtype, *op)?,
                    Algo::Rd => rd::all_reduce(t, s, out[0], dtype, *op)?,
                    Algo::Rabenseifner => rabenseifner::all_reduce(t, s, out[0], dtype, *op)?,
                    Algo::Hier => hier::all_reduce(t, s, out[0], dtype, *op)?,
                    other => unreachable!("select lets {other} serve all_reduce"),
                }
            }
            for p in out.iter_mut() {
                finish_avg(*op, dtype, p, n);
            }
        }
        Coll::Broadcast { buf, root } => {
            if n > 1 {
                match algo {
                    Algo::Tree => tree::broadcast(t, s, buf, *root)?,
                    Algo::ScatterAllGather => sag::broadcast(t, s, buf, *root, esize)?,
                    _ => chain::broadcast(t, s, buf, *root, esize)?,
                }
            }
        }
        Coll::Reduce { input, buf, op, root } => {
            let reduce = |t: &mut Transport, work: &mut [u8]| match algo {
                _ if n == 1 => Ok(()),
                Algo::Tree => tree::reduce(t, s, work, *root, dtype, *op),
                Algo::Chain => chain::reduce(t, s, work, *root, dtype, *op),
                _ => ring::reduce(t, s, work, &even_blocks(work.len() / esize, n, esize), *root, dtype, *op),
            };
            on_reduce_buffer(t, s.rank == *root, *input, buf, reduce)?;
            if s.rank == *root {
                finish_avg(*op, dtype, buf, n);
            }
        }
        Coll::AllGather { buf } => {
            if n > 1 {
                let blocks = even_blocks(buf.len() / esize, n, esize);
                match algo {
                    Algo::Direct => direct::blocks::all_gather(t, s, buf, &blocks)?,
                    Algo::Rd => rd::all_gather(t, s, buf, &blocks)?,
                    Algo::Bruck => bruck::all_gather(t, s, buf, &blocks)?,
                    _ => ring::all_gather(t, s, &whole, buf, &blocks, 0)?,
                }
            }
        }
        Coll::ReduceScatter { input, buf, op } => {
            let blocks = even_blocks(input.unwrap_or(buf).len() / esize, n, esize);
            let mine = if n > 1 && algo == Algo::Direct {
                // It reads its input where it is and writes only this rank's block.
                direct::blocks::reduce_scatter(t, s, *input, buf, &blocks, dtype, *op)?;
                if input.is_some() {
                    &mut **buf
                } else {
                    &mut buf[blocks[s.rank].clone()]
                }
            } else {
                let reduce = |t: &mut Transport, work: &mut [u8]| match algo {
                    _ if n == 1 => Ok(()),
                    Algo::Rd => rd::reduce_scatter(t, s, work, &blocks, dtype, *op),
                    _ => ring::reduce_scatter(t, s, &whole, work, &blocks, -1, dtype, *op),
                };
                on_scatter_buffer(t, s.rank, &blocks, *input, buf, reduce)?
            };
            finish_avg(*op, dtype, mine, n);
        }
        Coll::AllToAll { send, send_blocks, recv, recv_blocks, .. } => {
            if n > 1 && algo == Algo::Bruck {
                bruck::all_to_all(t, s, send, recv, send_blocks[0].len())?;
            } else {
                let (from, to) = (send_blocks[s.rank].clone(), recv_blocks[s.rank].clone());
                recv[to].copy_from_slice(&send[from]);
                if n > 1 && algo == Algo::Direct {
                    direct::blocks::all_to_all(t, s, send, recv, send_blocks[0].len())?;
                } else if n > 1 {
                    pairwise::all_to_all(t, s, send, send_blocks, recv, recv_blocks)?;
                }
            }
        }
        Coll::Send { data, peer, tag } => {
            t.exchange(&mut [Xfer::Send { peer: *peer, tag: u64::from(*tag), data }], s.deadline)?;
        }
        Coll::Recv { buf, peer, tag } => {
            t.exchange(&mut [Xfer::Recv { peer: *peer, tag: u64::from(*tag), sink: Sink::Copy(buf) }], s.deadline)?;
        }
        Coll::Barrier => {
            if n > 1 {
                pairwise::barrier(t, s)?;
            }
        }
    }
    Ok(())
}

/// A floating-point reduction in deterministic mode (`ordered.rs`); `run` sends nothing else.
fn dispatch_ordered(t: &mut Transport, s: &Step, coll: &mut Coll<'_>, dtype: DataType) -> Result<(), LinkError> {
    let n = s.size;
    match coll {
        Coll::AllReduce { input, out, op } => {
            if let Some(i) = input {
                out[0].copy_from_slice(i);
            }
            ordered::all_reduce(t, s, out, dtype, *op)?;
            for p in out.iter_mut() {
                finish_avg(*op, dtype, p, n);
            }
        }
        Coll::Reduce { input, buf, op, root } => {
            let reduce = |t: &mut Transport, work: &mut [u8]| ordered::reduce(t, s, work, *root, dtype, *op);
            on_reduce_buffer(t, s.rank == *root, *input, buf, reduce)?;
            if s.rank == *root {
                finish_avg(*op, dtype, buf, n);
            }
        }
        Coll::ReduceScatter { input, buf, op } => {
            let blocks = even_blocks(input.unwrap_or(buf).len() / dtype.size(), n, dtype.size());
            let reduce = |t: &mut Transport, work: &mut [u8]| ordered::reduce_scatter(t, s, work, &blocks, dtype, *op);
            let mine = on_scatter_buffer(t, s.rank, &blocks, *input, buf, reduce)?;
            finish_avg(*op, dtype, mine, n);
        }
        _ => unreachable!("only reductions are ordered"),
    }
    Ok(())
}

/// Runs `f` on `srcs`, concatenated into the transport's staging buffer, whose pages stay
/// faulted in from call to call (a fresh copy of a large message faults in every page: 5x the
/// time of a 512 KiB reduce at 2 ranks). The buffer keeps what `f` left until the next call.
fn in_staging<'s, R>(
    t: &mut Transport,
    srcs: impl IntoIterator<Item = &'s [u8]>,
    f: impl FnOnce(&mut Transport, &mut [u8]) -> R,
) -> R {
    let mut work = std::mem::take(&mut t.staging);
    work.clear();
    srcs.into_iter().for_each(|src| work.extend_from_slice(src));
    let r = f(t, &mut work);
    t.staging = work;
    r
}

/// A reduce's working buffer: the root reduces in `buf` (filled from `input` first), the other
/// ranks in a staged copy, leaving their buffers as they were.
fn on_reduce_buffer(
    t: &mut Transport,
    is_root: bool,
    input: Option<&[u8]>,
    buf: &mut [u8],
    f: impl FnOnce(&mut Transport, &mut [u8]) -> Result<(), LinkError>,
) -> Result<(), LinkError> {
    if !is_root {
        return in_staging(t, [input.unwrap_or(buf)], f);
    }
    if let Some(i) = input {
        buf.copy_from_slice(i);
    }
    f(t, buf)
}

/// A reduce_scatter's working buffer: `buf` itself in place, or a staged copy of `input`
/// whose block `rank` lands in `buf`. Returns this rank's reduced block.
fn on_scatter_buffer<'b>(
    t: &mut Transport,
    rank: usize,
    blocks: &[Range<usize>],
    input: Option<&[u8]>,
    buf: &'b mut [u8],
    f: impl FnOnce(&mut Transport, &mut [u8]) -> Result<(), LinkError>,
) -> Result<&'b mut [u8], LinkError> {
    let mine = blocks[rank].clone();
    match input {
        None => {
            f(t, buf)?;
            Ok(&mut buf[mine])
        }
        Some(i) => {
            in_staging(t, [i], |t, work| {
                f(t, work)?;
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
fn ring_pieces(
    t: &mut Transport,
    s: &Step,
    out: &mut [&mut [u8]],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let (n, esize) = (s.size, dtype.size());
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
            ring::all_reduce(t, s, &Circle::whole(s), out[start], &blocks, dtype, op)?;
            continue;
        }
        let r = in_staging(t, out[start..i].iter().map(|p| &**p), |t, flat| {
            let blocks = even_blocks(flat.len() / esize, n, esize);
            ring::all_reduce(t, s, &Circle::whole(s), flat, &blocks, dtype, op)
        });
        let mut at = 0;
        for p in out[start..i].iter_mut() {
            p.copy_from_slice(&t.staging[at..at + p.len()]);
            at += p.len();
        }
        r?;
    }
    Ok(())
}

fn finish_avg(op: ReduceOp, dtype: DataType, buf: &mut [u8], n: usize) {
    if op == ReduceOp::Avg && n > 1 {
        reduce::divide(dtype, buf, n);
    }
}
