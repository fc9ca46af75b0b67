//! Schedules as data: a step of a send/receive algorithm is a list of moves (send this range
//! of the buffer to that rank while taking that range from another, reduced or copied), and
//! one executor runs a step on the transport. The ring and the two-level hier build their
//! schedules this way (`ring::moves`, `hier::plan`), so they can be checked without links
//! (hier's simulator) and share one way of running.

use std::ops::Range;

use super::{carve, split2, Red, Step};
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// One move of one rank: send `send` to `to` while taking `recv` from `from`, reduced into
/// place (with the step's reduction) or copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    pub to: usize,
    pub send: Range<usize>,
    pub from: usize,
    pub recv: Range<usize>,
    pub reduce: bool,
}

/// Runs one step: every move's send and receive at once, as one exchange. `red` is the
/// reduction of the moves that reduce (there must be one if any does). The ranges of all the
/// moves must not overlap.
pub(crate) fn run_step(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    moves: &[&Move],
    red: Option<Red>,
) -> Result<(), LinkError> {
    debug_assert!(red.is_some() || moves.iter().all(|m| !m.reduce), "a reducing move without a reduction");
    let sink = |m: &Move, into| match (m.reduce, red) {
        (true, Some((dtype, op))) => Sink::Reduce { buf: into, dtype, op },
        _ => Sink::Copy(into),
    };
    // One move, the ring's step: two views, no allocation.
    if let [m] = moves {
        let (out, into) = split2(buf, &m.send, &m.recv);
        let mut xfers = [
            Xfer::Send { peer: m.to, tag: s.tag, data: out },
            Xfer::Recv { peer: m.from, tag: s.tag, sink: sink(m, into) },
        ];
        return t.exchange(&mut xfers, s.deadline);
    }
    let ranges: Vec<Range<usize>> = moves.iter().flat_map(|m| [m.send.clone(), m.recv.clone()]).collect();
    let mut pieces = carve(buf, &ranges).into_iter();
    let mut xfers = Vec::with_capacity(2 * moves.len());
    for m in moves {
        let (out, into) = (pieces.next().expect("two per move"), pieces.next().expect("two per move"));
        xfers.push(Xfer::Send { peer: m.to, tag: s.tag, data: &*out });
        xfers.push(Xfer::Recv { peer: m.from, tag: s.tag, sink: sink(m, into) });
    }
    t.exchange(&mut xfers, s.deadline)
}
