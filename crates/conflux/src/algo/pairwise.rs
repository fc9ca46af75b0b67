//! Exchanges where every rank talks to every other at once: all_to_all(v), the gather step of
//! reduce, and barrier. All transfers of one call go in one step, so links work in parallel.

use std::ops::Range;

use super::by_ref::{self, Part};
use super::{carve, Step};
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// Sends `send[send_blocks[p]]` to every peer p and receives `recv[recv_blocks[p]]` from it.
/// The caller copies this rank's own block. Large blocks between ranks of one host go by
/// single copy (`by_ref.rs`).
pub(crate) fn all_to_all(
    t: &mut Transport,
    s: &Step,
    send: &[u8],
    send_blocks: &[Range<usize>],
    recv: &mut [u8],
    recv_blocks: &[Range<usize>],
) -> Result<(), LinkError> {
    let mut parts = Vec::with_capacity(2 * s.size);
    // Visit peers in the order rank+1, rank+2, ... so that no peer is everyone's first.
    for d in 1..s.size {
        let p = (s.rank + d) % s.size;
        parts.push(Part::Give { peer: p, data: &send[send_blocks[p].clone()] });
    }
    for (p, into) in carve(recv, recv_blocks).into_iter().enumerate().filter(|&(p, _)| p != s.rank) {
        parts.push(Part::Take { peer: p, into });
    }
    by_ref::exchange(t, s, &mut parts)
}

/// Every rank gets an empty message from every other: nobody leaves before all have arrived.
pub(crate) fn barrier(t: &mut Transport, s: &Step) -> Result<(), LinkError> {
    let mut xfers = Vec::with_capacity(2 * s.size);
    let mut sinks: Vec<[u8; 0]> = vec![[]; s.size];
    for d in 1..s.size {
        xfers.push(Xfer::Send { peer: (s.rank + d) % s.size, tag: s.tag, data: &[] });
    }
    for (p, sink) in sinks.iter_mut().enumerate() {
        if p != s.rank {
            xfers.push(Xfer::Recv { peer: p, tag: s.tag, sink: Sink::Copy(sink) });
        }
    }
    t.exchange(&mut xfers, s.deadline)
}
