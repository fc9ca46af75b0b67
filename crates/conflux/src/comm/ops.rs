//! One collective call, described once, dispatched to an algorithm. Blocking and asynchronous
//! entry points both end here.

use std::fmt;

use std::time::Instant;

use super::lane::LaneState;
use super::recorder::What;
use super::traced::{self, Issue, Ran};
use crate::algo::coll::Coll;
use crate::algo::select::Call;
use crate::algo::{pairwise, table, Algo, Ctx, OpKind, Step};
use crate::call::{CallShape, Fingerprint};
use crate::config::AlgoSpec;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::transport::{Sink, Xfer, COLL_BIT};

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
    /// When and where the caller issued this call, if the communicator is traced.
    pub issue: Option<Issue>,
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
    #[inline]
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
            Coll::AllToAll { send, uneven, .. } => {
                Some(Call { op: OpKind::AllToAll, bytes: send.len(), even: uneven.is_none(), pieces: false, half })
            }
            Coll::Send { .. } | Coll::Recv { .. } | Coll::Barrier => None,
        }
    }

    /// The fingerprint its messages carry (see `call/fingerprint.rs`).
    #[inline]
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
        let uneven = matches!(self, Coll::AllToAll { uneven: Some(_), .. });
        Fingerprint::new(&CallShape { op, dtype, elems, pieces, uneven, reduce: self.op(), root, algo, ordered })
    }

    /// What the flight recorder keeps of this call.
    #[inline]
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

/// Runs one call on the lane. A call every rank rejects (an op its dtype lacks, an algorithm
/// forced that cannot serve it) is rejected before it takes a sequence number, so the ranks
/// stay in step.
pub(crate) fn run(st: &mut LaneState, plan: &Plan, coll: Coll<'_>, dtype: DataType) -> Result<()> {
    if let Some(op) = coll.op().filter(|op| !op.accepts(dtype)) {
        return Err(Error::InvalidArgument(format!("{op} is not defined on {dtype}")));
    }
    // In deterministic mode a floating-point reduction has one schedule, whatever is forced.
    let ordered = plan.deterministic && plan.size > 1 && dtype.is_float() && coll.op().is_some();
    let invalid = |why: String| Error::InvalidArgument(format!("{}: {why}", Describe(&coll, dtype)));
    let shape = coll.call(dtype);
    let row = match &shape {
        Some(_) if ordered => None,
        Some(call) => Some(st.planner.pick(plan, call).map_err(invalid)?),
        None => None,
    };
    // A traced call's times are compared in microseconds; others need a deadline and the
    // flight recorder's start, to the millisecond.
    let started = if st.trace.is_some() { Instant::now() } else { st.clock.now() };
    let mut step = Step { rank: plan.rank, size: plan.size, tag: 0, deadline: started + plan.timeout };
    let is_p2p = matches!(coll, Coll::Send { .. } | Coll::Recv { .. });
    let t = &mut st.t;
    let calls = &mut st.calls;
    if !is_p2p {
        calls.seq += 1;
        step.tag = COLL_BIT | calls.seq;
    }
    let mut coll = coll;
    let call = coll.fingerprint(dtype, row.map(|r| r.algo), ordered);
    let mark = calls.log.started(coll.recorded(calls.seq, call, dtype), started);
    if !is_p2p {
        t.waiter.enter_call(calls.seq, call);
    }
    let mut cx = Ctx { t, s: step, topo: &st.planner.topo, staging: &mut st.staging };
    let r = match row {
        Some(row) => table::run(&mut cx, row, &mut coll, dtype),
        None if ordered => table::run_ordered(&mut cx, &mut coll, dtype),
        None => match &mut coll {
            Coll::Send { data, peer, tag } => {
                cx.t.exchange(&mut [Xfer::Send { peer: *peer, tag: u64::from(*tag), data }], step.deadline)
            }
            Coll::Recv { buf, peer, tag } => {
                let sink = Sink::Copy(buf);
                cx.t.exchange(&mut [Xfer::Recv { peer: *peer, tag: u64::from(*tag), sink }], step.deadline)
            }
            Coll::Barrier if plan.size > 1 => pairwise::barrier(cx.t, &step),
            Coll::Barrier => Ok(()),
            _ => unreachable!("a collective with a choice of algorithm has a row, or is ordered"),
        },
    };
    let t = cx.t;
    // A local peer whose board shows another call, at this number or the one before, fails
    // the call (the direct algorithm compared both in its descriptors already).
    let compared = is_p2p || row.is_some_and(|r| r.algo == Algo::Direct);
    let r = r.and_then(|()| if compared { Ok(()) } else { t.leave_call().map_err(|e| t.fail(e)) });
    if r.is_ok() && !is_p2p {
        t.waiter.calls.finished = calls.seq;
    }
    calls.record_failure(t);
    calls.log.ended(mark, r.is_ok());
    if let Some(lt) = &mut st.trace {
        let issue = plan.issue.unwrap_or_else(|| Issue::at(lt.tracer(), started, false));
        let ran = Ran { seq: calls.seq, algo: row.map(|r| r.algo), started, ok: r.is_ok() };
        lt.push(traced::op_record(&issue, &coll, shape.as_ref(), dtype, &ran));
    }
    r.map_err(|source| Error::Link { op: Describe(&coll, dtype).to_string(), source })
}
