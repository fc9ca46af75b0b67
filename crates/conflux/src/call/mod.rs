//! What a call is, in terms every layer shares: the collectives that have a choice of
//! algorithm, the algorithms' names, and the fingerprint every message of a collective
//! carries. A leaf: it imports nothing of this crate but `dtype`, so that the transport can
//! stamp and compare fingerprints without knowing any algorithm or communicator.
//!
//! The algorithms themselves (which operations each serves, its cost, its schedule) are
//! `algo/`'s, in its one table (`algo/table.rs`); this names them.

mod fingerprint;

use std::fmt;

pub(crate) use fingerprint::{CallShape, Calls, Fingerprint};

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
