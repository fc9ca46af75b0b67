//! Link health, as HCCL's check_link_health: every pair of ranks measures the latency and
//! bandwidth of the link it really uses (shared memory or TCP, through the communicator's own
//! send and recv), and pairs far worse than others of their kind are flagged.
//!
//! Pairs are scheduled as a round-robin tournament (the circle method): in each round every
//! rank is in at most one pair, so a measurement never shares a rank with another one. The
//! pairs of a round run at once; a barrier separates rounds.

use std::fmt;

use super::Communicator;
use crate::error::{Error, Result};
use crate::measure::{median, round_trip_us};

/// Tag of the health check's messages, away from the small tags programs tend to use.
const TAG: u32 = 0x6865_616c;

/// How [`Communicator::link_health`] measures and judges. Every rank must pass the same.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthOptions {
    /// Bytes of each bandwidth round trip (default 4 MiB).
    pub bytes: usize,
    /// Timed round trips of `bytes` per pair; latency takes ten times as many of 8 bytes
    /// (default 10).
    pub iters: usize,
    /// A pair is slow when its bandwidth is below `threshold` × its kind's reference, or its
    /// latency above reference / `threshold` (default 0.5; in (0, 1]).
    pub threshold: f64,
}

impl Default for HealthOptions {
    fn default() -> HealthOptions {
        HealthOptions { bytes: 4 << 20, iters: 10, threshold: 0.5 }
    }
}

impl HealthOptions {
    /// Why these options cannot be used, if they cannot.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.bytes == 0 {
            return bad("link_health: bytes must be at least 1".into());
        }
        if self.iters == 0 {
            return bad("link_health: iters must be at least 1".into());
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return bad(format!("link_health: threshold must be in (0, 1], got {}", self.threshold));
        }
        Ok(())
    }
}

/// The kind of link a pair of ranks uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// The host's shared segment.
    Shm,
    /// A TCP connection (between hosts, or inside one with CONFLUX_TRANSPORT=tcp).
    Tcp,
}

impl LinkKind {
    /// "shm" or "tcp".
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Shm => "shm",
            LinkKind::Tcp => "tcp",
        }
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a typical link of one kind achieves in this job: the yardstick slow pairs are judged by.
#[derive(Debug, Clone, PartialEq)]
pub struct KindReference {
    /// The kind of link.
    pub kind: LinkKind,
    /// Reference 8-byte one-way latency, µs.
    pub latency_us: f64,
    /// Reference bandwidth, GB/s.
    pub gbps: f64,
    /// How many pairs use this kind.
    pub pairs: usize,
}

/// The result of [`Communicator::link_health`]; the same on every rank. Matrices are indexed
/// by rank; diagonal entries are 0 (latency, bandwidth) and None (kind).
#[derive(Debug, Clone, PartialEq)]
pub struct LinkHealth {
    /// One-way latency of 8 bytes, µs: half the median round trip.
    pub latency_us: Vec<Vec<f64>>,
    /// Bandwidth, GB/s: `bytes` over half the median round trip of `bytes`.
    pub gbps: Vec<Vec<f64>>,
    /// The link each pair uses.
    pub kind: Vec<Vec<Option<LinkKind>>>,
    /// Each kind's reference (only kinds some pair uses).
    pub reference: Vec<KindReference>,
    /// Flagged pairs `(a, b, ratio)`, a < b: ratio is the worse of bandwidth / reference and
    /// reference latency / latency, so below `threshold`, and 1 for a typical link.
    pub slow: Vec<(usize, usize, f64)>,
}

impl LinkHealth {
    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.latency_us.len()
    }
    /// No pair was flagged.
    pub fn healthy(&self) -> bool {
        self.slow.is_empty()
    }
    /// The reference of the kind of link `a` and `b` use (None when a == b).
    pub fn reference_of(&self, a: usize, b: usize) -> Option<&KindReference> {
        let k = self.kind.get(a)?.get(b).copied().flatten()?;
        self.reference.iter().find(|r| r.kind == k)
    }
    /// The pair's bandwidth over its kind's reference (below 1: slower than typical).
    pub fn bandwidth_ratio(&self, a: usize, b: usize) -> Option<f64> {
        Some(self.gbps[a][b] / self.reference_of(a, b)?.gbps)
    }
    /// The pair's latency over its kind's reference (above 1: slower than typical).
    pub fn latency_ratio(&self, a: usize, b: usize) -> Option<f64> {
        Some(self.latency_us[a][b] / self.reference_of(a, b)?.latency_us)
    }
}

impl Communicator {
    /// Measures every pair's link (collective: every rank calls it with the same options)
    /// and returns the full matrices on every rank. A rank that fails or dies during the
    /// check fails the call on every rank with the usual error naming it.
    pub fn link_health(&self, opts: &HealthOptions) -> Result<LinkHealth> {
        opts.validate()?;
        let n = self.size();
        let me = self.rank();
        // This rank's row: latency then bandwidth to each peer, as this rank timed them.
        let mut row = vec![0.0f64; 2 * n];
        let (mut small, mut big) = ([0u8; 8], vec![0u8; opts.bytes]);
        for round in tournament(n) {
            if let Some(peer) = round.iter().find(|&&(a, b)| a == me || b == me).map(|&(a, b)| a + b - me) {
                let iters = opts.iters.saturating_mul(10);
                let rtt8 = round_trip_us(self, peer, &mut small, opts.iters.max(5), iters, TAG)?;
                let rtt = round_trip_us(self, peer, &mut big, 1, opts.iters, TAG)?;
                row[peer] = rtt8 / 2.0;
                row[n + peer] = opts.bytes as f64 * 1e-3 / (rtt / 2.0).max(1e-3);
            }
            // Rounds in sequence: the next round's pairs must not overlap this one's.
            self.barrier()?;
        }
        let mut all = vec![0.0f64; 2 * n * n];
        self.all_gather(&row, &mut all)?;
        Ok(judge(&all, &self.topology().nodes, self.topology().local_tcp, opts.threshold))
    }
}

/// The circle method: rank `m-1` stays, the others rotate; with an odd count a phantom rank
/// makes the count even and its partner sits the round out. Every pair meets exactly once.
pub(crate) fn tournament(n: usize) -> Vec<Vec<(usize, usize)>> {
    let m = n + n % 2;
    (0..m.saturating_sub(1))
        .map(|r| {
            let others = (1..m / 2).map(|k| ((r + k) % (m - 1), (r + m - 1 - k) % (m - 1)));
            std::iter::once((r, m - 1))
                .chain(others)
                .filter(|&(a, b)| a < n && b < n)
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect()
        })
        .collect()
}

/// The matrices from every rank's row (`all`: n rows of 2n, latency then bandwidth), made
/// symmetric (the mean of both ends' timings of the same exchanges), and the verdict.
fn judge(all: &[f64], nodes: &[Vec<usize>], local_tcp: bool, threshold: f64) -> LinkHealth {
    let n = nodes.iter().map(|v| v.len()).sum::<usize>();
    let at = |r: usize, c: usize| all[r * 2 * n + c];
    let mut latency_us = vec![vec![0.0; n]; n];
    let mut gbps = vec![vec![0.0; n]; n];
    let node_of = |r: usize| nodes.iter().position(|v| v.contains(&r));
    let mut kind = vec![vec![None; n]; n];
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            latency_us[a][b] = (at(a, b) + at(b, a)) / 2.0;
            gbps[a][b] = (at(a, n + b) + at(b, n + a)) / 2.0;
            let shm = !local_tcp && node_of(a) == node_of(b);
            kind[a][b] = Some(if shm { LinkKind::Shm } else { LinkKind::Tcp });
        }
    }
    let reference: Vec<KindReference> =
        [LinkKind::Shm, LinkKind::Tcp].into_iter().filter_map(|k| reference(k, &kind, &latency_us, &gbps)).collect();
    let mut h = LinkHealth { latency_us, gbps, kind, reference, slow: Vec::new() };
    for a in 0..n {
        for b in a + 1..n {
            let (Some(bw), Some(lat)) = (h.bandwidth_ratio(a, b), h.latency_ratio(a, b)) else { continue };
            let ratio = bw.min(1.0 / lat);
            if ratio < threshold {
                h.slow.push((a, b, ratio));
            }
        }
    }
    h
}

/// The median, over the ranks with links of kind `k`, of each rank's median link of that
/// kind. Not the median of all pairs: with one bad rank among three, two of the three pairs
/// are bad, and their median would call the bad link typical. Each rank's median keeps a bad
/// rank's links from outvoting the others as long as fewer than half the ranks are bad.
fn reference(k: LinkKind, kind: &[Vec<Option<LinkKind>>], lat: &[Vec<f64>], bw: &[Vec<f64>]) -> Option<KindReference> {
    let (mut lats, mut bws, mut pairs) = (Vec::new(), Vec::new(), 0);
    for (a, row) in kind.iter().enumerate() {
        let peers: Vec<usize> = (0..row.len()).filter(|&b| row[b] == Some(k)).collect();
        if peers.is_empty() {
            continue;
        }
        pairs += peers.iter().filter(|&&b| b > a).count();
        lats.push(median(&mut peers.iter().map(|&b| lat[a][b]).collect::<Vec<_>>()));
        bws.push(median(&mut peers.iter().map(|&b| bw[a][b]).collect::<Vec<_>>()));
    }
    (pairs > 0).then(|| KindReference { kind: k, latency_us: median(&mut lats), gbps: median(&mut bws), pairs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_meets_once_and_no_rank_twice_in_a_round() {
        for n in 1..=9 {
            let mut met = vec![vec![0; n]; n];
            for round in tournament(n) {
                let mut busy = vec![false; n];
                for (a, b) in round {
                    assert!(a < b && b < n, "n={n}: pair ({a}, {b})");
                    assert!(!busy[a] && !busy[b], "n={n}: a rank in two pairs of one round");
                    busy[a] = true;
                    busy[b] = true;
                    met[a][b] += 1;
                }
            }
            for (a, row) in met.iter().enumerate() {
                for (b, &m) in row.iter().enumerate().skip(a + 1) {
                    assert_eq!(m, 1, "n={n}: pair ({a}, {b})");
                }
            }
        }
        assert_eq!(tournament(4).len(), 3);
        assert_eq!(tournament(5).len(), 5);
    }

    /// Rows as `link_health` gathers them, from a symmetric latency and bandwidth function.
    fn rows(n: usize, f: impl Fn(usize, usize) -> (f64, f64)) -> Vec<f64> {
        let mut all = vec![0.0; 2 * n * n];
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                let (l, g) = f(a.min(b), a.max(b));
                all[a * 2 * n + b] = l;
                all[a * 2 * n + n + b] = g;
            }
        }
        all
    }

    #[test]
    fn one_bad_rank_of_three_is_flagged_by_its_two_pairs() {
        let all = rows(3, |_, b| if b == 2 { (50.0, 0.01) } else { (50.0, 1.0) });
        let nodes = vec![vec![0], vec![1], vec![2]];
        let h = judge(&all, &nodes, false, 0.5);
        let flagged: Vec<(usize, usize)> = h.slow.iter().map(|s| (s.0, s.1)).collect();
        assert_eq!(flagged, [(0, 2), (1, 2)], "{h:?}");
        assert!(h.slow.iter().all(|s| s.2 < 0.05), "{h:?}");
        assert_eq!(h.reference[0].kind, LinkKind::Tcp);
    }

    #[test]
    fn kinds_are_judged_apart_and_latency_counts() {
        // Two hosts of two: shm inside is fast, tcp across slower but uniform: all healthy.
        let nodes = vec![vec![0, 1], vec![2, 3]];
        let same = |a: usize, b: usize| (a < 2) == (b < 2);
        let all = rows(4, |a, b| if same(a, b) { (1.0, 5.0) } else { (40.0, 1.0) });
        let h = judge(&all, &nodes, false, 0.5);
        assert!(h.healthy(), "{h:?}");
        assert_eq!((h.kind[0][1], h.kind[0][2], h.kind[0][0]), (Some(LinkKind::Shm), Some(LinkKind::Tcp), None));
        assert_eq!(h.reference.len(), 2);
        // CONFLUX_TRANSPORT=tcp: all one kind; now one pair with 5x the latency is flagged.
        let all = rows(4, |a, b| if (a, b) == (1, 3) { (200.0, 1.0) } else { (40.0, 1.0) });
        let h = judge(&all, &nodes, true, 0.5);
        assert_eq!(h.slow.len(), 1, "{h:?}");
        assert_eq!((h.slow[0].0, h.slow[0].1), (1, 3));
        assert!((h.slow[0].2 - 0.2).abs() < 1e-9 && (h.latency_ratio(1, 3).unwrap() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn bad_options_are_rejected() {
        for o in [
            HealthOptions { bytes: 0, ..Default::default() },
            HealthOptions { iters: 0, ..Default::default() },
            HealthOptions { threshold: 0.0, ..Default::default() },
            HealthOptions { threshold: f64::NAN, ..Default::default() },
            HealthOptions { threshold: 1.5, ..Default::default() },
        ] {
            assert!(matches!(o.validate(), Err(Error::InvalidArgument(_))), "{o:?}");
        }
        assert!(HealthOptions::default().validate().is_ok());
    }
}
