//! The call board: each local rank's current collective, published in its `rank_ctl` line of
//! the shared segment, so that a rank waiting for a local peer can see that the peer is in the
//! same call number with another fingerprint — a mismatch in which no message may ever flow
//! (ranks that each wait to receive from the other, or one in the direct algorithm while the
//! other sends ring messages nobody reads).
//!
//! Each rank keeps its current and its previous call, and checks its local peers' boards on
//! leaving each call (`Waiter::leave_call`), for that call and the one before: in a broadcast
//! whose ranks disagree on the root, each "root" only sends and returns, and nobody waited
//! long enough to look.
//!
//! Protocol: a seqlock per entry, written by its rank only. The writer stores `EMPTY` to the
//! number, then (after a release fence) the two fingerprint words, then the call number with
//! Release. A reader loads the number (Acquire), the words, and after an acquire fence the number
//! again; equal numbers (and not `EMPTY`) mean the words are that call's.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::shm::Segment;
use crate::call::Fingerprint;

/// A call being published now (0, a fresh segment's value, is no call either: numbers start at 1).
const EMPTY: u64 = u64::MAX;

/// Byte offsets of rank i's (number, word, count) for call `seq`: two entries, by parity, so
/// that the previous call stays readable while the rank is in the next.
fn at(seg: &Segment, i: usize, seq: u64) -> [usize; 3] {
    let base = seg.layout.board(i, (seq % 2) as usize);
    [base, base + 8, base + 16]
}

/// Says this rank (local index `me`) is in collective call `seq` with fingerprint `call`.
pub(crate) fn publish(seg: &Segment, me: usize, seq: u64, call: Fingerprint) {
    let [num, word, count] = at(seg, me, seq);
    seg.u64_at(num).store(EMPTY, Ordering::Relaxed);
    fence(Ordering::Release);
    seg.u64_at(word).store(call.word, Ordering::Relaxed);
    seg.u64_at(count).store(call.count, Ordering::Relaxed);
    seg.u64_at(num).store(seq, Ordering::Release);
}

/// The call rank `i` is in, if it has published call number `seq`.
pub(crate) fn read(seg: &Segment, i: usize, seq: u64) -> Option<Fingerprint> {
    let [num, word, count] = at(seg, i, seq);
    let before = seg.u64_at(num).load(Ordering::Acquire);
    if before != seq || before == EMPTY || before == 0 {
        return None;
    }
    let fp = Fingerprint {
        word: seg.u64_at(word).load(Ordering::Relaxed),
        count: seg.u64_at(count).load(Ordering::Relaxed),
    };
    fence(Ordering::Acquire);
    (seg.u64_at(num).load(Ordering::Relaxed) == before).then_some(fp)
}

/// The newest call rank `i` has published, if any.
pub(crate) fn latest(seg: &Segment, i: usize) -> Option<(u64, Fingerprint)> {
    let numbers = [0, 1].map(|p| seg.u64_at(seg.layout.board(i, p)).load(Ordering::Acquire));
    let seq = numbers.into_iter().filter(|&n| n != EMPTY && n != 0).max()?;
    read(seg, i, seq).map(|fp| (seq, fp))
}

/// A reader of one host's call boards that any thread may hold: what each local rank of a
/// communicator last entered, read without a lock and without disturbing the writers
/// (`Communicator::status`).
#[derive(Clone)]
pub struct CallBoard {
    seg: Arc<Segment>,
    /// The communicator's rank of each segment index.
    ranks: Vec<usize>,
}

impl CallBoard {
    pub(crate) fn new(seg: Arc<Segment>, ranks: Vec<usize>) -> CallBoard {
        CallBoard { seg, ranks }
    }

    /// The newest collective communicator rank `rank` published, if it shares this host.
    pub fn latest(&self, rank: usize) -> Option<(u64, Fingerprint)> {
        let i = self.ranks.iter().position(|&r| r == rank)?;
        latest(&self.seg, i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::Layout;

    #[test]
    fn a_published_call_is_read_only_at_its_number() {
        let seg = Segment::create(Layout::new(3, 4096, 4096)).unwrap();
        let fp = Fingerprint { word: 0x1234, count: 99 };
        assert_eq!(read(&seg, 1, 0), None, "a fresh segment holds call 0 of nobody");
        publish(&seg, 1, 7, fp);
        assert_eq!(read(&seg, 1, 7), Some(fp));
        assert_eq!(read(&seg, 1, 8), None);
        assert_eq!(read(&seg, 0, 7), None);
        // The previous call stays readable in the next; the one before is overwritten.
        let next = Fingerprint { word: 1, count: 2 };
        publish(&seg, 1, 8, next);
        assert_eq!((read(&seg, 1, 7), read(&seg, 1, 8)), (Some(fp), Some(next)));
        publish(&seg, 1, 9, next);
        assert_eq!(read(&seg, 1, 7), None);
        assert_eq!(latest(&seg, 1), Some((9, next)));
        assert_eq!(latest(&seg, 2), None);
        // The direct algorithm's descriptors, just before the board in its line, are not disturbed.
        for parity in 0..2 {
            assert_eq!(seg.u64_at(seg.layout.desc(1, parity)).load(Ordering::Relaxed), 0);
        }
    }
}
