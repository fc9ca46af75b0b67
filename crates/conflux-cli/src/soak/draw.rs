//! What soak runs next: one pseudo-random draw per iteration from a generator every rank
//! seeds alike, so that all ranks make the same calls in the same order without talking.

use conflux::algo::select;
use conflux::{Algo, DataType, OpKind, ReduceOp};

/// splitmix64: tiny, fast, and identical on every platform, which is all soak needs (the
/// draws must agree across ranks, not be unpredictable).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; 0 when `n` is 0, so callers need no special case for empty ranges.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }

    /// One of `xs` (not empty).
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// The calls soak makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    /// all_to_all_v with blocks of different sizes on every rank.
    AllToAllV,
    Barrier,
    /// Every rank sends to the rank `shift` ahead and receives from the one `shift` behind.
    SendRecv,
}

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 9] = [
        Kind::AllReduce,
        Kind::Broadcast,
        Kind::Reduce,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::AllToAll,
        Kind::AllToAllV,
        Kind::Barrier,
        Kind::SendRecv,
    ];

    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllToAll => "all_to_all",
            Kind::AllToAllV => "all_to_all_v",
            Kind::Barrier => "barrier",
            Kind::SendRecv => "send_recv",
        }
    }

    /// This kind's position in [`Kind::ALL`], for per-kind counters.
    pub fn index(self) -> usize {
        Kind::ALL.iter().position(|&k| k == self).expect("listed")
    }

    /// The collective whose algorithm can be chosen, for the kinds that have a choice.
    pub fn op_kind(self) -> Option<OpKind> {
        match self {
            Kind::AllReduce => Some(OpKind::AllReduce),
            Kind::Broadcast => Some(OpKind::Broadcast),
            Kind::Reduce => Some(OpKind::Reduce),
            Kind::AllGather => Some(OpKind::AllGather),
            Kind::ReduceScatter => Some(OpKind::ReduceScatter),
            Kind::AllToAll | Kind::AllToAllV => Some(OpKind::AllToAll),
            Kind::Barrier | Kind::SendRecv => None,
        }
    }

    fn reduces(self) -> bool {
        matches!(self, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter)
    }
}

/// One call, as every rank draws it.
#[derive(Debug, Clone)]
pub struct Draw {
    pub kind: Kind,
    pub dtype: DataType,
    /// The reduction for reducing kinds; Sum (which only shapes the inputs) for the others.
    pub redop: ReduceOp,
    /// Bytes of the call's largest buffer: all_gather's output, reduce_scatter's input, one
    /// rank's all_to_all send buffer, as nccl-tests counts them.
    pub bytes: usize,
    /// Index into the groups soak made at start (0 is the whole job).
    pub group: usize,
    pub in_place: bool,
    pub nonblocking: bool,
    /// None: the library's own choice.
    pub algo: Option<Algo>,
    /// Seeds whatever depends on the group's size (root, peer shift, all_to_all_v splits): the
    /// two halves of a split differ in size, yet must stay in step with each other.
    pub detail: u64,
}

/// The next draw. `max_bytes` bounds `bytes`; `groups` is how many groups there are.
pub fn draw(rng: &mut Rng, max_bytes: usize, groups: usize) -> Draw {
    let kind = rng.pick(&Kind::ALL);
    let dtype = rng.pick(&DataType::ALL);
    let valid: Vec<ReduceOp> = ReduceOp::ALL.into_iter().filter(|op| op.accepts(dtype)).collect();
    let redop = if kind.reduces() { rng.pick(&valid) } else { ReduceOp::Sum };
    let bytes = log_uniform(rng, max_bytes);
    // The whole job most often: it has the most ranks and the most algorithms that serve.
    let group = if groups < 2 || rng.chance(1, 2) { 0 } else { 1 + rng.below(groups - 1) };
    let in_place = rng.chance(1, 2);
    let nonblocking = rng.chance(1, 3);
    let algo = kind.op_kind().and_then(|op| forced_algo(rng, op));
    Draw { kind, dtype, redop, bytes, group, in_place, nonblocking, algo, detail: rng.next_u64() }
}

/// Every kind at `max_bytes` on every group, blocking out of place and non-blocking: the
/// calls that need the most memory, run first so that RSS is measured from a working size.
pub fn largest(max_bytes: usize, groups: usize) -> Vec<Draw> {
    let mut v = Vec::new();
    for group in 0..groups {
        for kind in Kind::ALL {
            for nonblocking in [false, true] {
                let (dtype, redop, algo, detail) = (DataType::F32, ReduceOp::Sum, None, v.len() as u64);
                v.push(Draw {
                    kind,
                    dtype,
                    redop,
                    bytes: max_bytes,
                    group,
                    in_place: false,
                    nonblocking,
                    algo,
                    detail,
                });
            }
        }
    }
    v
}

/// 0 one time in 16, else a size whose power of two is uniform up to `max`'s: small calls
/// (latency paths, odd counts) are as common as large ones (bandwidth paths).
fn log_uniform(rng: &mut Rng, max: usize) -> usize {
    if max == 0 || rng.chance(1, 16) {
        return 0;
    }
    let top = usize::BITS - 1 - max.leading_zeros();
    let low = 1usize << rng.below(top as usize + 1);
    (low + rng.below(low)).min(max)
}

/// None (auto) half the time; else an algorithm that implements `op`, or now and then any
/// algorithm at all, so that refusals are exercised too.
fn forced_algo(rng: &mut Rng, op: OpKind) -> Option<Algo> {
    if rng.chance(1, 2) {
        return None;
    }
    if rng.chance(1, 8) {
        return Some(rng.pick(&Algo::ALL));
    }
    let implementing: Vec<Algo> = Algo::ALL.into_iter().filter(|&a| select::implements(a, op)).collect();
    Some(rng.pick(&implementing))
}

/// all_to_all_v's counts: `c[s][d]` elements go from rank s to rank d, about `mean` each.
/// Every rank's own row is made uneven (its diagonal differs from its right neighbour's
/// entry), so that each call really is uneven on every rank.
pub fn uneven_counts(rng: &mut Rng, n: usize, mean: usize) -> Vec<Vec<usize>> {
    let mut c: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| rng.below(2 * mean + 1)).collect()).collect();
    if n > 1 {
        for (s, row) in c.iter_mut().enumerate() {
            if row[s] == row[(s + 1) % n] {
                row[s] += 1;
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            let (x, y) = (draw(&mut a, 1 << 20, 4), draw(&mut b, 1 << 20, 4));
            assert_eq!(format!("{x:?}"), format!("{y:?}"));
        }
    }

    #[test]
    fn sizes_stay_in_range_and_reach_both_ends() {
        let mut r = Rng::new(1);
        let sizes: Vec<usize> = (0..2000).map(|_| log_uniform(&mut r, 1000)).collect();
        assert!(sizes.iter().all(|&s| s <= 1000));
        assert!(sizes.contains(&0) && sizes.iter().any(|&s| s < 4) && sizes.iter().any(|&s| s > 500));
    }

    #[test]
    fn every_row_of_the_counts_is_uneven() {
        let mut r = Rng::new(3);
        for n in 2..6 {
            for mean in 0..4 {
                let c = uneven_counts(&mut r, n, mean);
                assert!(c.iter().all(|row| row.iter().any(|&x| x != row[0])), "{c:?}");
            }
        }
    }
}
