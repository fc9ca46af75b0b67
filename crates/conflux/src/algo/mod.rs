//! Collective algorithms. Each is a small module that sees only `Transport::exchange` (and,
//! for the direct shared-segment algorithms, the segment's slots): one schedule of steps.
//! Which one serves a call is decided in `select.rs`.

pub(crate) mod bruck;
pub(crate) mod chain;
pub(crate) mod direct;
pub(crate) mod fold;
pub(crate) mod hier;
pub(crate) mod ordered;
pub(crate) mod pairwise;
pub(crate) mod rabenseifner;
pub(crate) mod rd;
pub(crate) mod ring;
pub(crate) mod sag;
pub mod select;
pub(crate) mod tree;

use std::fmt;
use std::ops::Range;
use std::time::Instant;

/// A collective algorithm, as users name it in `CONFLUX_ALGO` and `Communicator::with_algo`.
/// One name covers the same idea across operations (`tree` is the double binary tree for
/// all_reduce and the binomial tree for broadcast and reduce); `select::serves` says which
/// operation each one serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    /// Bandwidth-optimal ring: N-1 steps per phase (all_reduce, all_gather, reduce_scatter, reduce).
    Ring,
    /// The shared-segment algorithm: every rank of one host reads the others' slots
    /// (all_reduce, all_gather, reduce_scatter, all_to_all of equal blocks).
    Direct,
    /// Double binary tree for all_reduce; binomial tree for broadcast and reduce.
    Tree,
    /// Recursive doubling (all_reduce, all_gather) and halving (reduce_scatter): log N steps.
    Rd,
    /// Recursive-halving reduce-scatter, then recursive-doubling all-gather (all_reduce).
    Rabenseifner,
    /// Reduce-scatter within each node, all_reduce across nodes, all-gather within (all_reduce).
    Hier,
    /// Pipelined chain (broadcast, reduce).
    Chain,
    /// Scatter from the root, then ring all-gather (broadcast).
    ScatterAllGather,
    /// Bruck's log-step exchange (all_gather, all_to_all).
    Bruck,
    /// Every pair at once (all_to_all).
    Pairwise,
}

impl Algo {
    pub const ALL: [Algo; 10] = [
        Algo::Ring,
        Algo::Direct,
        Algo::Tree,
        Algo::Rd,
        Algo::Rabenseifner,
        Algo::Hier,
        Algo::Chain,
        Algo::ScatterAllGather,
        Algo::Bruck,
        Algo::Pairwise,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Direct => "direct",
            Algo::Tree => "tree",
            Algo::Rd => "rd",
            Algo::Rabenseifner => "rabenseifner",
            Algo::Hier => "hier",
            Algo::Chain => "chain",
            Algo::ScatterAllGather => "scatter_allgather",
            Algo::Bruck => "bruck",
            Algo::Pairwise => "pairwise",
        }
    }

    pub fn parse(s: &str) -> Option<Algo> {
        let s = s.trim().to_ascii_lowercase();
        let alias = match s.as_str() {
            "shm" => "direct",
            "binomial" | "dbtree" => "tree",
            "recursive_doubling" | "rh" | "recursive_halving" => "rd",
            "hierarchical" => "hier",
            "sag" | "scatter" => "scatter_allgather",
            other => other,
        };
        Algo::ALL.into_iter().find(|a| a.name() == alias)
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The collectives that have a choice of algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

impl OpKind {
    pub const ALL: [OpKind; 6] = [
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::AllToAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "all_to_all",
        }
    }

    pub fn parse(s: &str) -> Option<OpKind> {
        let s = s.trim().to_ascii_lowercase();
        OpKind::ALL.into_iter().find(|o| o.name() == s || o.name().replace('_', "") == s)
    }

    pub(crate) fn index(self) -> usize {
        OpKind::ALL.iter().position(|&o| o == self).expect("listed")
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The ranks a ring (or any schedule over a subset) runs among, in ring order, and this
/// rank's position in it. `ranks: None` is the whole communicator in rank order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Circle<'a> {
    pub pos: usize,
    pub len: usize,
    pub ranks: Option<&'a [usize]>,
}

impl<'a> Circle<'a> {
    pub fn whole(s: &Step) -> Circle<'static> {
        Circle { pos: s.rank, len: s.size, ranks: None }
    }
    /// `ranks` in order; `me` must be one of them.
    pub fn among(ranks: &'a [usize], me: usize) -> Circle<'a> {
        let pos = ranks.iter().position(|&r| r == me).expect("this rank is a member");
        Circle { pos, len: ranks.len(), ranks: Some(ranks) }
    }
    /// The transport rank at position `i`.
    pub fn at(&self, i: usize) -> usize {
        self.ranks.map_or(i, |r| r[i])
    }
    pub fn right(&self) -> usize {
        self.at((self.pos + 1) % self.len)
    }
    pub fn left(&self) -> usize {
        self.at((self.pos + self.len - 1) % self.len)
    }
}

/// What every algorithm of one call needs to know besides its buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub rank: usize,
    pub size: usize,
    /// The tag of this call's messages (COLL_BIT | sequence number).
    pub tag: u64,
    pub deadline: Instant,
}

impl Step {
    pub fn right(&self) -> usize {
        (self.rank + 1) % self.size
    }
    pub fn left(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }
}

/// Splits `count` elements of `esize` bytes into `parts` contiguous byte ranges whose element
/// counts differ by at most one.
pub(crate) fn even_blocks(count: usize, parts: usize, esize: usize) -> Vec<Range<usize>> {
    (0..parts).map(|k| (count * k / parts) * esize..(count * (k + 1) / parts) * esize).collect()
}

/// Ranges of consecutive blocks of the given byte lengths.
pub(crate) fn blocks_of(lens: impl IntoIterator<Item = usize>) -> Vec<Range<usize>> {
    let mut at = 0;
    lens.into_iter()
        .map(|n| {
            at += n;
            at - n..at
        })
        .collect()
}

/// A shared view of block `a` and a mutable view of block `b` of one buffer; `a` and `b` must not overlap.
pub(crate) fn split2<'a>(buf: &'a mut [u8], a: &Range<usize>, b: &Range<usize>) -> (&'a [u8], &'a mut [u8]) {
    debug_assert!(a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty());
    if a.is_empty() {
        return (&[], &mut buf[b.clone()]);
    }
    if a.start < b.start {
        let (x, y) = buf.split_at_mut(b.start);
        (&x[a.clone()], &mut y[..b.len()])
    } else {
        let (x, y) = buf.split_at_mut(a.start);
        (&y[..a.len()], &mut x[b.clone()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_blocks_cover_everything_once() {
        for count in [0, 1, 7, 1000, 1048579] {
            for parts in 1..=8 {
                let b = even_blocks(count, parts, 4);
                assert_eq!(b.len(), parts);
                assert_eq!(b[0].start, 0);
                assert_eq!(b[parts - 1].end, count * 4);
                for w in b.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let lens: Vec<_> = b.iter().map(|r| r.len() / 4).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn split2_gives_disjoint_views() {
        let mut buf: Vec<u8> = (0..10).collect();
        let (a, b) = split2(&mut buf, &(6..8), &(2..4));
        assert_eq!(a, &[6, 7]);
        b.copy_from_slice(&[0, 0]);
        let (a, b) = split2(&mut buf, &(0..2), &(8..10));
        assert_eq!(a, &[0, 1]);
        assert_eq!(b, &[8, 9]);
        assert_eq!(buf, [0, 1, 0, 0, 4, 5, 6, 7, 8, 9]);
    }
}
