//! Exchanges where every rank talks to every other at once: all_to_all(v), the gather step of
//! reduce, and barrier. All transfers of one call go in one step, so links work in parallel.

use std::ops::Range;

use super::{carve, Step};
use crate::transport::single_copy::PeerRead;
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// Blocks of at least this many bytes between ranks of one host go by single copy: the
/// receiver reads them from the sender's buffer (`transport/single_copy.rs`).
pub(crate) const SINGLE_COPY_FROM: usize = 128 << 10;

/// Sends `send[send_blocks[p]]` to every peer p and receives `recv[recv_blocks[p]]` from it.
/// The caller copies this rank's own block.
///
/// A block of `SINGLE_COPY_FROM` bytes or more to a local peer that may read this rank's
/// memory goes by single copy, in up to three exchanges, all at once with every peer:
///  1. the sender sends the block's address and length (16 bytes) in its place;
///  2. the receiver reads the block from the sender's memory, and tells the sender whether it
///     could: one byte. The sender waits for it, so its buffer stays as it is until then;
///  3. only if the kernel refused the read: the sender sends the block as usual.
///
/// Both sides decide alike from the block's length, which they agree on in a correct call;
/// where they do not, the 16-byte message meets a block's length and fails as a mismatch.
pub(crate) fn all_to_all(
    t: &mut Transport,
    s: &Step,
    send: &[u8],
    send_blocks: &[Range<usize>],
    recv: &mut [u8],
    recv_blocks: &[Range<usize>],
) -> Result<(), LinkError> {
    let by_ref = |t: &Transport, p: usize, len: usize| p != s.rank && len >= SINGLE_COPY_FROM && t.can_read_peer(p);
    let give: Vec<bool> = (0..s.size).map(|p| by_ref(t, p, send_blocks[p].len())).collect();
    let take: Vec<bool> = (0..s.size).map(|p| by_ref(t, p, recv_blocks[p].len())).collect();
    let refs: Vec<[u8; 16]> = send_blocks.iter().map(|b| block_ref(&send[b.clone()])).collect();
    let mut theirs = vec![[0u8; 16]; s.size];
    let mut pieces = carve(recv, recv_blocks);
    let mut xfers = Vec::with_capacity(2 * s.size);
    // Visit peers in the order rank+1, rank+2, ... so that no peer is everyone's first.
    for d in 1..s.size {
        let p = (s.rank + d) % s.size;
        let data = if give[p] { &refs[p][..] } else { &send[send_blocks[p].clone()] };
        xfers.push(Xfer::Send { peer: p, tag: s.tag, data });
    }
    for (p, (piece, r)) in pieces.iter_mut().zip(theirs.iter_mut()).enumerate().filter(|&(p, _)| p != s.rank) {
        let sink = if take[p] { Sink::Copy(&mut r[..]) } else { Sink::Copy(piece) };
        xfers.push(Xfer::Recv { peer: p, tag: s.tag, sink });
    }
    t.exchange(&mut xfers, s.deadline)?;
    drop(xfers);
    if !give.iter().chain(&take).any(|&b| b) {
        return Ok(());
    }
    // 2. Read what was offered; answer every offer, and hear every answer.
    let mut read = vec![[0u8; 1]; s.size];
    for p in (0..s.size).filter(|&p| take[p]) {
        let (addr, len) = parse_ref(&theirs[p]);
        if len != pieces[p].len() {
            let detail = format!("it offered a block of {len} bytes where this rank receives {}", pieces[p].len());
            return Err(t.fail(LinkError::Mismatch { peer: p, detail }));
        }
        read[p][0] = u8::from(matches!(t.read_peer(p, addr, pieces[p])?, PeerRead::Done));
    }
    let mut answers = vec![[0u8; 1]; s.size];
    let mut xfers: Vec<Xfer<'_>> =
        (0..s.size).filter(|&p| take[p]).map(|p| Xfer::Send { peer: p, tag: s.tag, data: &read[p][..] }).collect();
    for (p, a) in answers.iter_mut().enumerate().filter(|&(p, _)| give[p]) {
        xfers.push(Xfer::Recv { peer: p, tag: s.tag, sink: Sink::Copy(&mut a[..]) });
    }
    t.exchange(&mut xfers, s.deadline)?;
    drop(xfers);
    // 3. Blocks whose read the kernel refused come through the ring.
    let mut xfers: Vec<Xfer<'_>> = (0..s.size)
        .filter(|&p| give[p] && answers[p][0] == 0)
        .map(|p| Xfer::Send { peer: p, tag: s.tag, data: &send[send_blocks[p].clone()] })
        .collect();
    for (p, piece) in pieces.iter_mut().enumerate().filter(|&(p, _)| take[p] && read[p][0] == 0) {
        xfers.push(Xfer::Recv { peer: p, tag: s.tag, sink: Sink::Copy(piece) });
    }
    if xfers.is_empty() {
        return Ok(());
    }
    t.exchange(&mut xfers, s.deadline)
}

/// A block's address in this process and its length, as the peer that reads it receives them.
fn block_ref(block: &[u8]) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&(block.as_ptr() as u64).to_le_bytes());
    r[8..].copy_from_slice(&(block.len() as u64).to_le_bytes());
    r
}

fn parse_ref(r: &[u8; 16]) -> (u64, usize) {
    let word = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().expect("8 bytes"));
    (word(0), word(8) as usize)
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
