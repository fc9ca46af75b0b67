//! The byte terms of a rooted operation (broadcast, reduce) on one host over shared memory.
//!
//! A hop of `b` bytes from one rank to another is a copy into their ring and a copy out of it,
//! on the two ranks' cores at once: `b·cp` of wall time and twice that of core time (a reduce's
//! hop takes `cp + γ`: the receiver reduces as it copies out). An algorithm costs the longer
//! of two bounds:
//!
//! - its path: the hops one after another on its busiest rank or along its deepest branch;
//! - its work: the core time of all its hops spread over the cores there are. With a core per
//!   rank this is rarely the longer; on an oversubscribed host it is, and it is alike for the
//!   tree and the chain, since every byte crosses N - 1 links whichever the schedule.
//!
//! Measured (`conflux bench all --algo all`, 2 cores; 5 runs at 2 ranks, 6 at 4, 5 at 8),
//! per kB of a 2-32 MiB broadcast: 2 ranks 0.09 us for one hop (cp = 0.083); 4 ranks
//! 0.26-0.33 for both tree and chain, against 0.25 from their work; 8 ranks 0.74-1.05 against
//! 0.58; scatter + all-gather 0.13 / 0.33-0.39 / 0.69-1.03 against 0.125 / 0.31 / 0.66. The
//! previous model, per-stream β along the path, put the oversubscribed chain at half the
//! tree's time, and chose it at 2-8 MiB where the tree was 5-10% faster.
//!
//! Whole-message forwarding (the binomial tree) reads a message back once per rank that
//! forwards it; beyond `SPILL` bytes it is no longer in cache by then, where the chain's
//! 256 KiB chunks still are (measured at 8 ranks: tree 0.95 of the chain's time at 8 MiB,
//! 1.2x at 32 MiB; at 4 ranks 0.93 and 1.05x; this term makes it 1.21x and 1.17x at 32 MiB).

use super::{Algo, OpKind};

/// Beyond this, a whole message has left the cache before its forwarding rank sends it on.
const SPILL: usize = 16 << 20;

/// What the byte terms depend on.
pub(super) struct Shape {
    pub bytes: usize,
    pub n: f64,
    /// Ranks per core, at least 1.
    pub load: f64,
    /// The chain's chunks and its steps (chunks plus the fill of N - 2 hops).
    pub chunks: f64,
    pub steps: f64,
    /// One hop's fixed cost in microseconds of core time (plain α: the crowded rest is waiting).
    pub alpha: f64,
}

/// The byte times in microseconds of `algo` serving rooted `op` on one host: along its path,
/// and its work over the cores. `cp` and `g` are the copy and reduction costs in us per kB.
/// None if `algo` has no schedule for `op`.
pub(super) fn bytes(op: OpKind, algo: Algo, s: &Shape, cp: f64, g: f64) -> Option<(f64, f64)> {
    let n = s.n;
    // The message in kB, so that kB x us/kB is in microseconds.
    let kb = s.bytes as f64 * 1e-3;
    let logn = n.log2().ceil();
    let cores = n / s.load.max(1.0);
    let tree = binomial(n as usize);
    let spill = if s.bytes > SPILL { tree.forwarders * cp } else { 0.0 };
    // The chain's ranks between the ends copy each chunk out and on, in turn.
    let relay = if n > 2.0 { 2.0 } else { 1.0 };
    let pipe = s.steps / s.chunks;
    // Every rank of a reduce starts from a copy of its input: scratch that the others send
    // on, and the root's result (`reduce_into`; an in-place reduce skips the root's).
    let input = n * cp;
    // `hops` counts the messages sent: each costs α of core time besides its bytes (a blocked
    // wait is a sleep and a wake-up), which is what sets the tree apart from the chain when
    // both are bound by their work.
    let (path, work, hops) = match (op, algo) {
        (OpKind::Broadcast, Algo::Tree) => (tree.path * cp, 2.0 * (n - 1.0) * cp + spill, n - 1.0),
        (OpKind::Broadcast, Algo::Chain) => (relay * pipe * cp, 2.0 * (n - 1.0) * cp, (n - 1.0) * s.chunks),
        // Scatter: N - 1 blocks from the root; all-gather: N - 1 blocks into every rank.
        (OpKind::Broadcast, Algo::ScatterAllGather) => {
            (3.0 * (n - 1.0) / n * cp, 2.0 * (n - 1.0) * (n + 1.0) / n * cp, (n - 1.0) * (n + 1.0))
        }
        // The root reduces its children's results one after another.
        (OpKind::Reduce, Algo::Tree) => (cp + logn * cp.max(g), input + (n - 1.0) * (cp + g) + spill, n - 1.0),
        (OpKind::Reduce, Algo::Chain) => {
            let hop = if n > 2.0 { cp + g } else { cp.max(g) };
            (cp + pipe * hop, input + (n - 1.0) * (cp + g), (n - 1.0) * s.chunks)
        }
        // Reduce-scatter around the ring, then the N - 1 reduced blocks gathered to the root.
        (OpKind::Reduce, Algo::Ring) => {
            let share = (n - 1.0) / n;
            let hops = (n - 1.0) * (n + 1.0);
            (cp + share * (2.0 * cp + g), input + (n - 1.0) * (cp + g) + 2.0 * share * cp, hops)
        }
        _ => return None,
    };
    Some((kb * path, (kb * work + hops * s.alpha) / cores))
}

/// The binomial tree over `n` ranks (tree.rs), in hops.
#[derive(Debug, PartialEq)]
struct Binomial {
    /// When its last rank has the message: a rank's sends to its k children interleave, so
    /// all of them have it k hops after it did.
    path: f64,
    /// Ranks that pass the message on: neither the root nor a leaf.
    forwarders: f64,
}

fn binomial(n: usize) -> Binomial {
    let n = n.max(1);
    // In ranks relative to the root: vr's children are vr + m for each power of two m below
    // vr's lowest set bit (any, for the root) while vr + m < n.
    let children = |vr: usize| {
        let low = if vr == 0 { usize::MAX } else { vr & vr.wrapping_neg() };
        (0..usize::BITS).map(|i| 1usize << i).take_while(move |&m| m < low && vr + m < n).map(move |m| vr + m)
    };
    let (mut at, mut forwarders) = (vec![0usize; n], 0);
    // A parent's number is below its children's, so it has the message first.
    for vr in 0..n {
        let k = children(vr).count();
        forwarders += usize::from(vr > 0 && k > 0);
        for c in children(vr) {
            at[c] = at[vr] + k;
        }
    }
    Binomial { path: at.iter().copied().max().unwrap_or(0) as f64, forwarders: forwarders as f64 }
}

#[cfg(test)]
mod tests {
    use super::{binomial, Binomial};

    #[test]
    fn binomial_paths_and_forwarders() {
        let b = |path: f64, forwarders: f64| Binomial { path, forwarders };
        assert_eq!(binomial(1), b(0.0, 0.0));
        assert_eq!(binomial(2), b(1.0, 0.0));
        // 0 -> {1, 2}: 2 is a leaf.
        assert_eq!(binomial(3), b(2.0, 0.0));
        assert_eq!(binomial(4), b(3.0, 1.0));
        // 0 -> {1, 2, 4}, 2 -> 3: 4 is a leaf.
        assert_eq!(binomial(5), b(4.0, 1.0));
        // 0 -> {1, 2, 4}, 2 -> 3, 4 -> {5, 6}, 6 -> 7: log2 N (log2 N + 1) / 2 hops.
        assert_eq!(binomial(8), b(6.0, 3.0));
    }
}
