//! One trace record as it lies in `rank-<r>.bin`: 64 bytes, little-endian, fixed layout, so a
//! lane appends a record without formatting anything and a file cut short by a killed rank is
//! still whole records up to its last flush.

use bytemuck::{Pod, Zeroable};

use crate::call::{Algo, OpKind};
use crate::dtype::DataType;

/// Bytes per record.
pub const RECORD_SIZE: usize = std::mem::size_of::<Raw>();

/// What a record is (`Raw::kind`).
pub mod kind {
    /// An operation ran: issued, started, ended.
    pub const OP: u8 = 1;
    /// A caller was blocked waiting for an asynchronous operation (`Raw::id` names it).
    pub const WAIT: u8 = 2;
    /// A step boundary (`Raw::seq` is the step's number, `Raw::started` its time).
    pub const STEP: u8 = 3;
}

/// `Raw::flags` bits.
pub mod flag {
    /// Issued asynchronously: it ran on the lane's engine thread, not its caller's.
    pub const ASYNC: u8 = 1;
    /// It failed.
    pub const FAILED: u8 = 2;
}

/// `Raw::peer` of a record without a peer.
pub const NO_PEER: u32 = u32::MAX;

/// The record. Times are nanoseconds of the writing rank's `CLOCK_MONOTONIC`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct Raw {
    pub kind: u8,
    /// The operation (`Op::code`).
    pub op: u8,
    /// `DataType::ALL` index.
    pub dtype: u8,
    /// 0: none (point to point, barrier, ordered reductions); else 1 + `Algo::ALL` index.
    pub algo: u8,
    /// 0 normal, 1 high priority.
    pub lane: u8,
    pub flags: u8,
    /// The communicator, as the rank's meta file numbers them.
    pub comm: u16,
    /// The calling thread, as the meta file numbers threads.
    pub thread: u32,
    /// A send's or receive's peer (rank in the communicator), else `NO_PEER`.
    pub peer: u32,
    /// A collective's call number in its communicator and lane (the same on every rank);
    /// a step's number.
    pub seq: u64,
    /// The operation's number on this rank (what a WAIT record refers to).
    pub id: u64,
    /// nccl-tests' size of the operation (see `Op::bytes_meaning`).
    pub bytes: u64,
    /// When the caller issued it (a WAIT: when the caller began to wait).
    pub issued: u64,
    /// When it started running on its lane.
    pub started: u64,
    /// When it finished (a WAIT: when the caller stopped waiting).
    pub ended: u64,
}

/// The operations a trace names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Barrier,
    Coll(OpKind),
    Send,
    Recv,
}

impl Op {
    pub fn code(self) -> u8 {
        match self {
            Op::Barrier => 0,
            Op::Coll(k) => 1 + k.index() as u8,
            Op::Send => 100,
            Op::Recv => 101,
        }
    }

    pub fn from_code(c: u8) -> Option<Op> {
        match c {
            0 => Some(Op::Barrier),
            100 => Some(Op::Send),
            101 => Some(Op::Recv),
            c => OpKind::ALL.get(usize::from(c).checked_sub(1)?).map(|&k| Op::Coll(k)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Barrier => "barrier",
            Op::Coll(k) => k.name(),
            Op::Send => "send",
            Op::Recv => "recv",
        }
    }

    /// Every rank of the communicator takes part, with the same `seq`.
    pub fn is_collective(self) -> bool {
        !matches!(self, Op::Send | Op::Recv)
    }

    /// nccl-tests' bus bandwidth factor at `n` ranks: busbw = algbw × factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Op::Coll(OpKind::AllReduce) => 2.0 * (n - 1.0) / n,
            Op::Coll(OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll) => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

pub fn dtype_code(d: DataType) -> u8 {
    DataType::ALL.iter().position(|&x| x == d).expect("listed") as u8
}

pub fn dtype_of(code: u8) -> Option<DataType> {
    DataType::ALL.get(usize::from(code)).copied()
}

pub fn algo_code(a: Option<Algo>) -> u8 {
    a.map_or(0, |a| 1 + Algo::ALL.iter().position(|&x| x == a).expect("listed") as u8)
}

pub fn algo_of(code: u8) -> Option<Algo> {
    Algo::ALL.get(usize::from(code).checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_the_record_is_64_bytes() {
        assert_eq!(RECORD_SIZE, 64);
        let mut ops = vec![Op::Barrier, Op::Send, Op::Recv];
        ops.extend(OpKind::ALL.map(Op::Coll));
        for op in ops {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        assert_eq!(Op::from_code(77), None);
        for d in DataType::ALL {
            assert_eq!(dtype_of(dtype_code(d)), Some(d));
        }
        for a in Algo::ALL {
            assert_eq!(algo_of(algo_code(Some(a))), Some(a));
        }
        assert_eq!(algo_of(algo_code(None)), None);
    }
}
