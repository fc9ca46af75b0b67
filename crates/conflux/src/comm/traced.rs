//! What a communicator records when tracing is on (`CONFLUX_TRACE`, see trace/): it registers
//! itself with its rank's tracer, puts the rank's clock on rank 0's, stamps each call as it is
//! issued (`Issue`), and turns a finished call into a record.

use std::sync::Arc;
use std::time::Instant;

use crate::algo::coll::Coll;
use crate::algo::select::{Call, Topo};
use crate::call::Algo;
use crate::dtype::DataType;
use crate::store::StoreClient;
use crate::trace::meta::Clock;
use crate::trace::record::{algo_code, dtype_code, flag, kind, Op, Raw};
use crate::trace::writer::{blank, monotonic_ns, ns, thread_id, Tracer};

/// A traced communicator's tracer and its number there.
pub(crate) struct CommTrace {
    pub tracer: Arc<Tracer>,
    pub comm: u16,
}

/// Round trips to the store a rank on another host makes to find its clock's offset.
const CLOCK_PINGS: usize = 16;

/// The links of a communicator on `topo`, as the trace names them.
pub fn link_of(topo: &Topo) -> &'static str {
    match () {
        _ if topo.size == 1 => "self",
        _ if topo.nodes.len() == 1 && !topo.local_tcp => "shm",
        _ if topo.nodes.len() == topo.size || topo.local_tcp => "tcp",
        _ => "shm+tcp",
    }
}

/// This rank's clock against rank 0's (the store server's): the same clock on rank 0's host,
/// else the offset seen by the fastest of a few round trips, whose half is its uncertainty.
pub fn clock(store: Option<&StoreClient>, on_rank0_host: bool) -> Clock {
    let Some(store) = store else {
        return Clock::unmeasured();
    };
    if on_rank0_host {
        return Clock::same_host();
    }
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..CLOCK_PINGS {
        // Read raw, as the server reads its clock: the round trip brackets the server's read.
        let before = monotonic_ns();
        let Ok(server) = store.server_clock_ns() else { break };
        let after = monotonic_ns();
        let rtt = after.saturating_sub(before);
        // (2 server - before - after) / 2, truncated toward zero: never beyond rtt / 2 when
        // the server's read lies between ours.
        let offset = ((2 * i128::from(server) - i128::from(before) - i128::from(after)) / 2) as i64;
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    match best {
        Some((rtt, offset)) => {
            Clock { offset_ns: offset, uncertainty_ns: rtt.div_ceil(2), method: "store ping-pong".into() }
        }
        None => Clock::unmeasured(),
    }
}

/// A call as its caller issued it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Issue {
    pub at: Instant,
    pub thread: u32,
    /// The operation's number on this rank.
    pub id: u64,
    pub asynchronous: bool,
}

impl Issue {
    #[inline]
    pub fn now(tracer: &Tracer, asynchronous: bool) -> Issue {
        Issue::at(tracer, Instant::now(), asynchronous)
    }

    /// A call issued at `at` by this thread.
    #[inline]
    pub fn at(tracer: &Tracer, at: Instant, asynchronous: bool) -> Issue {
        Issue { at, thread: thread_id(), id: tracer.next_op_id(), asynchronous }
    }
}

/// How a finished call went, for its record.
pub(crate) struct Ran {
    pub seq: u64,
    pub algo: Option<Algo>,
    pub started: Instant,
    pub ok: bool,
}

/// The record of `coll`, issued as `issue`, that ran as `ran` and ended now.
#[inline]
pub fn op_record(issue: &Issue, coll: &Coll<'_>, call: Option<&Call>, dtype: DataType, ran: &Ran) -> Raw {
    let (op, bytes, peer) = match coll {
        Coll::Send { data, peer, .. } => (Op::Send, data.len(), Some(*peer)),
        Coll::Recv { buf, peer, .. } => (Op::Recv, buf.len(), Some(*peer)),
        Coll::Barrier => (Op::Barrier, 0, None),
        _ => (call.map_or(Op::Barrier, |c| Op::Coll(c.op)), call.map_or(0, |c| c.bytes), None),
    };
    let mut r = Raw {
        kind: kind::OP,
        op: op.code(),
        dtype: dtype_code(dtype),
        algo: algo_code(ran.algo),
        flags: flags(issue.asynchronous, ran.ok),
        thread: issue.thread,
        seq: if peer.is_some() { 0 } else { ran.seq },
        id: issue.id,
        bytes: bytes as u64,
        issued: ns(issue.at),
        started: ns(ran.started),
        ended: ns(Instant::now()),
        ..blank()
    };
    if let Some(p) = peer {
        r.peer = p as u32;
    }
    r
}

fn flags(asynchronous: bool, ok: bool) -> u8 {
    (if asynchronous { flag::ASYNC } else { 0 }) | (if ok { 0 } else { flag::FAILED })
}

/// A posted send or receive's record, written when it completes (on whichever thread drives
/// it, so through the tracer's shared buffer, not a lane's).
pub(crate) struct PostedTrace {
    pub tracer: Arc<Tracer>,
    pub comm: u16,
    pub lane: u8,
    pub issue: Issue,
    pub send: bool,
    pub dtype: DataType,
    pub bytes: usize,
}

impl PostedTrace {
    /// Records the transfer, which ended now with `peer` (None: it failed).
    pub fn finished(self, peer: Option<usize>) {
        let op = if self.send { Op::Send } else { Op::Recv };
        let at = ns(self.issue.at);
        let r = Raw {
            kind: kind::OP,
            op: op.code(),
            dtype: dtype_code(self.dtype),
            lane: self.lane,
            flags: flags(true, peer.is_some()),
            comm: self.comm,
            thread: self.issue.thread,
            peer: peer.map_or(u32::MAX, |p| p as u32),
            id: self.issue.id,
            bytes: self.bytes as u64,
            issued: at,
            started: at,
            ended: ns(Instant::now()),
            ..blank()
        };
        self.tracer.async_ended(r.ended);
        self.tracer.side_record(r);
    }
}

/// Records that the caller waited for operation `id` from `began` until now.
pub fn waited(tracer: &Tracer, id: u64, began: Instant) {
    let r = Raw { kind: kind::WAIT, thread: thread_id(), id, issued: ns(began), ended: ns(Instant::now()), ..blank() };
    tracer.side_record(r);
}
