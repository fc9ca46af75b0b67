//! A one-way shared-memory link: a single-producer single-consumer byte ring per ordered pair.
//!
//! Protocol. `tail` (written only by the sender) and `head` (written only by the receiver) are
//! monotonically increasing byte positions; the ring offset is `pos % cap`. Bytes in
//! `[head, tail)` belong to the receiver, the rest of the ring to the sender. The sender writes
//! bytes, then publishes them with a Release store of `tail`, or first of a header record's
//! stamp (Stamps below); the receiver's Acquire load of either makes them visible. (Bytes
//! written with non-temporal stores, `stream.rs`, are fenced before those stores, which Release
//! alone would not order.) The one word of the sender's part that the receiver reads is the
//! stamp of the next header record, atomically. Symmetrically the receiver publishes freed
//! space with a Release store of `head`. After each publication the writer rings the other
//! side's doorbell (`wait.rs`), so that a sleeping peer wakes.
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
//! whole records. A message starts with a header record: the 32-byte header, then up to 24
//! payload bytes, then the record's stamp (below) in its last 8 bytes. A payload of up to 24
//! bytes rides there, and the whole message is one cache line crossing cores, as in Open MPI's
//! shared-memory "fast boxes" (it was two: an 8-byte broadcast at 2 ranks took 0.50 us, then
//! 0.37). A longer payload starts at the next record and is padded to a whole record. Either
//! way every payload starts 32-aligned, and no element (at most 8 bytes) straddles the
//! wrap-around: a receiver can reduce straight out of the ring, without a copy.
//!
//! Stamps. A receiver at a message boundary looks first at the stamp of the header record
//! there, not at `tail`. The sender writes the header record after the payload that goes with
//! it in the same call (the whole payload, when it all fits), stores the stamp (Release) after
//! that, and publishes `tail` last. The stamp says which:
//! `key ^ (pos | 3)` for a whole message at ring position `pos`, `key ^ (pos | 2)` for a
//! header whose payload follows through `tail`; anything else, nothing written yet. So a small
//! message moves one line between the cores, and `tail`'s line, which the receiver no longer
//! polls, stays in the sender's cache: polling it made it cross both ways on every message,
//! and the sender's next store of it waited for the line to come back (with the vCPUs on far
//! cores, an 8-byte broadcast at 2 ranks took 0.25 us a call against Open MPI's 0.13; now
//! 0.21, and 2-rank broadcast and reduce of 8 B-4 KiB take 0.76-0.97 of their old time there,
//! the same near, in two labelled runs of 12 and 17 far iterations). A stale
//! word in that place (a payload a lap ago) can equal the stamp only by chance, 2^-64 a look:
//! positions never repeat, and `key` is random per segment (`Segment::ring_key`). The receiver
//! knows the boundaries because it reads every header's length as it reaches it; the sender
//! only ever stores that word atomically when it is a header's, and the receiver only ever
//! polls it there. The price: a payload of 25-32 bytes, which rode in its header record,
//! now takes a second one (a 32-byte broadcast at 2 ranks, vCPUs near: 1.19x the time).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::frame::{encode_header, ByteSource, HEADER};
use super::shm::Segment;
use super::stream::{Copier, Streaming};
use super::wait::ring_doorbell;
use super::Advance;
use crate::call::Fingerprint;

const RECORD: usize = 64;
/// Where a header record keeps its stamp (Stamps above): its last word.
const STAMP_AT: usize = RECORD - 8;
/// The longest payload that rides in its header's record, between the header and the stamp.
const INLINE: usize = STAMP_AT - HEADER;

/// The stamp of a header record at ring position `pos` (Stamps above).
fn stamp(key: u64, pos: u64, whole: bool) -> u64 {
    key ^ (pos | 2 | u64::from(whole))
}

/// Where ring position `pos` lies in the segment, for a ring whose data starts at `data_off`.
fn offset(data_off: usize, cap: u64, pos: u64) -> usize {
    data_off + (pos % cap) as usize
}

/// Where a message whose header record is at `pos` ends: the next message's header record.
fn message_end(pos: u64, len: u64) -> u64 {
    pos + RECORD as u64 + if len > INLINE as u64 { round_up(len as usize) as u64 } else { 0 }
}

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
    /// The segment's stamp key (Stamps above).
    key: u64,
}

impl ShmTx {
    pub fn new(seg: Arc<Segment>, from: usize, to: usize, streaming: Streaming) -> ShmTx {
        let l = seg.layout;
        let tail = seg.u64_at(l.tail(from, to)).load(Ordering::Acquire);
        let key = seg.ring_key();
        ShmTx {
            tail_off: l.tail(from, to),
            head_off: l.head(from, to),
            data_off: l.ring_data(from, to),
            seg,
            to,
            tail,
            head_seen: tail,
            copier: Copier::new(streaming),
            key,
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
        // The header record this call claims, written after the payload that goes with it.
        let mut header = None;
        if !st.header_done {
            if self.free_after(0) < RECORD {
                return Advance::default();
            }
            header = Some(self.tail);
            st.header_done = true;
            claimed = RECORD;
            progressed = true;
        }
        let mut moved = 0;
        // A payload that rides in its header record goes in with the header, below.
        while data.len() > INLINE && st.done < data.len() && moved < budget {
            let free = self.free_after(claimed);
            let remaining = data.len() - st.done;
            // A piece is the rest of the payload or a whole number of records.
            let n = if round_up(remaining) <= free { remaining } else { free };
            let n = n.min(round_up(budget - moved));
            if n == 0 {
                break;
            }
            let at = offset(self.data_off, cap, self.tail + claimed as u64);
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
        if let Some(pos) = header {
            // Last, in one burst: a receiver waiting for this message polls this record's
            // stamp, and a header written first, while it polls, would cross between the cores
            // twice (a 512-byte broadcast at 2 ranks took 1.15x the time).
            let at = offset(self.data_off, cap, pos);
            // SAFETY: the RECORD bytes at `pos` are free ring space (checked above), which only
            // the sender touches until it publishes them; the slice leaves out the stamp, which
            // the receiver may be polling and which is stored atomically below.
            let record = unsafe { self.seg.bytes_mut(at, STAMP_AT) };
            record[..HEADER].copy_from_slice(&encode_header(tag, data.len(), call));
            if data.len() <= INLINE {
                crate::bytes::copy(&mut record[HEADER..HEADER + data.len()], data);
                st.done = data.len();
            }
            // After the header and every payload byte written so far (streamed ones are fenced
            // by the copier), before `tail`.
            let whole = st.done == data.len();
            self.seg.u64_at(at + STAMP_AT).store(stamp(self.key, pos, whole), Ordering::Release);
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
    /// How far we know the sender has written: the last `tail` loaded, or what a stamp
    /// published (a whole message, or its header record).
    tail_seen: u64,
    /// Where the next message's header record starts (Stamps above).
    next: u64,
    /// The segment's stamp key.
    key: u64,
}

/// What the stamp of a header record says (Stamps above).
#[derive(PartialEq)]
enum Stamped {
    /// Nothing written there yet.
    Nothing,
    /// The header, its payload following through `tail`.
    Header,
    /// The whole message.
    Whole,
}

impl ShmRx {
    /// The receiving end of the ring from `from` to `to`, which must be at a message boundary:
    /// a fresh ring (every segment is made for one communicator). A published `head` can lie
    /// mid-message, so a receiver re-created on a ring in use would poll a payload word.
    pub fn new(seg: Arc<Segment>, from: usize, to: usize) -> ShmRx {
        let l = seg.layout;
        let head = seg.u64_at(l.head(from, to)).load(Ordering::Acquire);
        let key = seg.ring_key();
        ShmRx {
            tail_off: l.tail(from, to),
            head_off: l.head(from, to),
            data_off: l.ring_data(from, to),
            seg,
            from,
            head,
            published: head,
            tail_seen: head,
            next: head,
            key,
        }
    }

    /// Where the header record at `next` lies in the segment.
    fn next_at(&self) -> usize {
        offset(self.data_off, self.seg.layout.ring_cap as u64, self.next)
    }

    /// What the stamp of the header record at `next` says (Acquire: with it, the header).
    fn stamped(&self) -> Stamped {
        let word = self.seg.u64_at(self.next_at() + STAMP_AT).load(Ordering::Acquire);
        if word == stamp(self.key, self.next, true) {
            Stamped::Whole
        } else if word == stamp(self.key, self.next, false) {
            Stamped::Header
        } else {
            Stamped::Nothing
        }
    }

    /// The payload length in the header record at `next`, which must be written (stamped, or
    /// behind a loaded `tail`).
    fn next_len(&self) -> u64 {
        // SAFETY: the header's bytes were written before its stamp or `tail` was stored
        // (Release), which this side loaded (Acquire); the sender does not touch them again
        // until head passes them, which cannot happen during this read.
        let len = unsafe { self.seg.bytes(self.next_at() + 8, 8) };
        u64::from_le_bytes(len.try_into().expect("8 bytes"))
    }

    /// Whether the sender has published bytes this side has not consumed: a fresh look, at
    /// the next header record's stamp at a boundary, else at `tail`.
    pub fn has_unread(&self) -> bool {
        if self.tail_seen != self.head {
            return true;
        }
        // At a boundary the sender stamps a header before it publishes anything after it.
        if self.head == self.next {
            return self.stamped() != Stamped::Nothing;
        }
        // It may lag behind head (see `available`).
        self.seg.u64_at(self.tail_off).load(Ordering::Acquire) > self.head
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
            // The rest of the header record, its stamp included.
            RECORD - HEADER - len
        } else {
            round_up(len) - len
        }
    }

    fn available(&mut self) -> Result<&[u8], super::LinkError> {
        if self.head == self.next {
            // A boundary: the stamp first, `tail` only for a header whose payload follows.
            let mut whole = false;
            if self.tail_seen == self.head {
                match self.stamped() {
                    Stamped::Nothing => {
                        self.flush();
                        return Ok(&[]);
                    }
                    Stamped::Whole => whole = true,
                    Stamped::Header => {
                        let tail = self.seg.u64_at(self.tail_off).load(Ordering::Acquire);
                        self.tail_seen = tail.max(self.head + RECORD as u64);
                    }
                }
            }
            self.next = message_end(self.next, self.next_len());
            if whole {
                self.tail_seen = self.next;
            }
        } else if self.tail_seen == self.head {
            // `tail` may lag behind head: a stamp, stored before it, took this side further.
            self.tail_seen = self.seg.u64_at(self.tail_off).load(Ordering::Acquire).max(self.head);
            if self.tail_seen == self.head {
                self.flush();
            }
        }
        let cap = self.seg.layout.ring_cap as u64;
        let to_end = cap - self.head % cap;
        let n = (self.tail_seen - self.head).min(to_end) as usize;
        let at = offset(self.data_off, cap, self.head);
        // SAFETY: bytes in [head, tail_seen) were published by the sender with a Release store
        // (`tail`, or a stamp: of a whole message, or of its header record) that our Acquire
        // load saw; the sender does not touch them again until we move head past them, and the
        // slice is gone before we do (consume takes &mut self).
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
        pass(&[0, 4, 8, 20, 24, 28, 32, 36, 60, 64, 68, 0, 24, 28], 4096, Take::Copy);
        pass(&[0, 4, 8, 20, 24, 28, 32, 36, 60, 64, 68, 0, 24, 28], 8, Take::Reduce);
        pass(&[0, 4, 8, 20, 24, 28, 32, 36, 60, 64, 68, 0, 24, 28], 8, Take::ReduceFrom);
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

    #[test]
    fn a_whole_message_is_read_by_its_stamp_and_a_partial_one_waits_for_tail() {
        let seg = Arc::new(Segment::create(Layout::new(2, 4096, 4096)).unwrap());
        let (mut tx, mut rx) = (ShmTx::new(seg.clone(), 0, 1, Streaming::Never), ShmRx::new(seg.clone(), 0, 1));
        let tail = seg.u64_at(seg.layout.tail(0, 1));
        // Whole messages, one in its header record and one of three records: with `tail` put
        // back where it was, as if its store were not yet visible, the receiver takes each whole.
        for (m, len) in [(0u64, 16usize), (1, 100)] {
            let data: Vec<u8> = (0..len).map(|i| ((i * 13) as u8).wrapping_add(m as u8)).collect();
            let before = tail.load(Ordering::Relaxed);
            assert!(tx.send((m, Fingerprint::NONE), &data, &mut SendProgress::default(), 4096).done);
            let after = tail.swap(before, Ordering::Relaxed);
            assert!(rx.has_unread(), "message {m}: the stamp says it is there");
            let mut got = vec![0u8; len];
            let step = RxState::default().step(&mut rx, 0, (m, &Default::default()), &mut Sink::Copy(&mut got), 4096);
            assert!(step.unwrap().done, "message {m} taken by its stamp alone");
            assert_eq!(got, data);
            tail.store(after, Ordering::Relaxed);
        }
        assert!(!rx.has_unread());
        // A message sent in pieces (a budget of one record): its header is stamped, but its
        // payload is there only as far as `tail` says.
        let data = vec![7u8; 1000];
        let mut st = SendProgress::default();
        let before = tail.load(Ordering::Relaxed);
        assert!(!tx.send((2, Fingerprint::NONE), &data, &mut st, 64).done);
        tail.store(before, Ordering::Relaxed);
        let (mut rxs, mut got) = (RxState::default(), vec![0u8; 1000]);
        let step = rxs.step(&mut rx, 0, (2, &Default::default()), &mut Sink::Copy(&mut got), 4096).unwrap();
        assert!(!step.done && got.iter().all(|&b| b == 0), "nothing of the payload before tail");
        tail.store(before + 128, Ordering::Release);
        rxs.step(&mut rx, 0, (2, &Default::default()), &mut Sink::Copy(&mut got), 4096).unwrap();
        assert!(got[..64].iter().all(|&b| b == 7) && got[64..].iter().all(|&b| b == 0), "the published piece only");
        while !tx.send((2, Fingerprint::NONE), &data, &mut st, 4096).done {}
        assert!(rxs.step(&mut rx, 0, (2, &Default::default()), &mut Sink::Copy(&mut got), 4096).unwrap().done);
        assert_eq!(got, data);
    }

    #[test]
    fn a_stamp_from_the_last_lap_is_not_a_message() {
        // A lap of one-record messages: every record of the ring then holds a stamp of a whole
        // message, one lap old. At the next lap's first boundary the receiver finds nothing.
        let seg = Arc::new(Segment::create(Layout::new(2, 4096, 4096)).unwrap());
        let (mut tx, mut rx) = (ShmTx::new(seg.clone(), 0, 1, Streaming::Never), ShmRx::new(seg.clone(), 0, 1));
        let mut rxs = RxState::default();
        let mut take = |rx: &mut ShmRx, m: u64| {
            let mut got = [0u8; 8];
            let step = rxs.step(rx, 0, (m, &Default::default()), &mut Sink::Copy(&mut got), 4096).unwrap();
            (step.done, got)
        };
        for m in 0..4096 / RECORD as u64 {
            assert!(tx.send((m, Fingerprint::NONE), &m.to_le_bytes(), &mut SendProgress::default(), 4096).done);
            assert_eq!(take(&mut rx, m), (true, m.to_le_bytes()));
        }
        assert!(!rx.has_unread(), "last lap's stamp taken for a message");
        assert!(!take(&mut rx, 64).0);
        assert!(tx.send((64, Fingerprint::NONE), &[9; 8], &mut SendProgress::default(), 4096).done);
        assert!(rx.has_unread());
        assert_eq!(take(&mut rx, 64), (true, [9; 8]));
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
