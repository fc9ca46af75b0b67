//! Counting what soak did on each rank, summing it over the job, and the verdict rank 0
//! prints: operations per kind, wrong results, refusals, and resident memory per rank.

use conflux::{Communicator, ReduceOp};

use super::draw::{Draw, Kind};
use super::exec::Outcome;

/// One rank's counts.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Calls made, per [`Kind`] (refused ones included).
    pub calls: [u64; Kind::ALL.len()],
    pub refused: u64,
    pub wrong_calls: u64,
    pub wrong_elems: u64,
    pub checked_elems: u64,
    pub nonblocking: u64,
    pub forced: u64,
    pub on_groups: u64,
}

impl Tally {
    /// Counts one call of `d` that ended as `o`; skipped calls count nowhere.
    pub fn record(&mut self, d: &Draw, o: &Outcome) {
        match o {
            Outcome::Skipped => return,
            Outcome::Right { elems } => self.checked_elems += *elems as u64,
            Outcome::Wrong { wrong, .. } => {
                self.wrong_calls += 1;
                self.wrong_elems += *wrong as u64;
            }
            Outcome::Refused => self.refused += 1,
        }
        self.calls[d.kind.index()] += 1;
        self.nonblocking += d.nonblocking as u64;
        self.forced += d.algo.is_some() as u64;
        self.on_groups += (d.group != 0) as u64;
    }

    /// Every call made, whatever its kind.
    pub fn total(&self) -> u64 {
        self.calls.iter().sum()
    }

    fn to_vec(&self) -> Vec<i64> {
        let tail = [
            self.refused,
            self.wrong_calls,
            self.wrong_elems,
            self.checked_elems,
            self.nonblocking,
            self.forced,
            self.on_groups,
        ];
        self.calls.iter().chain(tail.iter()).map(|&x| x as i64).collect()
    }

    fn from_vec(v: &[i64]) -> Tally {
        let k = Kind::ALL.len();
        let mut t = Tally::default();
        for (c, &x) in t.calls.iter_mut().zip(v) {
            *c = x as u64;
        }
        let tail: Vec<u64> = v[k..].iter().map(|&x| x as u64).collect();
        [t.refused, t.wrong_calls, t.wrong_elems, t.checked_elems, t.nonblocking, t.forced, t.on_groups] =
            [tail[0], tail[1], tail[2], tail[3], tail[4], tail[5], tail[6]];
        t
    }
}

/// Resident memory of one rank, in KiB: after the warm-up, and at the end.
#[derive(Debug, Clone, Copy)]
pub struct Rss {
    pub start_kib: u64,
    pub end_kib: u64,
}

/// How far RSS may grow from the warmed-up start before soak calls it a leak: 10% of the
/// start plus max(16 MiB, 4 x max-bytes). The fixed part covers the allocator keeping freed
/// buffers for reuse: one call holds up to four buffers of max-bytes at once (send, receive,
/// the library's copy for reduce or reduce_scatter, the reference's scratch), and a later draw
/// may be the largest yet. The 10% covers caches kept by design (the algorithm choice cache,
/// bounded) and fragmentation. A per-call leak grows with the run's length, past both.
pub fn allowed_growth_kib(start_kib: u64, max_bytes: usize) -> u64 {
    start_kib / 10 + (16u64 << 20).max(4 * max_bytes as u64) / 1024
}

/// The whole job's result, as rank 0 reports it.
#[derive(Debug, Clone)]
pub struct Summary {
    pub ranks: usize,
    pub seed: u64,
    pub seconds: f64,
    pub max_bytes: usize,
    pub transport: String,
    pub groups: Vec<String>,
    /// Summed over ranks.
    pub tally: Tally,
    /// Per rank, in rank order.
    pub rss: Vec<Rss>,
}

/// Sums every rank's tally and gathers every rank's RSS (collective over `world`).
pub fn gather(world: &Communicator, tally: &Tally, rss: Rss) -> conflux::Result<(Tally, Vec<Rss>)> {
    let mut v = tally.to_vec();
    world.all_reduce(&mut v, ReduceOp::Sum)?;
    let mut all = vec![0i64; 2 * world.size()];
    world.all_gather(&[rss.start_kib as i64, rss.end_kib as i64], &mut all)?;
    let rss = all.chunks(2).map(|c| Rss { start_kib: c[0] as u64, end_kib: c[1] as u64 }).collect();
    Ok((Tally::from_vec(&v), rss))
}

impl Summary {
    /// Ranks whose RSS grew past [`allowed_growth_kib`].
    pub fn leaking(&self) -> Vec<usize> {
        (0..self.rss.len())
            .filter(|&r| {
                let m = self.rss[r];
                m.end_kib > m.start_kib + allowed_growth_kib(m.start_kib, self.max_bytes)
            })
            .collect()
    }

    /// No wrong result, no leak, and something was actually checked.
    pub fn passed(&self) -> bool {
        self.tally.wrong_calls == 0 && self.leaking().is_empty() && self.tally.total() > 0
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let t = &self.tally;
        let mut s = format!(
            "# conflux soak: {} ranks, transport {}, seed {}, {:.1} s, max {} bytes per buffer\n",
            self.ranks, self.transport, self.seed, self.seconds, self.max_bytes
        );
        s += &format!("# groups: {}\n", self.groups.join(", "));
        s += "ops (calls summed over ranks):";
        for k in Kind::ALL {
            s += &format!(" {} {}", k.name(), t.calls[k.index()]);
        }
        s += &format!(
            "\nops total: {} ({} non-blocking, {} with a forced algorithm, {} on sub-groups)\n",
            t.total(),
            t.nonblocking,
            t.forced,
            t.on_groups
        );
        s += &format!("checked: {} elements\n", t.checked_elems);
        s += &format!("wrong: {} calls ({} elements)\n", t.wrong_calls, t.wrong_elems);
        s += &format!("refused: {} (a forced algorithm that cannot serve the call)\n", t.refused);
        for (r, m) in self.rss.iter().enumerate() {
            let growth = m.end_kib as i64 - m.start_kib as i64;
            s += &format!(
                "rss rank {r}: start {} KiB, end {} KiB, growth {growth:+} KiB (allowed {} KiB)\n",
                m.start_kib,
                m.end_kib,
                allowed_growth_kib(m.start_kib, self.max_bytes)
            );
        }
        let leaking = self.leaking();
        let verdict = if self.passed() {
            "PASS".to_string()
        } else if t.total() == 0 {
            "FAIL (no call was made)".to_string()
        } else {
            let mut why = Vec::new();
            if t.wrong_calls > 0 {
                why.push(format!("{} wrong results", t.wrong_calls));
            }
            if !leaking.is_empty() {
                why.push(format!("RSS grew past the allowance on ranks {leaking:?}"));
            }
            format!("FAIL ({})", why.join("; "))
        };
        s + &format!("result: {verdict}\n")
    }

    /// The same as one JSON object on one line.
    pub fn json(&self) -> String {
        let t = &self.tally;
        let ops: Vec<String> = Kind::ALL.iter().map(|k| format!("\"{}\":{}", k.name(), t.calls[k.index()])).collect();
        let rss: Vec<String> = self
            .rss
            .iter()
            .map(|m| {
                let allowed = allowed_growth_kib(m.start_kib, self.max_bytes);
                format!("{{\"start_kib\":{},\"end_kib\":{},\"allowed_growth_kib\":{allowed}}}", m.start_kib, m.end_kib)
            })
            .collect();
        let groups: Vec<String> = self.groups.iter().map(|g| format!("{g:?}")).collect();
        format!(
            "{{\"ranks\":{},\"transport\":\"{}\",\"seed\":{},\"seconds\":{:.3},\"max_bytes\":{},\"groups\":[{}],\"ops\":{{{}}},\"total\":{},\"nonblocking\":{},\"forced\":{},\"on_groups\":{},\"checked_elements\":{},\"wrong_calls\":{},\"wrong_elements\":{},\"refused\":{},\"rss\":[{}],\"passed\":{}}}",
            self.ranks,
            self.transport,
            self.seed,
            self.seconds,
            self.max_bytes,
            groups.join(","),
            ops.join(","),
            t.total(),
            t.nonblocking,
            t.forced,
            t.on_groups,
            t.checked_elems,
            t.wrong_calls,
            t.wrong_elems,
            t.refused,
            rss.join(","),
            self.passed()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_survives_the_round_trip() {
        let t = Tally { calls: [1, 2, 3, 4, 5, 6, 7, 8, 9], refused: 10, wrong_calls: 11, ..Default::default() };
        let back = Tally::from_vec(&t.to_vec());
        assert_eq!(format!("{t:?}"), format!("{back:?}"));
    }

    #[test]
    fn growth_past_the_allowance_fails() {
        let start = 100 * 1024;
        let allowed = allowed_growth_kib(start, 4 << 20);
        assert_eq!(allowed, 10 * 1024 + 16 * 1024);
        let mut s = Summary {
            ranks: 1,
            seed: 0,
            seconds: 1.0,
            max_bytes: 4 << 20,
            transport: "auto".into(),
            groups: vec![],
            tally: Tally { calls: [1; 9], ..Default::default() },
            rss: vec![Rss { start_kib: start, end_kib: start + allowed }],
        };
        assert!(s.passed());
        s.rss[0].end_kib += 1;
        assert!(!s.passed() && s.text().contains("RSS grew"));
    }
}
