//! What every message on a link carries, and the receive logic shared by both link types.
//!
//! A message is a 32-byte header (tag u64, payload length u64, the call's fingerprint as two
//! u64, little endian; see `call/fingerprint.rs`) followed by the payload. A sender that checksums
//! (`CONFLUX_CHECKSUM`, TCP only) sets `CRC_BIT` in the tag and follows the payload with its
//! CRC32C (u32 LE); the receiver checks whatever the sender chose. Links deliver messages from one peer in order; a receiver asks for the next message
//! with a given tag. A message with another point-to-point tag is read aside into the stash,
//! where a later receive finds it (MPI's unexpected-message queue). A collective message with a
//! tag other than the one expected means the ranks disagree on their sequence of calls.

use std::collections::{HashMap, VecDeque};

use super::{Advance, LinkError};
use crate::call::{Calls, Fingerprint};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;

pub(crate) const HEADER: usize = 32;
/// Tags of collectives have the top bit set; the rest is the communicator's call sequence number.
pub(crate) const COLL_BIT: u64 = 1 << 63;
/// Set in a header's tag when a CRC32C of the payload follows it.
pub(crate) const CRC_BIT: u64 = 1 << 62;
const CRC_LEN: usize = 4;
/// Largest message a receiver will set aside when it was not expecting it.
const MAX_STASHED: u64 = 1 << 34;
/// What setting a message aside reserves before its bytes arrive.
const STASH_RESERVE: usize = 1 << 20;

/// The header of a message; `call` is the sender's fingerprint for a collective's message,
/// `Fingerprint::NONE` for a point-to-point one.
pub(crate) fn encode_header(tag: u64, len: usize, call: Fingerprint) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    for (i, w) in [tag, len as u64, call.word, call.count].into_iter().enumerate() {
        h[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    h
}

/// (tag without `CRC_BIT`, payload length, fingerprint, whether a CRC32C follows).
pub(crate) fn decode_header(b: &[u8]) -> (u64, u64, Fingerprint, bool) {
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    (w(0) & !CRC_BIT, w(1), Fingerprint { word: w(2), count: w(3) }, w(0) & CRC_BIT != 0)
}

pub(crate) fn describe_tag(tag: u64) -> String {
    if tag & COLL_BIT != 0 {
        format!("collective call #{}", tag & !COLL_BIT)
    } else {
        format!("send with tag {tag}")
    }
}

/// Where the payload of a received message goes.
pub enum Sink<'a> {
    /// Copied into the buffer.
    Copy(&'a mut [u8]),
    /// Combined into the buffer: `buf[i] = buf[i] op incoming[i]`.
    Reduce { buf: &'a mut [u8], dtype: DataType, op: ReduceOp },
    /// Combined with `src` (as long as `buf`) into the buffer: `buf[i] = src[i] op
    /// incoming[i]`, which spares copying `src` into `buf` first.
    ReduceFrom { buf: &'a mut [u8], src: &'a [u8], dtype: DataType, op: ReduceOp },
}

impl<'a> Sink<'a> {
    /// Combines what arrives into `buf`: with `buf`'s own data, or with `src` where given.
    pub fn reduce(buf: &'a mut [u8], src: Option<&'a [u8]>, dtype: DataType, op: ReduceOp) -> Sink<'a> {
        match src {
            Some(src) => Sink::ReduceFrom { buf, src, dtype, op },
            None => Sink::Reduce { buf, dtype, op },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn len(&self) -> usize {
        match self {
            Sink::Copy(b) | Sink::Reduce { buf: b, .. } | Sink::ReduceFrom { buf: b, .. } => b.len(),
        }
    }

    /// Takes bytes for payload offset `at`; returns how many it took (whole elements only,
    /// except when the bytes end the payload).
    fn take(&mut self, at: usize, bytes: &[u8]) -> usize {
        match self {
            Sink::Copy(buf) => {
                crate::bytes::copy(&mut buf[at..at + bytes.len()], bytes);
                bytes.len()
            }
            Sink::Reduce { buf, dtype, op } => {
                let n = bytes.len() - bytes.len() % dtype.size();
                reduce::reduce_into(*dtype, *op, &mut buf[at..at + n], &bytes[..n]);
                n
            }
            Sink::ReduceFrom { buf, src, dtype, op } => {
                let n = bytes.len() - bytes.len() % dtype.size();
                reduce::reduce_many(*dtype, *op, &mut buf[at..at + n], &[&src[at..at + n], &bytes[..n]]);
                n
            }
        }
    }
}

/// A link's receive side as a stream of bytes.
pub(crate) trait ByteSource {
    /// Bytes a message of `len` payload bytes takes before its payload: the header, and on
    /// shared memory the rest of its record when the payload does not fit there.
    fn header_span(_len: usize) -> usize {
        HEADER
    }
    /// Padding after a payload of `len` bytes.
    fn pad(_len: usize) -> usize {
        0
    }
    /// The bytes available now, reading more from the link when it has them (never blocks).
    /// Empty means nothing is available yet.
    fn available(&mut self) -> Result<&[u8], LinkError>;
    /// Drops the first `n` available bytes.
    fn consume(&mut self, n: usize);
}

/// The message a link is in the middle of receiving.
#[derive(Default)]
pub(crate) enum RxProgress {
    #[default]
    BetweenMessages,
    /// Payload `done` of `len` bytes of the message tagged `tag`, for the receive of that tag;
    /// `crc`: the CRC32C of the payload so far, if a checksum follows it.
    Matched { tag: u64, done: usize, len: usize, crc: Option<u32> },
    /// A message with another tag, being read into the stash, with the sender's fingerprint
    /// of its call.
    Stashing { tag: u64, call: Fingerprint, data: Vec<u8>, len: usize, crc: bool },
}

/// One link's receive state: the message in progress and the messages set aside.
#[derive(Default)]
pub(crate) struct RxState {
    progress: RxProgress,
    /// Messages set aside, by tag, each with the sender's fingerprint of its call: a
    /// collective's message read aside by a point-to-point receive is checked when its own
    /// receive takes it, as one read in place is.
    stash: HashMap<u64, VecDeque<(Fingerprint, Vec<u8>)>>,
    /// The last collective call a message from this peer proved the same as this rank's.
    pub proven: u64,
}

impl RxState {
    /// Advances the receive of a message tagged `tag` into `sink`; a collective's message must
    /// carry this rank's fingerprint of the call (`calls.now`). Returns what it did (`Advance`).
    pub fn step<S: ByteSource>(
        &mut self,
        src: &mut S,
        peer: usize,
        (tag, calls): (u64, &Calls),
        sink: &mut Sink<'_>,
        budget: usize,
    ) -> Result<Advance, LinkError> {
        let mut progressed = false;
        let mut moved = 0usize;
        loop {
            // Between messages, look in the stash first, also after finishing one set aside
            // just now (another receive's, or ours that another receive began): reading on
            // could find the end of a stream whose last message is already in the stash.
            if matches!(self.progress, RxProgress::BetweenMessages) && !self.stash.is_empty() {
                if let Some((theirs, data)) = self.take_stashed(tag) {
                    self.check_call(peer, tag, theirs, calls.now.1)?;
                    check_len(peer, tag, data.len() as u64, sink.len())?;
                    // Whole payload of whole elements (its length equals the sink's), so all of it is taken.
                    sink.take(0, &data);
                    return Ok(Advance { moved: true, done: true });
                }
            }
            match &mut self.progress {
                RxProgress::BetweenMessages => {
                    let avail = src.available()?;
                    if avail.len() < HEADER {
                        return Ok(Advance { moved: progressed, done: false });
                    }
                    let (got_tag, len, theirs, crc) = decode_header(avail);
                    let span = S::header_span(len as usize);
                    if avail.len() < span {
                        return Ok(Advance { moved: progressed, done: false });
                    }
                    if got_tag == tag {
                        self.check_call(peer, tag, theirs, calls.now.1)?;
                        check_len(peer, tag, len, sink.len())?;
                        // `len` is the sink's: no overflow below.
                        let (len, pad) = (len as usize, S::pad(len as usize));
                        // A message that is all here (a small one in its header's record) is
                        // taken at once: one look at the link instead of three.
                        let (mut done, whole) = (0, span + len + pad);
                        if !crc && len <= budget && avail.len() >= whole {
                            done = sink.take(0, &avail[span..span + len]);
                            if done == len {
                                src.consume(whole);
                                return Ok(Advance { moved: true, done: true });
                            }
                        }
                        src.consume(span + done);
                        (progressed, moved) = (true, moved + done);
                        self.progress = RxProgress::Matched { tag, done, len, crc: crc.then_some(0) };
                        continue;
                    }
                    src.consume(span);
                    progressed = true;
                    if got_tag & COLL_BIT != 0 && tag & COLL_BIT != 0 {
                        let mine = match calls.of(got_tag & !COLL_BIT) {
                            Some(fp) => format!(" where this rank called {fp}"),
                            None => String::new(),
                        };
                        let detail = format!(
                            "it sent data of {}, {theirs},{mine} while this rank is in {}, {}",
                            describe_tag(got_tag),
                            describe_tag(tag),
                            calls.now.1
                        );
                        return Err(LinkError::Mismatch { peer, detail });
                    } else if got_tag & COLL_BIT != 0 && got_tag & !COLL_BIT <= calls.finished {
                        // Set aside, no receive would ever ask for it (its call is over here),
                        // and with it the only sign that the peer's call was another.
                        let detail = format!(
                            "it sent data of {}, {theirs}, which this rank finished without it",
                            describe_tag(got_tag)
                        );
                        return Err(LinkError::Mismatch { peer, detail });
                    } else {
                        self.progress = stashing(peer, got_tag, theirs, len, crc)?;
                    }
                }
                RxProgress::Matched { tag: t, done, len, crc } => {
                    if *t != tag {
                        // Another receive from this peer is mid-message; it goes first.
                        return Ok(Advance { moved: progressed, done: false });
                    }
                    if *done == *len {
                        if !check_crc(src, peer, tag, *crc)? {
                            return Ok(Advance { moved: progressed, done: false });
                        }
                        src.consume(S::pad(*len));
                        self.progress = RxProgress::BetweenMessages;
                        return Ok(Advance { moved: true, done: true });
                    }
                    if moved >= budget {
                        return Ok(Advance { moved: progressed, done: false });
                    }
                    let avail = src.available()?;
                    // A reducing sink takes whole elements only: a budget under the largest
                    // element (8 bytes) would never let it take one.
                    let n = avail.len().min(*len - *done).min(budget.max(8));
                    if n == 0 {
                        return Ok(Advance { moved: progressed, done: false });
                    }
                    let took = sink.take(*done, &avail[..n]);
                    if took == 0 {
                        return Ok(Advance { moved: progressed, done: false });
                    }
                    if let Some(c) = crc {
                        *c = crc32c::crc32c_append(*c, &avail[..took]);
                    }
                    src.consume(took);
                    *done += took;
                    moved += took;
                    progressed = true;
                }
                RxProgress::Stashing { .. } => match self.stash_more(src, peer)? {
                    Advance { moved, done: true } => progressed |= moved,
                    Advance { moved, done: false } => return Ok(Advance { moved: progressed | moved, done: false }),
                },
            }
        }
    }

    /// Between messages, with none set aside.
    pub fn idle(&self) -> bool {
        matches!(self.progress, RxProgress::BetweenMessages) && self.stash.is_empty()
    }

    /// `check_call`, remembering a collective's call as proven.
    fn check_call(&mut self, peer: usize, tag: u64, theirs: Fingerprint, mine: Fingerprint) -> Result<(), LinkError> {
        check_call(peer, tag, theirs, mine)?;
        if tag & COLL_BIT != 0 {
            self.proven = tag & !COLL_BIT;
        }
        Ok(())
    }

    /// The oldest message set aside with `tag`; a tag with none left leaves the map, so that
    /// ever new tags do not grow it.
    fn take_stashed(&mut self, tag: u64) -> Option<(Fingerprint, Vec<u8>)> {
        let q = self.stash.get_mut(&tag)?;
        let data = q.pop_front();
        if q.is_empty() {
            self.stash.remove(&tag);
        }
        data
    }

    /// Reads more of the message being set aside; (progressed, finished it).
    fn stash_more<S: ByteSource>(&mut self, src: &mut S, peer: usize) -> Result<Advance, LinkError> {
        let RxProgress::Stashing { tag, call, data, len, crc } = &mut self.progress else {
            return Ok(Advance { moved: false, done: true });
        };
        if data.len() == *len {
            if !check_crc(src, peer, *tag, crc.then(|| crc32c::crc32c(data)))? {
                return Ok(Advance { moved: false, done: false });
            }
            src.consume(S::pad(*len));
            let (tag, call, data) = (*tag, *call, std::mem::take(data));
            self.stash.entry(tag).or_default().push_back((call, data));
            self.progress = RxProgress::BetweenMessages;
            return Ok(Advance { moved: true, done: true });
        }
        let avail = src.available()?;
        let n = avail.len().min(*len - data.len());
        if n == 0 {
            return Ok(Advance { moved: false, done: false });
        }
        if data.capacity() - data.len() < n {
            reserve(data, peer, n.max(data.len()).min(*len - data.len()))?;
        }
        data.extend_from_slice(&avail[..n]);
        src.consume(n);
        Ok(Advance { moved: true, done: false })
    }

    /// Whether a receive of `tag` from this link would match a message now (a receive from
    /// any source asks each link in turn). Messages of other point-to-point tags ahead of it are
    /// read aside into the stash, as a receive does; a collective's message or another
    /// receive's message in progress stop the look (they are not this receive's to move).
    pub fn probe<S: ByteSource>(&mut self, src: &mut S, peer: usize, tag: u64) -> Result<bool, LinkError> {
        loop {
            if self.stash.get(&tag).is_some_and(|q| !q.is_empty()) {
                return Ok(true);
            }
            match &self.progress {
                RxProgress::Matched { .. } => return Ok(false),
                RxProgress::Stashing { .. } => {
                    if !self.stash_more(src, peer)?.done {
                        return Ok(false);
                    }
                }
                RxProgress::BetweenMessages => {
                    let avail = src.available()?;
                    if avail.len() < HEADER {
                        return Ok(false);
                    }
                    let (got_tag, len, theirs, crc) = decode_header(avail);
                    if got_tag == tag {
                        return Ok(true);
                    }
                    if got_tag & COLL_BIT != 0 {
                        return Ok(false);
                    }
                    let span = S::header_span(len as usize);
                    if avail.len() < span {
                        return Ok(false);
                    }
                    src.consume(span);
                    self.progress = stashing(peer, got_tag, theirs, len, crc)?;
                }
            }
        }
    }
}

/// The state for setting aside an unexpected message of `len` bytes, checked before it allocates.
fn stashing(peer: usize, tag: u64, call: Fingerprint, len: u64, crc: bool) -> Result<RxProgress, LinkError> {
    if len > MAX_STASHED {
        return Err(LinkError::Mismatch { peer, detail: format!("it sent an unexpected message of {len} bytes") });
    }
    // The header's length is the sender's word: memory grows with the bytes that arrive, not
    // with what the header claims.
    let mut data = Vec::new();
    reserve(&mut data, peer, (len as usize).min(STASH_RESERVE))?;
    Ok(RxProgress::Stashing { tag, call, data, len: len as usize, crc })
}

/// After a payload: with `got` (the CRC32C of what arrived), takes the sender's checksum and
/// compares. Ok(false): the checksum has not arrived yet.
fn check_crc<S: ByteSource>(src: &mut S, peer: usize, tag: u64, got: Option<u32>) -> Result<bool, LinkError> {
    let Some(got) = got else { return Ok(true) };
    let avail = src.available()?;
    if avail.len() < CRC_LEN {
        return Ok(false);
    }
    let sent = u32::from_le_bytes(avail[..CRC_LEN].try_into().expect("4 bytes"));
    src.consume(CRC_LEN);
    if sent != got {
        return Err(LinkError::Io {
            peer,
            detail: format!(
                "the payload of {} was corrupted in transit (CRC32C {got:08x}, the sender's {sent:08x})",
                describe_tag(tag)
            ),
        });
    }
    Ok(true)
}

fn reserve(data: &mut Vec<u8>, peer: usize, more: usize) -> Result<(), LinkError> {
    data.try_reserve(more).map_err(|_| LinkError::Io {
        peer,
        detail: format!("cannot allocate {} bytes for an unexpected message", data.len() + more),
    })
}

/// Both sides of a collective's message must be in the same call.
fn check_call(peer: usize, tag: u64, theirs: Fingerprint, mine: Fingerprint) -> Result<(), LinkError> {
    if tag & COLL_BIT == 0 || theirs == mine {
        return Ok(());
    }
    Err(LinkError::Mismatch {
        peer,
        detail: format!("in {} it called {theirs}, this rank called {mine}", describe_tag(tag)),
    })
}

fn check_len(peer: usize, tag: u64, got: u64, want: usize) -> Result<(), LinkError> {
    if got == want as u64 {
        return Ok(());
    }
    Err(LinkError::Mismatch {
        peer,
        detail: format!("for {} it sent {got} bytes, this rank expects {want}", describe_tag(tag)),
    })
}

#[cfg(test)]
pub(super) mod tests {
    //! The receive logic on an in-memory byte stream that delivers a few bytes at a time.
    use super::*;

    /// Bytes arrive `step` at a time, as a slow link would deliver them.
    pub(super) struct Trickle {
        pub bytes: Vec<u8>,
        pub at: usize,
        pub visible: usize,
        pub step: usize,
    }

    impl ByteSource for Trickle {
        fn available(&mut self) -> Result<&[u8], LinkError> {
            self.visible = (self.visible + self.step).min(self.bytes.len());
            Ok(&self.bytes[self.at..self.visible.max(self.at)])
        }
        fn consume(&mut self, n: usize) {
            self.at += n;
        }
    }

    fn message(tag: u64, payload: &[u8]) -> Vec<u8> {
        let mut m = encode_header(tag, payload.len(), Fingerprint::NONE).to_vec();
        m.extend_from_slice(payload);
        m
    }

    #[test]
    fn probe_sets_other_tags_aside_and_stops_at_a_collective() {
        let mut bytes = message(5, &[1; 40]);
        bytes.extend(message(9, &[2; 8]));
        bytes.extend(message(COLL_BIT | 3, &[3; 4]));
        let mut src = Trickle { bytes, at: 0, visible: 0, step: 7 };
        let mut rx = RxState::default();
        let mut found = false;
        for _ in 0..100 {
            if rx.probe(&mut src, 1, 9).unwrap() {
                found = true;
                break;
            }
        }
        assert!(found, "the tag-9 message behind a tag-5 one was never found");
        // Probing did not consume the match; the tag-5 message waits in the stash.
        let mut nine = [0u8; 8];
        while !rx.step(&mut src, 1, (9, &Calls::default()), &mut Sink::Copy(&mut nine), 1 << 20).unwrap().done {}
        assert_eq!(nine, [2; 8]);
        let mut five = [0u8; 40];
        assert!(rx.step(&mut src, 1, (5, &Calls::default()), &mut Sink::Copy(&mut five), 1 << 20).unwrap().done);
        assert_eq!(five, [1; 40]);
        // A collective's message is not set aside for a receive of another tag.
        for _ in 0..10 {
            assert!(!rx.probe(&mut src, 1, 9).unwrap());
        }
        let mut coll = [0u8; 4];
        while !rx
            .step(&mut src, 1, (COLL_BIT | 3, &Calls::default()), &mut Sink::Copy(&mut coll), 1 << 20)
            .unwrap()
            .done
        {}
        assert_eq!(coll, [3; 4]);
    }

    /// A collective's message that a point-to-point receive read aside (it came first on the
    /// stream) is checked against the call when the collective takes it, as one read in place
    /// is: taken unchecked, a peer in another call (a reduce with another reduction, say) had
    /// its data reduced as this rank's call, with no error on either rank.
    #[test]
    fn a_collective_message_taken_from_the_stash_must_be_of_this_call() {
        let theirs = Fingerprint { word: 0x0102, count: 4 };
        for (mine, alike) in [(theirs, true), (Fingerprint { word: 0x0103, count: 4 }, false)] {
            let mut bytes = encode_header(COLL_BIT | 2, 16, theirs).to_vec();
            bytes.extend_from_slice(&[6; 16]);
            bytes.extend(message(7, &[7; 8]));
            let mut src = Trickle { bytes, at: 0, visible: 0, step: 5 };
            let mut rx = RxState::default();
            let mut seven = [0u8; 8];
            while !rx.step(&mut src, 1, (7, &Calls::default()), &mut Sink::Copy(&mut seven), 1 << 20).unwrap().done {}
            assert_eq!(seven, [7; 8]);
            let calls = Calls { now: (2, mine), before: (1, mine), finished: 1 };
            let mut coll = [0u8; 16];
            match rx.step(&mut src, 1, (COLL_BIT | 2, &calls), &mut Sink::Copy(&mut coll), 1 << 20) {
                Ok(Advance { done: true, .. }) if alike => assert_eq!(coll, [6; 16]),
                Err(LinkError::Mismatch { peer: 1, detail }) if !alike => {
                    assert!(detail.contains("collective call #2"), "{detail}")
                }
                other => panic!("alike {alike}: {:?}", other.map_err(|e| e.to_string())),
            }
        }
    }

    /// A point-to-point receive that meets a message of a collective this rank has already
    /// finished fails: that call is over here, so no receive would take the message, and the
    /// peer that sent it made another call (ranks that disagreed on a broadcast's root, say).
    #[test]
    fn a_message_of_a_finished_collective_is_a_mismatch() {
        let fp = Fingerprint { word: 0x0102, count: 4 };
        for finished in [1, 2] {
            let mut bytes = encode_header(COLL_BIT | 2, 16, fp).to_vec();
            bytes.extend_from_slice(&[6; 16]);
            bytes.extend(message(7, &[7; 8]));
            let mut src = Trickle { bytes, at: 0, visible: 0, step: 64 };
            let mut rx = RxState::default();
            let calls = Calls { now: (2, fp), before: (1, fp), finished };
            let mut seven = [0u8; 8];
            let mut got = Ok(Advance::default());
            for _ in 0..10 {
                got = rx.step(&mut src, 1, (7, &calls), &mut Sink::Copy(&mut seven), 1 << 20);
                if !matches!(got, Ok(Advance { done: false, .. })) {
                    break;
                }
            }
            match (finished, got) {
                (1, Ok(Advance { done: true, .. })) => assert_eq!(seven, [7; 8]),
                (2, Err(LinkError::Mismatch { peer: 1, detail })) => assert!(detail.contains("finished"), "{detail}"),
                (f, other) => panic!("finished {f}: {:?}", other.map_err(|e| e.to_string())),
            }
        }
    }

    /// A link whose peer sent `bytes` and then closed it, as a TCP stream that ended.
    struct ThenClosed(Trickle);

    impl ByteSource for ThenClosed {
        fn available(&mut self) -> Result<&[u8], LinkError> {
            let t = &mut self.0;
            if t.at == t.bytes.len() {
                return Err(LinkError::PeerGone { peer: 1, detail: "it closed its TCP connection".into() });
            }
            t.available()
        }
        fn consume(&mut self, n: usize) {
            self.0.consume(n);
        }
    }

    /// Two receives from one peer that sent both messages and left: each one's message is set
    /// aside by the other, and each must find it in the stash before reading on into the end
    /// of the stream (which was a "peer gone" error when the last message was set aside by
    /// the receive that then read on).
    #[test]
    fn messages_set_aside_by_another_receive_are_found_before_the_end_of_the_stream() {
        for step in [7, 40, 1 << 10] {
            let mut bytes = message(COLL_BIT | 3, &[3; 20]);
            bytes.extend(message(11, &[4; 16]));
            let mut src = ThenClosed(Trickle { bytes, at: 0, visible: 0, step });
            let mut rx = RxState::default();
            let (mut coll, mut eleven) = ([0u8; 20], [0u8; 16]);
            let (mut coll_done, mut eleven_done) = (false, false);
            for _ in 0..100 {
                if !eleven_done {
                    let r = rx.step(&mut src, 1, (11, &Calls::default()), &mut Sink::Copy(&mut eleven), 1 << 20);
                    eleven_done = r.unwrap_or_else(|e| panic!("step {step}: tag 11: {e}")).done;
                }
                if !coll_done {
                    let calls = Calls::default();
                    let r = rx.step(&mut src, 1, (COLL_BIT | 3, &calls), &mut Sink::Copy(&mut coll), 1 << 20);
                    coll_done = r.unwrap_or_else(|e| panic!("step {step}: collective: {e}")).done;
                }
                if coll_done && eleven_done {
                    break;
                }
            }
            assert!(coll_done && eleven_done, "step {step}: not both received");
            assert_eq!((coll, eleven), ([3; 20], [4; 16]));
        }
    }
}

#[cfg(test)]
mod fuzz {
    //! Whatever bytes a peer sends, the receive logic returns an error or makes progress: it
    //! never panics, and what it allocates grows with the bytes that arrived, not with the
    //! lengths the headers claim.
    use super::tests::Trickle as Bytes;
    use super::*;
    use proptest::prelude::*;

    /// A header with a plausible or absurd tag and length, then some payload bytes.
    fn message() -> impl Strategy<Value = Vec<u8>> {
        let tag = prop_oneof![Just(5u64), Just(COLL_BIT | 1), Just(COLL_BIT | 2), any::<u64>()];
        let len = prop_oneof![0u64..64, Just(u64::MAX), Just(MAX_STASHED), Just(MAX_STASHED + 1), any::<u64>()];
        (tag, len, any::<[u64; 2]>(), prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(tag, len, fp, body)| {
            let call = Fingerprint { word: fp[0], count: fp[1] };
            let mut m = encode_header(tag, 0, call).to_vec();
            m[8..16].copy_from_slice(&len.to_le_bytes());
            m.extend(body);
            m
        })
    }

    fn checksummed(tag: u64, payload: &[u8], crc: u32) -> Vec<u8> {
        let mut m = encode_header(tag | CRC_BIT, payload.len(), Fingerprint::NONE).to_vec();
        m.extend_from_slice(payload);
        m.extend(crc.to_le_bytes());
        m
    }

    #[test]
    fn a_checksum_is_checked_whoever_sent_it_and_corruption_is_an_error() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        let good = crc32c::crc32c(&payload);
        let calls = Calls::default();
        for (crc, ok) in [(good, true), (good ^ 1, false)] {
            for step in [1, 7, 4096] {
                // A stashed message (tag 9, received after the tag-5 one) and a matched one.
                let mut bytes = checksummed(9, &payload, crc);
                bytes.extend(checksummed(5, &payload, crc));
                let mut src = Bytes { bytes, at: 0, step, visible: 0 };
                let mut rx = RxState::default();
                for tag in [5u64, 9] {
                    let mut got = vec![0u8; payload.len()];
                    let r = loop {
                        match rx.step(&mut src, 1, (tag, &calls), &mut Sink::Copy(&mut got), 64) {
                            Ok(Advance { done: true, .. }) => break Ok(()),
                            Ok(_) => {}
                            Err(e) => break Err(e),
                        }
                    };
                    match r {
                        Ok(()) => assert!(ok && got == payload, "tag {tag}, step {step}"),
                        Err(e) => assert!(!ok && e.to_string().contains("corrupted"), "{e}"),
                    }
                    if !ok {
                        break;
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn any_stream_is_an_error_or_progress(
            stream in prop::collection::vec(prop_oneof![message(), prop::collection::vec(any::<u8>(), 0..64)], 0..8),
            step in 1usize..97,
            sink_len in 0usize..80,
            reducing: bool,
            probe_first: bool,
        ) {
            let bytes: Vec<u8> = stream.concat();
            let total = bytes.len();
            let mut src = Bytes { bytes, at: 0, step, visible: 0 };
            let mut rx = RxState::default();
            let mut buf = vec![0u8; sink_len / 4 * 4];
            let calls = Calls { now: (1, Fingerprint::NONE), before: (0, Fingerprint::NONE), finished: 0 };
            for round in 0..4 * total + 8 {
                let tag = if round % 3 == 0 { COLL_BIT | 1 } else { 5 };
                let r = if probe_first && round % 2 == 0 {
                    rx.probe(&mut src, 1, 5).map(|_| ())
                } else {
                    let mut sink = if reducing {
                        Sink::Reduce { buf: &mut buf, dtype: DataType::F32, op: ReduceOp::Sum }
                    } else {
                        Sink::Copy(&mut buf)
                    };
                    rx.step(&mut src, 1, (tag, &calls), &mut sink, 64).map(|_| ())
                };
                if r.is_err() {
                    break;
                }
                let held: usize = rx.stash.values().flatten().map(|(_, d)| d.capacity()).sum::<usize>()
                    + match &rx.progress { RxProgress::Stashing { data, .. } => data.capacity(), _ => 0 };
                prop_assert!(held <= 2 * total + STASH_RESERVE, "{held} bytes held for {total} received");
            }
        }
    }
}
