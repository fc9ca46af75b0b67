//! The transfers of one step, each block of `SINGLE_COPY_FROM` bytes or more to or from a
//! local peer going by single copy: the receiver reads it from the sender's memory
//! (`transport/single_copy.rs`), one copy where a ring takes two.
//!
//! Such a block takes up to three exchanges, each with every peer of the step at once:
//!  1. the sender sends the block's address and length (16 bytes) in its place;
//!  2. the receiver reads the block from the sender's memory and tells the sender whether it
//!     could: one byte. The sender waits for it, so its buffer stays as it is until then;
//!  3. only if the kernel refused the read, the sender sends the block through the ring.
//!
//! Both sides decide alike from the block's length, which they agree on in a correct call;
//! where they do not, the 16-byte message meets a block's length and fails as a mismatch.

use smallvec::SmallVec;

use super::Step;
use crate::transport::single_copy::PeerRead;
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// Blocks of at least this many bytes between ranks of one host go by single copy.
pub(crate) const SINGLE_COPY_FROM: usize = 128 << 10;

/// One transfer of a step.
pub(crate) enum Part<'a> {
    /// Sends `data` to `peer`.
    Give { peer: usize, data: &'a [u8] },
    /// Receives `into.len()` bytes from `peer` into `into`.
    Take { peer: usize, into: &'a mut [u8] },
}

impl Part<'_> {
    fn peer(&self) -> usize {
        match self {
            Part::Give { peer, .. } | Part::Take { peer, .. } => *peer,
        }
    }
    fn len(&self) -> usize {
        match self {
            Part::Give { data, .. } => data.len(),
            Part::Take { into, .. } => into.len(),
        }
    }
    /// The transfer as a plain message through the link.
    fn whole(&mut self, tag: u64) -> Xfer<'_> {
        match self {
            Part::Give { peer, data } => Xfer::Send { peer: *peer, tag, data },
            Part::Take { peer, into } => Xfer::Recv { peer: *peer, tag, sink: Sink::Copy(into) },
        }
    }
}

/// Runs the transfers of one step (`Transport::exchange`), large ones to and from local peers
/// by single copy. Transfers go in the order given.
pub(crate) fn exchange(t: &mut Transport, s: &Step, parts: &mut [Part<'_>]) -> Result<(), LinkError> {
    let tag = s.tag;
    let qualifies = |t: &Transport, p: &Part<'_>| p.len() >= SINGLE_COPY_FROM && t.can_read_peer(p.peer());
    if !parts.iter().any(|p| qualifies(t, p)) {
        // Small blocks, or no local peer to read from: one exchange, nothing else allocated.
        let mut xfers: SmallVec<[Xfer<'_>; 8]> = parts.iter_mut().map(|p| p.whole(tag)).collect();
        return t.exchange(&mut xfers, s.deadline);
    }
    let by_ref: Vec<bool> = parts.iter().map(|p| qualifies(t, p)).collect();
    let refs: Vec<[u8; 16]> = parts
        .iter()
        .map(|p| match p {
            Part::Give { data, .. } => block_ref(data),
            Part::Take { .. } => [0; 16],
        })
        .collect();
    let mut theirs = vec![[0u8; 16]; parts.len()];
    // 1. Blocks, and in the place of large ones their address.
    let mut xfers: Vec<Xfer<'_>> = parts
        .iter_mut()
        .zip(&by_ref)
        .zip(&refs)
        .zip(theirs.iter_mut())
        .map(|(((p, &r), addr), th)| match p {
            Part::Give { peer, data } => Xfer::Send { peer: *peer, tag, data: if r { &addr[..] } else { data } },
            Part::Take { peer, into } => {
                Xfer::Recv { peer: *peer, tag, sink: Sink::Copy(if r { &mut th[..] } else { into }) }
            }
        })
        .collect();
    t.exchange(&mut xfers, s.deadline)?;
    drop(xfers);
    // 2. Read what was offered; answer every offer, and hear every answer.
    let mut read = vec![[0u8; 1]; parts.len()];
    for (i, p) in parts.iter_mut().enumerate().filter(|&(i, _)| by_ref[i]) {
        if let Part::Take { peer, into } = p {
            let (addr, len) = parse_ref(&theirs[i]);
            if len != into.len() {
                let detail = format!("it offered a block of {len} bytes where this rank receives {}", into.len());
                return Err(t.fail(LinkError::Mismatch { peer: *peer, detail }));
            }
            read[i][0] = u8::from(matches!(t.read_peer(*peer, addr, into)?, PeerRead::Done));
        }
    }
    let mut answers = vec![[0u8; 1]; parts.len()];
    let mut xfers: Vec<Xfer<'_>> = parts
        .iter()
        .zip(read.iter().zip(answers.iter_mut()))
        .zip(&by_ref)
        .filter(|(_, &r)| r)
        .map(|((p, (said, heard)), _)| match p {
            Part::Take { peer, .. } => Xfer::Send { peer: *peer, tag, data: &said[..] },
            Part::Give { peer, .. } => Xfer::Recv { peer: *peer, tag, sink: Sink::Copy(&mut heard[..]) },
        })
        .collect();
    t.exchange(&mut xfers, s.deadline)?;
    drop(xfers);
    // 3. Blocks whose read the kernel refused come through the ring.
    let refused = |i: usize, p: &Part<'_>| {
        by_ref[i]
            && match p {
                Part::Give { .. } => answers[i][0] == 0,
                Part::Take { .. } => read[i][0] == 0,
            }
    };
    let mut xfers: Vec<Xfer<'_>> =
        parts.iter_mut().enumerate().filter(|(i, p)| refused(*i, p)).map(|(_, p)| p.whole(tag)).collect();
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
