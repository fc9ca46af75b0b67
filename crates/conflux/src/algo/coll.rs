//! A call's buffers, as the algorithms take them: bytes, in the in-place form every
//! schedule works on. The communicator layer builds one per call (`comm/ops.rs`).

use std::ops::Range;

use crate::dtype::ReduceOp;

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
    /// `uneven`: all_to_all_v's blocks; without them (all_to_all) both buffers are in equal
    /// blocks, one per rank. all_to_all_v is never even, whatever this rank's counts: another
    /// rank's may differ, and every rank must choose the same algorithm.
    AllToAll {
        send: &'a [u8],
        recv: &'a mut [u8],
        uneven: Option<VBlocks>,
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

/// all_to_all_v's byte ranges, by rank: what this rank sends each one, what it receives from each.
pub(crate) struct VBlocks {
    pub send: Vec<Range<usize>>,
    pub recv: Vec<Range<usize>>,
}
