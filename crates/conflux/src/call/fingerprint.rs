//! What a collective call is, in 16 bytes that every message of the call carries.
//!
//! Ranks that disagree on a call — another operation, dtype, count, root, reduce op or
//! algorithm at the same place in their sequence of calls — would otherwise hang or compute a
//! wrong answer without a word (nccl#1417). So every message of a collective carries the
//! sender's fingerprint of its call (in the message header; in the direct algorithm's
//! descriptor), and a receiver compares it with its own before it takes the payload. The
//! fingerprint is decodable, not a hash, so the error can say what both sides called.
//!
//! `word`: bits 0–7 operation (0 for point-to-point), 8–15 dtype, 16–23 reduce op + 1 (0: none),
//! 24–31 algorithm + 1 (0: none), 32–63 root + 1 (0: none). `count`: bits 0–47 elements
//! (all of them, as every rank counts them; `UNEVEN` for all_to_all_v, whose counts differ by
//! rank), 48–63 pieces of a coalesced call (saturating).

use std::fmt;

use super::{Algo, OpKind};
use crate::dtype::{DataType, ReduceOp};

/// The collective a rank is in and the one before it, as (call number, fingerprint).
#[derive(Debug, Clone, Copy, Default)]
pub struct Calls {
    pub now: (u64, Fingerprint),
    pub before: (u64, Fingerprint),
    /// The last collective this rank finished: a message of it or of an earlier one that
    /// arrives now is one it finished without, so the sender made another call.
    pub finished: u64,
}

impl Calls {
    pub fn enter(&mut self, seq: u64, call: Fingerprint) {
        self.before = std::mem::replace(&mut self.now, (seq, call));
    }

    /// One word for both calls, numbers included, for the direct algorithm's one-word
    /// descriptor (the details are on the call board). Each step (xor a field, multiply by an
    /// odd constant, fold the high half into the low) is a bijection of the word so far, so
    /// calls that differ in a single field always give different words; calls that differ in
    /// more collide with a chance of about 2^-64.
    pub fn digest(&self) -> u64 {
        let (n, now) = self.now;
        let (b, before) = self.before;
        [n, now.word, now.count, b, before.word, before.count].into_iter().fold(0, |h: u64, v| {
            let h = (h ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^ (h >> 32)
        })
    }

    /// This rank's call number `seq`, if it is one of the two.
    pub fn of(&self, seq: u64) -> Option<Fingerprint> {
        [self.now, self.before].into_iter().find(|c| c.0 == seq && seq != 0).map(|c| c.1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    pub word: u64,
    pub count: u64,
}

const BARRIER: u64 = 0xff;
/// The algorithm field of a reduction in deterministic mode.
const ORDERED: u64 = 0xfe;
const ELEMS: u64 = (1 << 48) - 1;
/// The count of an all_to_all_v, which differs by rank; its lengths are checked per message.
const UNEVEN: u64 = ELEMS;

/// What `Fingerprint::new` is told about a call.
pub struct CallShape {
    pub op: Option<OpKind>,
    pub dtype: DataType,
    pub elems: usize,
    pub pieces: usize,
    pub uneven: bool,
    pub reduce: Option<ReduceOp>,
    pub root: Option<usize>,
    pub algo: Option<Algo>,
    /// Reduced in rank order (deterministic mode), by no algorithm of the model's.
    pub ordered: bool,
}

impl Fingerprint {
    /// Point-to-point messages carry no call.
    pub const NONE: Fingerprint = Fingerprint { word: 0, count: 0 };

    /// The fingerprint of a collective; `op: None` is a barrier.
    #[inline]
    pub fn new(c: &CallShape) -> Fingerprint {
        // Each field is the enum's index in its `ALL` (its discriminant: see the test below).
        let op = c.op.map_or(BARRIER, |o| o as u64 + 1);
        let dtype = c.dtype as u64;
        let reduce = c.reduce.map_or(0, |r| r as u64 + 1);
        let algo = if c.ordered { ORDERED } else { c.algo.map_or(0, |a| a as u64 + 1) };
        let root = c.root.map_or(0, |r| (r as u64 + 1).min(u32::MAX as u64));
        let elems = if c.uneven { UNEVEN } else { (c.elems as u64).min(ELEMS - 1) };
        Fingerprint {
            word: op | dtype << 8 | reduce << 16 | algo << 24 | root << 32,
            count: elems | (c.pieces.min(0xffff) as u64) << 48,
        }
    }

    fn field(&self, shift: u32) -> usize {
        ((self.word >> shift) & 0xff) as usize
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.field(0) {
            0 => return f.write_str("a point-to-point transfer"),
            0xff => return f.write_str("barrier"),
            i => OpKind::ALL.get(i - 1).map_or("an unknown operation", |o| o.name()),
        };
        let dtype = DataType::ALL.get(self.field(8)).map_or("?", |d| d.name());
        match self.count & ELEMS {
            UNEVEN => write!(f, "{op}_v({dtype}")?,
            n => write!(f, "{op}({dtype} x {n}")?,
        }
        if let Some(r) = self.field(16).checked_sub(1) {
            write!(f, ", {}", ReduceOp::ALL.get(r).map_or("?", |r| r.name()))?;
        }
        if let Some(root) = (self.word >> 32).checked_sub(1) {
            write!(f, ", root={root}")?;
        }
        let pieces = self.count >> 48;
        if pieces > 1 {
            write!(f, ", {pieces} tensors")?;
        }
        f.write_str(")")?;
        match self.field(24) {
            0 => {}
            0xfe => f.write_str(" in deterministic order")?,
            a => write!(f, " by {}", Algo::ALL.get(a - 1).map_or("?", |a| a.name()))?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(op: Option<OpKind>) -> CallShape {
        CallShape {
            op,
            dtype: DataType::F32,
            elems: 1024,
            pieces: 1,
            uneven: false,
            reduce: None,
            root: None,
            algo: None,
            ordered: false,
        }
    }

    #[test]
    fn reads_back_as_the_call() {
        let ar = CallShape { reduce: Some(ReduceOp::Sum), algo: Some(Algo::Ring), ..shape(Some(OpKind::AllReduce)) };
        assert_eq!(Fingerprint::new(&ar).to_string(), "all_reduce(float x 1024, sum) by ring");
        let bc = CallShape { root: Some(1), algo: Some(Algo::Tree), ..shape(Some(OpKind::Broadcast)) };
        assert_eq!(Fingerprint::new(&bc).to_string(), "broadcast(float x 1024, root=1) by tree");
        let v = CallShape { uneven: true, ..shape(Some(OpKind::AllToAll)) };
        assert_eq!(Fingerprint::new(&v).to_string(), "all_to_all_v(float)");
        assert_eq!(Fingerprint::new(&shape(None)).to_string(), "barrier");
        let fused = CallShape { pieces: 3, dtype: DataType::BF16, ..shape(Some(OpKind::AllReduce)) };
        assert_eq!(Fingerprint::new(&fused).to_string(), "all_reduce(bfloat16 x 1024, 3 tensors)");
    }

    #[test]
    fn every_field_tells_calls_apart() {
        let base = CallShape { reduce: Some(ReduceOp::Sum), root: Some(0), ..shape(Some(OpKind::Reduce)) };
        let fp = Fingerprint::new(&base);
        let variants = [
            CallShape { op: Some(OpKind::AllReduce), ..shape(None) },
            CallShape {
                dtype: DataType::I32,
                reduce: Some(ReduceOp::Sum),
                root: Some(0),
                ..shape(Some(OpKind::Reduce))
            },
            CallShape { elems: 1025, reduce: Some(ReduceOp::Sum), root: Some(0), ..shape(Some(OpKind::Reduce)) },
            CallShape { reduce: Some(ReduceOp::Max), root: Some(0), ..shape(Some(OpKind::Reduce)) },
            CallShape { reduce: Some(ReduceOp::Sum), root: Some(1), ..shape(Some(OpKind::Reduce)) },
            CallShape {
                reduce: Some(ReduceOp::Sum),
                root: Some(0),
                algo: Some(Algo::Chain),
                ..shape(Some(OpKind::Reduce))
            },
            CallShape { reduce: Some(ReduceOp::Sum), root: Some(0), pieces: 2, ..shape(Some(OpKind::Reduce)) },
            CallShape { reduce: Some(ReduceOp::Sum), root: Some(0), ordered: true, ..shape(Some(OpKind::Reduce)) },
        ];
        for v in &variants {
            assert_ne!(Fingerprint::new(v), fp, "{} and {fp} look alike", Fingerprint::new(v));
        }
        assert_ne!(fp, Fingerprint::NONE);
    }

    /// The direct algorithm compares calls by `Calls::digest` alone: a change in any one field
    /// of either call must change it.
    #[test]
    fn a_digest_changes_with_any_field_of_either_call() {
        let fp = |word, count| Fingerprint { word, count };
        let calls = Calls { now: (8, fp(0x0102_0304, 1000)), before: (7, fp(0x0102_0304, 1000)), finished: 7 };
        let base = calls.digest();
        let mut seen = vec![base];
        for bit in 0..64 {
            let b = 1u64 << bit;
            let mut each = [calls; 6];
            each[0].now.0 ^= b;
            each[1].now.1.word ^= b;
            each[2].now.1.count ^= b;
            each[3].before.0 ^= b;
            each[4].before.1.word ^= b;
            each[5].before.1.count ^= b;
            seen.extend(each.iter().map(Calls::digest));
        }
        let distinct: std::collections::HashSet<u64> = seen.iter().copied().collect();
        assert_eq!(distinct.len(), seen.len(), "two of the changed calls share a digest");
    }

    /// `Fingerprint::new` encodes each enum by its discriminant and `Display` decodes it by its
    /// index in `ALL`: the two must be the same numbering.
    #[test]
    fn every_enum_is_numbered_as_its_all_list() {
        assert!(OpKind::ALL.iter().enumerate().all(|(i, &o)| o as usize == i));
        assert!(DataType::ALL.iter().enumerate().all(|(i, &d)| d as usize == i));
        assert!(ReduceOp::ALL.iter().enumerate().all(|(i, &r)| r as usize == i));
        assert!(Algo::ALL.iter().enumerate().all(|(i, &a)| a as usize == i));
    }
}
