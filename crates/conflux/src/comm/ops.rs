//! One collective call, described once, dispatched to an algorithm. Blocking and asynchronous
//! entry points both end here.

use std::fmt;
use std::ops::Range;
use std::time::Instant;

use crate::algo::{chain, direct, even_blocks, pairwise, ring, Step};
use crate::config::AlgoChoice;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::{LinkError, Sink, Transport, Xfer, COLL_BIT};

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
    /// Result in `buf` at the root; other ranks' buffers are left unchanged.
    Reduce {
        buf: &'a mut [u8],
        op: ReduceOp,
        root: usize,
    },
    /// `buf` holds size blocks; this rank's own block is already in place.
    AllGather {
        buf: &'a mut [u8],
    },
    /// `buf` holds size blocks; afterwards this rank's own block holds its reduced share.
    ReduceScatter {
        buf: &'a mut [u8],
        op: ReduceOp,
    },
    AllToAll {
        send: &'a [u8],
        send_blocks: Vec<Range<usize>>,
        recv: &'a mut [u8],
        recv_blocks: Vec<Range<usize>>,
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
    pub algo: AlgoChoice,
    /// Every rank maps one shared segment, so the direct algorithms can serve.
    pub direct_ok: bool,
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
            Coll::Reduce { buf, op, root } => {
                write!(f, "reduce({d} x {}, {op}, root={root})", n(buf))
            }
            Coll::AllGather { buf } => write!(f, "all_gather({d} x {} in all)", n(buf)),
            Coll::ReduceScatter { buf, op } => {
                write!(f, "reduce_scatter({d} x {} in all, {op})", n(buf))
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
    let step = Step { rank: plan.rank, size: plan.size, tag: 0, deadline: Instant::now() + plan.timeout };
    let is_p2p = matches!(coll, Coll::Send { .. } | Coll::Recv { .. });
    let step = if is_p2p {
        step
    } else {
        t.seq += 1;
        Step { tag: COLL_BIT | t.seq, ..step }
    };
    let mut coll = coll;
    let r = dispatch(t, plan, &step, &mut coll, dtype);
    r.map_err(|source| Error::Link { op: Describe(&coll, dtype).to_string(), source })
}

fn dispatch(t: &mut Transport, plan: &Plan, s: &Step, coll: &mut Coll<'_>, dtype: DataType) -> Result<(), LinkError> {
    let n = plan.size;
    let esize = dtype.size();
    let direct = plan.direct_ok && plan.algo != AlgoChoice::Ring;
    match coll {
        Coll::AllReduce { input, out, op } => {
            if n == 1 {
                if let Some(i) = input {
                    out[0].copy_from_slice(i);
                }
            } else if direct {
                direct::all_reduce(t, s, *input, out, dtype, *op)?;
            } else {
                if let Some(i) = input {
                    out[0].copy_from_slice(i);
                }
                ring_pieces(t, s, out, dtype, *op)?;
            }
            for p in out.iter_mut() {
                finish_avg(*op, dtype, p, n);
            }
        }
        Coll::Broadcast { buf, root } => {
            if n > 1 {
                chain::broadcast(t, s, buf, *root, esize)?;
            }
        }
        Coll::Reduce { buf, op, root } => {
            if n > 1 {
                let blocks = even_blocks(buf.len() / esize, n, esize);
                ring::reduce(t, s, buf, &blocks, *root, dtype, *op)?;
            }
            if s.rank == *root {
                finish_avg(*op, dtype, buf, n);
            }
        }
        Coll::AllGather { buf } => {
            if n > 1 {
                let blocks = even_blocks(buf.len() / esize, n, esize);
                ring::all_gather(t, s, buf, &blocks, 0)?;
            }
        }
        Coll::ReduceScatter { buf, op } => {
            let blocks = even_blocks(buf.len() / esize, n, esize);
            if n > 1 {
                ring::reduce_scatter(t, s, buf, &blocks, -1, dtype, *op)?;
            }
            finish_avg(*op, dtype, &mut buf[blocks[s.rank].clone()], n);
        }
        Coll::AllToAll { send, send_blocks, recv, recv_blocks } => {
            let (from, to) = (send_blocks[s.rank].clone(), recv_blocks[s.rank].clone());
            recv[to].copy_from_slice(&send[from]);
            if n > 1 {
                pairwise::all_to_all(t, s, send, send_blocks, recv, recv_blocks)?;
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
            ring::all_reduce(t, s, out[start], &blocks, dtype, op)?;
            continue;
        }
        let mut flat = std::mem::take(&mut t.staging);
        flat.clear();
        out[start..i].iter().for_each(|p| flat.extend_from_slice(p));
        let blocks = even_blocks(flat.len() / esize, n, esize);
        let r = ring::all_reduce(t, s, &mut flat, &blocks, dtype, op);
        let mut at = 0;
        for p in out[start..i].iter_mut() {
            p.copy_from_slice(&flat[at..at + p.len()]);
            at += p.len();
        }
        t.staging = flat;
        r?;
    }
    Ok(())
}

fn finish_avg(op: ReduceOp, dtype: DataType, buf: &mut [u8], n: usize) {
    if op == ReduceOp::Avg && n > 1 {
        reduce::divide(dtype, buf, n);
    }
}
