//! The transfers of one step, each block of `SINGLE_COPY_FROM` bytes or more to or from a
//! local peer going by single copy: the receiver reads it from the sender's memory
//! (`transport/single_copy.rs`), one copy where a ring takes two.
//!
//! Such a block takes one exchange with every peer of the step, and a second only where the
//! kernel refused a read:
//!  1. the sender sends the block's address and length (16 bytes) in its place, and waits for
//!     one byte back; its buffer stays as it is until then. The receiver, as soon as the 16
//!     bytes are in, reads the block from the sender's memory and sends that byte: whether it
//!     could. Every read is done as its address arrives, whichever peer's comes first, while
//!     the other transfers go on (`Transport::exchange_then`): with more ranks than cores, a
//!     rank reads whatever its peers have offered when it gets a core, instead of waiting for
//!     the last peer's offer, and then for every answer, in two exchanges.
//!  2. only if the kernel refused the read, the sender sends the block through the ring.
//!
//! Both sides decide alike from the block's length, which they agree on in a correct call;
//! where they do not, the 16-byte message meets a block's length and fails as a mismatch.

use smallvec::SmallVec;

use super::Step;
use crate::transport::single_copy::PeerRead;
use crate::transport::{LinkError, Sink, Then, Transport, Xfer};

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
    let mut heard = vec![[0u8; 1]; parts.len()];
    let mut read_ok = vec![false; parts.len()];
    // By part, the peer this rank offers a block to.
    let offered: Vec<Option<usize>> = (parts.iter().zip(&by_ref))
        .map(|(p, &r)| match p {
            Part::Give { peer, .. } if r => Some(*peer),
            _ => None,
        })
        .collect();
    {
        // 1. Each part's message, its block or in its place the address; then, held back, an
        // answer for each block to read; then the answers awaited for the blocks offered.
        let mut xfers: Vec<Xfer<'_>> = Vec::with_capacity(2 * parts.len());
        let mut reads = Vec::new();
        for (i, ((p, addr), th)) in parts.iter_mut().zip(&refs).zip(theirs.iter_mut()).enumerate() {
            match p {
                Part::Give { peer, data } => {
                    let data = if by_ref[i] { &addr[..] } else { data };
                    xfers.push(Xfer::Send { peer: *peer, tag, data });
                }
                Part::Take { peer, into } => {
                    if by_ref[i] {
                        reads.push(Read { part: i, offer: xfers.len(), answer: 0, peer: *peer, into });
                        xfers.push(Xfer::Recv { peer: *peer, tag, sink: Sink::Copy(&mut th[..]) });
                    } else {
                        xfers.push(Xfer::Recv { peer: *peer, tag, sink: Sink::Copy(into) });
                    }
                }
            }
        }
        for r in &mut reads {
            r.answer = xfers.len();
            xfers.push(Xfer::Send { peer: r.peer, tag, data: NOT_READ });
        }
        for (h, &peer) in heard.iter_mut().zip(&offered) {
            if let Some(peer) = peer {
                xfers.push(Xfer::Recv { peer, tag, sink: Sink::Copy(&mut h[..]) });
            }
        }
        let mut reader = Reader { open: vec![true; xfers.len()], reads, read_ok: &mut read_ok, tag };
        for r in &reader.reads {
            reader.open[r.answer] = false;
        }
        t.exchange_then(&mut xfers, s.deadline, &mut reader)?;
    }
    // 2. Blocks whose read the kernel refused come through the ring.
    let refused = |i: usize, p: &Part<'_>| {
        by_ref[i]
            && match p {
                Part::Give { .. } => heard[i][0] == 0,
                Part::Take { .. } => !read_ok[i],
            }
    };
    let mut xfers: Vec<Xfer<'_>> =
        parts.iter_mut().enumerate().filter(|(i, p)| refused(*i, p)).map(|(_, p)| p.whole(tag)).collect();
    if xfers.is_empty() {
        return Ok(());
    }
    t.exchange(&mut xfers, s.deadline)
}

/// The answers a reader sends: it read the block, or the kernel refused.
const READ: &[u8] = &[1];
const NOT_READ: &[u8] = &[0];

/// A block this rank reads from a peer's memory: part `part` of the step, whose address comes
/// in transfer `offer`, and whose answer goes out in transfer `answer`.
struct Read<'a> {
    part: usize,
    offer: usize,
    answer: usize,
    peer: usize,
    into: &'a mut [u8],
}

/// Reads each block as its address arrives and releases its answer (`Then`).
struct Reader<'r, 'a> {
    /// Whether each transfer may start: the answers wait for their reads.
    open: Vec<bool>,
    reads: Vec<Read<'a>>,
    /// By part: whether its block was read.
    read_ok: &'r mut [bool],
    tag: u64,
}

impl<'a> Then<'a> for Reader<'_, 'a> {
    fn ready(&self, i: usize) -> bool {
        self.open[i]
    }

    fn done(&mut self, t: &mut Transport, i: usize, xfers: &mut [Xfer<'a>]) -> Result<(), LinkError> {
        let Some(r) = self.reads.iter_mut().find(|r| r.offer == i) else { return Ok(()) };
        let Xfer::Recv { sink: Sink::Copy(offer), .. } = &xfers[i] else { unreachable!("an offer is received") };
        let (addr, len) = parse_ref(offer[..].try_into().expect("an offer has 16 bytes"));
        if len != r.into.len() {
            let detail = format!("it offered a block of {len} bytes where this rank receives {}", r.into.len());
            return Err(LinkError::Mismatch { peer: r.peer, detail });
        }
        let ok = matches!(t.read_peer(r.peer, addr, r.into)?, PeerRead::Done);
        self.read_ok[r.part] = ok;
        xfers[r.answer] = Xfer::Send { peer: r.peer, tag: self.tag, data: if ok { READ } else { NOT_READ } };
        self.open[r.answer] = true;
        Ok(())
    }
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
