//! Collective algorithms. Each is a small module that sees only `Transport::exchange` (and,
//! for the direct shared-segment algorithms, the segment's slots): one schedule of steps.

pub(crate) mod chain;
pub(crate) mod direct;
pub(crate) mod pairwise;
pub(crate) mod ring;

use std::ops::Range;
use std::time::Instant;

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
