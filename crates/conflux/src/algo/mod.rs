//! Collective algorithms, one small module each, all registered in one table (`table.rs`),
//! with the cost model that chooses among them (`select.rs`). They see only the transport's
//! interface (and the shared segment, for the direct ones) through a `Ctx`; this layer
//! imports nothing from `comm/`. Each module is one schedule of steps, most of them sends and
//! receives through `Transport::exchange`.

pub(crate) mod bruck;
pub(crate) mod by_ref;
pub(crate) mod chain;
pub(crate) mod coll;
pub(crate) mod direct;
pub(crate) mod fold;
pub(crate) mod forms;
pub(crate) mod hier;
pub(crate) mod moves;
pub(crate) mod ordered;
pub(crate) mod pairwise;
pub(crate) mod rabenseifner;
pub(crate) mod rd;
pub(crate) mod ring;
pub(crate) mod sag;
pub mod select;
pub(crate) mod table;
pub(crate) mod tree;

pub use crate::call::{Algo, OpKind};

use std::ops::Range;
use std::time::Instant;

use crate::transport::Transport;
use select::Topo;

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

/// What an algorithm runs with besides its buffers: this rank's links, the call's step, where
/// the ranks are, and a buffer kept between calls.
pub(crate) struct Ctx<'a> {
    pub t: &'a mut Transport,
    pub s: Step,
    /// The communicator's topology, as the planner priced it (hier's nodes; direct's placement
    /// asks whether the host runs more ranks than cores).
    pub topo: &'a Topo,
    /// Kept by the lane between calls, so a staged message's pages are faulted in once.
    pub staging: &'a mut Vec<u8>,
}

/// The element type and reduce op of a reduction.
pub(crate) type Red = (crate::dtype::DataType, crate::dtype::ReduceOp);

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

/// A call's byte ranges, one per rank (or segment): on the stack up to 8, since a list on the
/// heap per call was a measurable share of an 8-byte collective.
pub(crate) type Blocks = smallvec::SmallVec<[Range<usize>; 8]>;

/// Splits `count` elements of `esize` bytes into `parts` contiguous byte ranges whose element
/// counts differ by at most one.
#[inline]
pub(crate) fn even_blocks(count: usize, parts: usize, esize: usize) -> Blocks {
    // Pushed in place, and inlined: collected, or returned from a call, the whole list (136
    // bytes) was copied on the way, several times.
    let mut blocks = Blocks::new();
    for k in 0..parts {
        blocks.push((count * k / parts) * esize..(count * (k + 1) / parts) * esize);
    }
    blocks
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

/// Mutable views of `ranges` of `buf`, in the order given; the ranges must not overlap.
pub(crate) fn carve<'a>(buf: &'a mut [u8], ranges: &[Range<usize>]) -> Vec<&'a mut [u8]> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
    let mut out: Vec<Option<&'a mut [u8]>> = (0..ranges.len()).map(|_| None).collect();
    let (mut rest, mut base) = (buf, 0);
    for i in order {
        let r = &ranges[i];
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - base);
        let (piece, tail) = tail.split_at_mut(r.len());
        out[i] = Some(piece);
        rest = tail;
        base = r.end;
    }
    out.into_iter().map(|p| p.expect("every range carved")).collect()
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

    #[test]
    fn carve_gives_the_ranges_asked_for() {
        let mut buf: Vec<u8> = (0..10).collect();
        let p = carve(&mut buf, &[6..8, 0..2, 3..3, 9..10]);
        assert_eq!(p.iter().map(|x| x.to_vec()).collect::<Vec<_>>(), vec![vec![6, 7], vec![0, 1], vec![], vec![9]]);
    }
}
