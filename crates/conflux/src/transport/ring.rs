//! A one-way shared-memory link: a single-producer single-consumer byte ring per ordered pair.
//!
//! Protocol. `tail` (written only by the sender) and `head` (written only by the receiver) are
//! monotonically increasing byte positions; the ring offset is `pos % cap`. Bytes in
//! `[head, tail)` belong to the receiver, the rest of the ring to the sender. The sender writes
//! bytes, then publishes them with a Release store of `tail`; the receiver's Acquire load of
//! `tail` makes them visible. (Bytes written with non-temporal stores, `stream.rs`, are fenced
//! before that store, which Release alone would not order.) Symmetrically the receiver publishes freed space with a Release
//! store of `head`. After each publication the writer rings the other side's doorbell
//! (`wait.rs`), so that a sleeping peer wakes.
//!
//! The receiver publishes `head` lazily: once an eighth of the ring is freed, whenever it finds
//! nothing more to read, and before its rank waits for anything (`Transport::flush_heads`).
//! Published per message, `head` was a line crossing cores on every small message, both ways:
//! the receiver's store had to take it back from the sender, which reloads it while the ring
//! is over half full — always, when a broadcast's root runs ahead. Space a receiver freed but
//! has not published is thus at most an eighth of the ring, and only while its rank is busy
//! elsewhere, never while it waits: no wait can depend on it.
//!
//! Framing. The ring is cut into 64-byte records, and the sender only ever advances `tail` by
//! whole records. A payload of up to 32 bytes rides in its header's record, after the 32-byte
//! header: the whole message is one cache line crossing cores, as in Open MPI's shared-memory
//! "fast boxes" (it was two: an 8-byte broadcast at 2 ranks took 0.50 us, now 0.37). A
//! longer payload starts at the next record and is padded to a whole record. Either way every
//! payload starts 32-aligned, and no element (at most 8 bytes) straddles the wrap-around: a
//! receiver can reduce straight out of the ring, without a copy.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::frame::{encode_header, ByteSource, HEADER};
use super::shm::Segment;
use super::stream::{Copier, Streaming};
use super::wait::ring_doorbell;
use super::Advance;
use crate::call::Fingerprint;

const RECORD: usize = 64;
/// The longest payload that rides in its header's record.
const INLINE: usize = RECORD - HEADER;

fn round_up(x: usize) -> usize {
    x.div_ceil(RECORD) * RECORD
}

/// Progress of one outgoing message.
#[derive(Default, Clone, Copy)]
pub(crate) struct SendProgress {
    pub header_done: bool,
    pub done: usize,
    /// The trailing checksum (TCP with `CONFLUX_CHECKSUM`) once computed, and how much of it
    /// was written.
    pub crc: Option<u32>,
    pub crc_done: usize,
}

pub(crate) struct ShmTx {
    seg: Arc<Segment>,
    to: usize,
    tail_off: usize,
    head_off: usize,
    data_off: usize,
    /// Our own tail (only we write it).
    tail: u64,
    /// The last head we loaded; refreshed only when the ring looks full.
    head_seen: u64,
    /// How pieces of 2 KiB and more go into the ring: plain or streamed (`stream.rs`).
    copier: Copier,
}

impl ShmTx {
    pub fn new(seg: Arc<Segment>, from: usize, to: usize, streaming: Streaming) -> ShmTx {
        let l = seg.layout;
        let tail = seg.u64_at(l.tail(from, to)).load(Ordering::Acquire);
        ShmTx {
            tail_off: l.tail(from, to),
            head_off: l.head(from, to),
            data_off: l.ring_data(from, to),
            seg,
            to,
            tail,
            head_seen: tail,
            copier: Copier::new(streaming),
        }
    }

    /// Contiguous free bytes after our tail plus `claimed` written-but-unpublished bytes;
    /// always a multiple of RECORD.
    fn free_after(&mut self, claimed: usize) -> usize {
        let cap = self.seg.layout.ring_cap as u64;
        let tail = self.tail + claimed as u64;
        if cap - (tail - self.head_seen) < cap / 2 {
            self.head_seen = self.seg.u64_at(self.head_off).load(Ordering::Acquire);
        }
        // The receiver's head moves by whole elements, not records: round down, or a piece
        // padded up to a record could claim bytes the receiver has not read yet.
        let free = (cap - (tail - self.head_seen)).min(cap - tail % cap) as usize;
        free - free % RECORD
    }

    fn publish(&mut self, advance: usize) {
        self.tail += advance as u64;
        self.seg.u64_at(self.tail_off).store(self.tail, Ordering::Release);
        ring_doorbell(&self.seg, self.to);
    }

    /// Writes as much of the message as fits, up to about `budget` payload bytes.
    pub fn send(
        &mut self,
        (tag, call): (u64, Fingerprint),
        data: &[u8],
        st: &mut SendProgress,
        budget: usize,
    ) -> Advance {
        let cap = self.seg.layout.ring_cap as u64;
        let mut claimed = 0usize;
        let mut progressed = false;
        if !st.header_done {
            if self.free_after(0) < RECORD {
                return Advance::default();
            }
            let at = self.data_off + (self.tail % cap) as usize;
            // SAFETY: the RECORD bytes at our tail are free ring space (checked above), which
            // only the sender touches until it publishes them.
            let record = unsafe { self.seg.bytes_mut(at, RECORD) };
            record[..HEADER].copy_from_slice(&encode_header(tag, data.len(), call));
            if data.len() <= INLINE {
                record[HEADER..HEADER + data.len()].copy_from_slice(data);
                st.done = data.len();
            }
            st.header_done = true;
            claimed = RECORD;
            progressed = true;
        }
        let mut moved = 0;
        while st.done < data.len() && moved < budget {
            let free = self.free_after(claimed);
            let remaining = data.len() - st.done;
            // A piece is the rest of the payload or a whole number of records.
            let n = if round_up(remaining) <= free { remaining } else { free };
            let n = n.min(round_up(budget - moved));
            if n == 0 {
                break;
            }
            let at = self.data_off + ((self.tail + claimed as u64) % cap) as usize;
            // SAFETY: these n bytes lie in free ring space past what we already claimed
            // (free_after checked them against the receiver's head), which only the sender
            // touches until it publishes them.
            let into = unsafe { self.seg.bytes_mut(at, n) };
            self.copier.copy(into, &data[st.done..st.done + n]);
            st.done += n;
            moved += n;
            claimed += round_up(n);
            progressed = true;
        }
        if claimed > 0 {
            self.publish(claimed);
        }
        Advance { moved: progressed, done: st.header_done && st.done == data.len() }
    }
}

pub(crate) struct ShmRx {
    seg: Arc<Segment>,
    from: usize,
    tail_off: usize,
    head_off: usize,
    data_off: usize,
    /// Our own head (only we write it).
    head: u64,
    /// The head the sender can see.
    published: u64,
    /// The last tail we loaded.
    tail_seen: u64,
}

impl ShmRx {
    pub fn new(seg: Arc<Segment>, from: usize, to: usize) -> ShmRx {
        let l = seg.layout;
        let head = seg.u64_at(l.head(from, to)).load(Ordering::Acquire);
        ShmRx {
            tail_off: l.tail(from, to),
            head_off: l.head(from, to),
            data_off: l.ring_data(from, to),
            seg,
            from,
            head,
            published: head,
            tail_seen: head,
        }
    }

    /// Whether the sender has published bytes this side has not consumed: a fresh look at
    /// `tail`, not the last one.
    pub fn has_unread(&self) -> bool {
        self.tail_seen != self.head || self.seg.u64_at(self.tail_off).load(Ordering::Acquire) != self.head
    }

    /// Publishes the space freed so far, if the sender cannot see all of it yet.
    pub fn flush(&mut self) {
        if self.published != self.head {
            self.published = self.head;
            self.seg.u64_at(self.head_off).store(self.head, Ordering::Release);
            ring_doorbell(&self.seg, self.from);
        }
    }
}

impl ByteSource for ShmRx {
    fn header_span(len: usize) -> usize {
        if len <= INLINE {
            HEADER
        } else {
            RECORD
        }
    }

    fn pad(len: usize) -> usize {
        if len <= INLINE {
            INLINE - len
        } else {
            round_up(len) - len
        }
    }

    fn available(&mut self) -> Result<&[u8], super::LinkError> {
        if self.tail_seen == self.head {
            self.tail_seen = self.seg.u64_at(self.tail_off).load(Ordering::Acquire);
            if self.tail_seen == self.head {
                self.flush();
            }
        }
        let cap = self.seg.layout.ring_cap as u64;
        let to_end = cap - self.head % cap;
        let n = (self.tail_seen - self.head).min(to_end) as usize;
        let at = self.data_off + (self.head % cap) as usize;
        // SAFETY: bytes in [head, tail) were published by the sender with a Release store that
        // our Acquire load of tail saw; the sender does not touch them again until we move head
        // past them, and the slice is gone before we do (consume takes &mut self).
        Ok(unsafe { self.seg.bytes(at, n) })
    }

    fn consume(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.head += n as u64;
        if self.head - self.published >= (self.seg.layout.ring_cap / 8) as u64 {
            self.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The ring protocol in one process: a sender and a receiver taking turns with small
    //! budgets and a ring far smaller than the messages, so every wrap-around and every
    //! partial read (a reducing receiver takes whole elements, not records) is exercised.
    use super::*;
    use crate::dtype::{DataType, ReduceOp};
    use crate::transport::frame::{RxState, Sink};
    use crate::transport::shm::Layout;
    use proptest::prelude::*;

    /// How the receiver takes each message: copied, summed into zeros, or summed with a
    /// separate source of ones (`Sink::ReduceFrom`).
    #[derive(Debug, Clone, Copy)]
    enum Take {
        Copy,
        Reduce,
        ReduceFrom,
    }

    fn pass(lens: &[usize], budget: usize, take: Take) {
        let seg = Arc::new(Segment::create(Layout::new(2, 4096, 4096)).unwrap());
        let (mut tx, mut rx) = (ShmTx::new(seg.clone(), 0, 1, Streaming::Auto), ShmRx::new(seg, 0, 1));
        let mut rxs = RxState::default();
        for (m, &len) in lens.iter().enumerate() {
            let len = len / 4 * 4;
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + m) as u8).collect();
            let mut got = vec![0u8; len];
            let ones: Vec<u8> = (0..len / 4).flat_map(|_| 1i32.to_le_bytes()).collect();
            let (mut st, mut sent, mut received) = (SendProgress::default(), false, false);
            let mut rounds = 0;
            while !(sent && received) {
                if !sent {
                    sent = tx.send((m as u64, Fingerprint::NONE), &data, &mut st, budget).done;
                }
                let (dtype, op) = (DataType::I32, ReduceOp::Sum);
                let mut sink = match take {
                    Take::Copy => Sink::Copy(&mut got),
                    Take::Reduce => Sink::Reduce { buf: &mut got, dtype, op },
                    Take::ReduceFrom => Sink::ReduceFrom { buf: &mut got, src: &ones, dtype, op },
                };
                if !received {
                    received = rxs
                        .step(&mut rx, 0, (m as u64, &Default::default()), &mut sink, budget.max(3) - 3)
                        .unwrap()
                        .done;
                }
                rounds += 1;
                assert!(rounds < 100_000, "no progress");
            }
            // Summed into zeros is the data itself; with ones, every i32 of it plus one.
            let want: Vec<u8> = match take {
                Take::Copy | Take::Reduce => data,
                Take::ReduceFrom => data
                    .chunks(4)
                    .flat_map(|c| i32::from_le_bytes(c.try_into().unwrap()).wrapping_add(1).to_le_bytes())
                    .collect(),
            };
            assert_eq!(got, want, "message {m}, {take:?}");
        }
    }

    #[test]
    fn short_payloads_ride_in_their_header_record() {
        // Around the inline limit, copied and reduced, with room for only a few records.
        pass(&[0, 4, 8, 28, 32, 36, 60, 64, 68, 0, 32, 36], 4096, Take::Copy);
        pass(&[0, 4, 8, 28, 32, 36, 60, 64, 68, 0, 32, 36], 8, Take::Reduce);
        pass(&[0, 4, 8, 28, 32, 36, 60, 64, 68, 0, 32, 36], 8, Take::ReduceFrom);
    }

    #[test]
    fn messages_cross_between_threads_whole_and_in_order() {
        // A sender and a receiver running at once on a ring of 64 records, as ranks do:
        // messages in their header's record, longer ones, and ones larger than the ring, which
        // go in pieces.
        let seg = Arc::new(Segment::create(Layout::new(2, 4096, 4096)).unwrap());
        let (mut tx, mut rx) = (ShmTx::new(seg.clone(), 0, 1, Streaming::Auto), ShmRx::new(seg, 0, 1));
        const LENS: [usize; 9] = [0, 8, 8, 24, 32, 64, 200, 1000, 5000];
        const N: usize = 100_000;
        let payload = |m: usize| -> Vec<u8> { (0..LENS[m % LENS.len()]).map(|i| (i * 31 + m) as u8).collect() };
        let sender = std::thread::spawn(move || {
            for m in 0..N {
                let (data, mut st) = (payload(m), SendProgress::default());
                while !tx.send((m as u64, Fingerprint::NONE), &data, &mut st, 4096).done {
                    std::hint::spin_loop();
                }
            }
        });
        let mut rxs = RxState::default();
        for m in 0..N {
            let want = payload(m);
            let mut got = vec![0u8; want.len()];
            while !rxs.step(&mut rx, 0, (m as u64, &Default::default()), &mut Sink::Copy(&mut got), 4096).unwrap().done
            {
                std::hint::spin_loop();
            }
            assert_eq!(got, want, "message {m}");
        }
        sender.join().unwrap();
    }

    proptest! {
        #[test]
        fn messages_arrive_whole_and_in_order(
            lens in prop::collection::vec(0usize..20_000, 1..12),
            budget in 4usize..9000,
            take in prop_oneof![Just(Take::Copy), Just(Take::Reduce), Just(Take::ReduceFrom)],
        ) {
            pass(&lens, budget, take);
        }
    }
}
