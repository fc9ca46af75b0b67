//! Sets of time as sorted, disjoint, half-open intervals `[a, b)` in nanoseconds: how long a
//! caller was blocked, waited for peers, or had communication in flight is a union of many
//! records' spans, measured exactly by sorting and merging rather than by sampling.

/// A union of intervals, sorted and disjoint (touching intervals are merged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Set(Vec<(i64, i64)>);

impl Set {
    /// The union of `spans`; empty and reversed spans contribute nothing.
    pub fn union(mut spans: Vec<(i64, i64)>) -> Set {
        spans.retain(|&(a, b)| b > a);
        spans.sort_unstable();
        let mut out: Vec<(i64, i64)> = Vec::with_capacity(spans.len());
        for (a, b) in spans {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        Set(out)
    }

    pub fn spans(&self) -> &[(i64, i64)] {
        &self.0
    }

    /// Total length.
    pub fn len(&self) -> i64 {
        self.0.iter().map(|&(a, b)| b - a).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The part inside `[lo, hi)`. Binary search to the first span that reaches past `lo`, so
    /// clipping to every step of a long trace costs the step's spans, not the trace's.
    pub fn clip(&self, lo: i64, hi: i64) -> Set {
        let first = self.0.partition_point(|&(_, b)| b <= lo);
        let out = self.0[first..]
            .iter()
            .take_while(|&&(a, _)| a < hi)
            .map(|&(a, b)| (a.max(lo), b.min(hi)))
            .filter(|&(a, b)| b > a)
            .collect();
        Set(out)
    }

    /// Both: `self ∩ other`.
    pub fn intersect(&self, other: &Set) -> Set {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < a.len() && j < b.len() {
            let lo = a[i].0.max(b[j].0);
            let hi = a[i].1.min(b[j].1);
            if hi > lo {
                out.push((lo, hi));
            }
            if a[i].1 < b[j].1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        Set(out)
    }

    /// `self \ other`.
    pub fn minus(&self, other: &Set) -> Set {
        let mut out = Vec::new();
        let mut j = 0;
        for &(mut a, b) in &self.0 {
            while j < other.0.len() && other.0[j].1 <= a {
                j += 1;
            }
            let mut k = j;
            while k < other.0.len() && other.0[k].0 < b {
                let (oa, ob) = other.0[k];
                if oa > a {
                    out.push((a, oa));
                }
                a = a.max(ob);
                k += 1;
            }
            if b > a {
                out.push((a, b));
            }
        }
        Set(out)
    }
}

/// Nearest-rank percentile `p` (0..=100) of `v`, sorted here; 0 for none.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

pub fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0)
}

/// The largest, 0 for none.
pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x)))).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_clip_intersect_minus() {
        let s = Set::union(vec![(5, 7), (0, 2), (1, 3), (3, 4), (9, 9), (8, 6)]);
        assert_eq!(s.spans(), &[(0, 4), (5, 7)]);
        assert_eq!(s.len(), 6);
        assert_eq!(s.clip(1, 6).spans(), &[(1, 4), (5, 6)]);
        assert!(s.clip(10, 20).is_empty());
        let t = Set::union(vec![(3, 6)]);
        assert_eq!(s.intersect(&t).spans(), &[(3, 4), (5, 6)]);
        assert_eq!(s.minus(&t).spans(), &[(0, 3), (6, 7)]);
        assert_eq!(t.minus(&s).spans(), &[(4, 5)]);
        assert_eq!(percentile(&[3.0, 1.0, 2.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
        assert_eq!(max(&[1.0, 5.0, 2.0]), 5.0);
    }
}
