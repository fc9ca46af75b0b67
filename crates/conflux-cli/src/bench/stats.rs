//! The statistics the bench reads its rounds with: medians, and the ratio of two algorithms'
//! times taken round by round with a distribution-free confidence interval.

/// The share of the best forced algorithm's busbw that `--report-auto` holds auto to.
pub const TARGET: f64 = 0.9;

/// The median of `v` (the lower middle of an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// A ratio of times over rounds: the median and its 95% confidence interval.
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Ratio {
    /// Whether `x` lies in the interval, so the data cannot yet tell the ratio from `x`.
    pub fn holds(&self, x: f64) -> bool {
        self.lo < x && x <= self.hi
    }
}

/// Which of `times` (per algorithm, microseconds per round) is the best: the lowest median.
pub fn best_of(times: &[&[f64]]) -> Option<usize> {
    (0..times.len()).min_by(|&a, &b| median(times[a]).total_cmp(&median(times[b])))
}

/// `a`'s time over `b`'s, round by round (how fast `b` runs against `a`): their median, and
/// the distribution-free interval of the sign test (order statistics k and m + 1 - k of m
/// ratios, k the largest with P(Binomial(m, 1/2) < k) <= 2.5%; fewer than 6 rounds: min-max).
pub fn paired(a: &[f64], b: &[f64]) -> Ratio {
    let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    ratios.sort_by(f64::total_cmp);
    let m = ratios.len();
    let k = sign_test_rank(m);
    let (lo, hi) = if k == 0 { (ratios[0], ratios[m - 1]) } else { (ratios[k - 1], ratios[m - k]) };
    Ratio { median: median(&ratios), lo, hi }
}

/// The largest k with P(Binomial(m, 1/2) <= k - 1) <= 0.025, or 0 if there is none.
fn sign_test_rank(m: usize) -> usize {
    let mut tail = 0.0; // P(X <= k - 1)
    let mut pmf = 0.5f64.powi(m as i32); // P(X = k)
    let mut k = 0;
    while k < m {
        if tail + pmf > 0.025 {
            return k;
        }
        tail += pmf;
        pmf *= (m - k) as f64 / (k + 1) as f64;
        k += 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::{paired, sign_test_rank};

    #[test]
    fn sign_test_ranks_match_the_binomial_tables() {
        // Published 95% intervals for the median: m = 6 (1, 6), 15 (4, 12), 20 (6, 15), 25 (8, 18).
        assert_eq!(sign_test_rank(5), 0);
        assert_eq!(sign_test_rank(6), 1);
        assert_eq!(sign_test_rank(15), 4);
        assert_eq!(sign_test_rank(20), 6);
        assert_eq!(sign_test_rank(25), 8);
    }

    #[test]
    fn paired_ratios_are_taken_round_by_round() {
        // b is twice as fast as a in every round, however much both drift.
        let a = [10.0, 40.0, 12.0, 80.0, 20.0, 30.0];
        let b = [5.0, 20.0, 6.0, 40.0, 10.0, 15.0];
        let r = paired(&a, &b);
        assert_eq!((r.median, r.lo, r.hi), (2.0, 2.0, 2.0));
        let r = paired(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0; 5]);
        assert_eq!((r.median, r.lo, r.hi), (3.0, 1.0, 5.0));
    }
}
