//! Fitting recursive doubling and halving, which need a power-of-two number of ranks, to any
//! world size (MPICH's scheme). With n = p + r, p the largest power of two ≤ n, the first 2r
//! ranks pair up: each even one (an *extra*) hands its data to the odd one after it and sits
//! out, which costs one step before and one after. The p others are *active*, numbered by a
//! virtual rank v in 0..p in rank order, so that a pair's two blocks stay adjacent.
//!
//! Pure data: tested without sockets below.

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fold {
    pub n: usize,
    /// Active ranks: the largest power of two ≤ n.
    pub p: usize,
    /// Pairs folded together: n - p.
    pub r: usize,
}

/// What a rank does in a folded schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Hands its data to `active` before, and takes the result from it after.
    Extra { active: usize },
    /// Takes part as virtual rank `v`, for itself and, if folded, for `extra`.
    Active { v: usize, extra: Option<usize> },
}

impl Fold {
    pub fn new(n: usize) -> Fold {
        assert!(n > 0, "a world has at least one rank");
        let p = 1 << (usize::BITS - 1 - n.leading_zeros());
        Fold { n, p, r: n - p }
    }

    pub fn role(&self, rank: usize) -> Role {
        if rank < 2 * self.r {
            if rank.is_multiple_of(2) {
                Role::Extra { active: rank + 1 }
            } else {
                Role::Active { v: rank / 2, extra: Some(rank - 1) }
            }
        } else {
            Role::Active { v: rank - self.r, extra: None }
        }
    }

    /// The active rank of virtual rank `v`.
    pub fn rank_of(&self, v: usize) -> usize {
        if v < self.r {
            2 * v + 1
        } else {
            v + self.r
        }
    }

    /// The byte range virtual rank `v` stands for, from per-rank `blocks`: a folded pair's two
    /// blocks, which are adjacent, as one.
    pub fn merged(&self, blocks: &[Range<usize>], v: usize) -> Range<usize> {
        if v < self.r {
            blocks[2 * v].start..blocks[2 * v + 1].end
        } else {
            blocks[v + self.r].clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::even_blocks;

    #[test]
    fn every_rank_has_one_role_and_virtual_ranks_cover_0_to_p() {
        for n in 1..=33 {
            let f = Fold::new(n);
            assert!(f.p.is_power_of_two() && f.p <= n && 2 * f.p > n);
            let mut seen = vec![false; f.p];
            for rank in 0..n {
                match f.role(rank) {
                    Role::Active { v, extra } => {
                        assert!(!seen[v]);
                        seen[v] = true;
                        assert_eq!(f.rank_of(v), rank);
                        if let Some(e) = extra {
                            assert_eq!(f.role(e), Role::Extra { active: rank });
                        }
                    }
                    Role::Extra { active } => {
                        assert!(matches!(f.role(active), Role::Active { extra: Some(e), .. } if e == rank))
                    }
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn merged_blocks_tile_the_buffer_in_virtual_order() {
        for n in 1..=17 {
            let f = Fold::new(n);
            let blocks = even_blocks(1000 + n, n, 4);
            let mut at = 0;
            for v in 0..f.p {
                let m = f.merged(&blocks, v);
                assert_eq!(m.start, at);
                at = m.end;
            }
            assert_eq!(at, (1000 + n) * 4);
        }
    }
}
