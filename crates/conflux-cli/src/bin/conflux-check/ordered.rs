//! `conflux-check ordered` (with CONFLUX_DETERMINISTIC=1): all_reduce, reduce and
//! reduce_scatter of f32, f64 and bf16 data whose sums depend on the order of addition must
//! equal, bit for bit, the sum over ranks 0, 1, ..., N-1 in that order computed here, whatever
//! algorithm is forced. Each rank prints a hash of every result so that runs over other
//! transports can be compared.

use conflux::{Algo, Communicator, ReduceOp};
use half::bf16;

use super::Checker;

/// An input whose magnitudes differ by up to 10^6 between ranks and elements, so that
/// floating-point addition in another order gives another answer.
fn input(rank: usize, i: usize) -> f64 {
    let m = ((rank * 7919 + i * 104_729) % 1_000_003) as f64 / 1_000_003.0 - 0.5;
    m * 10f64.powi(((rank + 3 * i) % 7) as i32 - 3)
}

/// How an element type is summed in rank order: f32 and f64 add in their own type, bf16
/// accumulates in f32 and rounds once (the library's documented order).
trait Ordered: conflux::Element + Copy {
    fn from(v: f64) -> Self;
    fn sum_in_rank_order(n: usize, i: usize) -> Self;
    fn bits(self) -> u64;
}

impl Ordered for f32 {
    fn from(v: f64) -> f32 {
        v as f32
    }
    fn sum_in_rank_order(n: usize, i: usize) -> f32 {
        (1..n).fold(input(0, i) as f32, |acc, r| acc + input(r, i) as f32)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Ordered for f64 {
    fn from(v: f64) -> f64 {
        v
    }
    fn sum_in_rank_order(n: usize, i: usize) -> f64 {
        (1..n).fold(input(0, i), |acc, r| acc + input(r, i))
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

impl Ordered for bf16 {
    fn from(v: f64) -> bf16 {
        bf16::from_f64(v)
    }
    fn sum_in_rank_order(n: usize, i: usize) -> bf16 {
        bf16::from_f32((0..n).map(|r| bf16::from_f64(input(r, i)).to_f32()).fold(0.0f32, |a, x| a + x))
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

fn check<T: Ordered>(c: &mut Checker, comm: &Communicator, count: usize, hash: &mut u64) {
    let (n, r) = (comm.size(), comm.rank());
    let mine: Vec<T> = (0..count).map(|i| T::from(input(r, i))).collect();
    let want: Vec<T> = (0..count).map(|i| T::sum_in_rank_order(n, i)).collect();
    let mut record = |what: &str, got: &[T], want: &[T], c: &mut Checker| {
        for g in got {
            *hash = (*hash ^ g.bits()).wrapping_mul(0x100_0000_01b3);
        }
        let bad = got.iter().zip(want).position(|(g, w)| g.bits() != w.bits());
        match bad {
            None => c.passed += 1,
            Some(i) => {
                c.failed.push(format!("{what}({}, {count}): element {i} differs from the rank-order sum", T::DTYPE))
            }
        }
    };
    let mut buf = mine.clone();
    if c.ok("all_reduce", comm.all_reduce(&mut buf, ReduceOp::Sum)) {
        record("all_reduce", &buf, &want, c);
    }
    let root = count % n;
    let mut buf = mine.clone();
    if c.ok("reduce", comm.reduce(&mut buf, ReduceOp::Sum, root)) && r == root {
        record("reduce", &buf, &want, c);
    }
    let per = count / n;
    let mut buf = mine[..per * n].to_vec();
    if c.ok("reduce_scatter", comm.reduce_scatter_in_place(&mut buf, ReduceOp::Sum)) {
        record("reduce_scatter", &buf[r * per..(r + 1) * per], &want[r * per..(r + 1) * per], c);
    }
}

pub(crate) fn scenario_ordered(comm: Communicator) -> Checker {
    let mut c = Checker { comm: comm.with_algo(None), passed: 0, failed: Vec::new() };
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let algos = [None, Some(Algo::Ring), Some(Algo::Tree), Some(Algo::Rd), Some(Algo::Rabenseifner)];
    for algo in algos {
        let forced = comm.with_algo(algo);
        for count in [1, 7, 1000, 70_001] {
            check::<f32>(&mut c, &forced, count, &mut hash);
            check::<f64>(&mut c, &forced, count, &mut hash);
            check::<bf16>(&mut c, &forced, count, &mut hash);
        }
    }
    println!("rank {}: ORDERED-HASH {hash:016x}", comm.rank());
    c
}
