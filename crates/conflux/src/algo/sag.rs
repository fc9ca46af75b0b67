//! Broadcast as scatter + all-gather (van de Geijn): the root sends block p of the message to
//! rank p, then a ring all-gather completes every rank's copy. The root sends each byte once
//! and every link carries (N-1)/N of the message, against the chain's pipeline fill: for large
//! messages on many ranks.

use super::{even_blocks, ring, Circle, Step};
use crate::transport::{LinkError, Sink, Transport, Xfer};

pub(crate) fn broadcast(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    root: usize,
    esize: usize,
) -> Result<(), LinkError> {
    let blocks = even_blocks(buf.len() / esize, s.size, esize);
    if s.rank == root {
        let mut sends: Vec<Xfer<'_>> = (0..s.size)
            .filter(|&p| p != root)
            .map(|p| Xfer::Send { peer: p, tag: s.tag, data: &buf[blocks[p].clone()] })
            .collect();
        t.exchange(&mut sends, s.deadline)?;
    } else {
        let sink = Sink::Copy(&mut buf[blocks[s.rank].clone()]);
        t.exchange(&mut [Xfer::Recv { peer: root, tag: s.tag, sink }], s.deadline)?;
    }
    ring::all_gather(t, s, &Circle::whole(s), buf, &blocks, 0)
}
