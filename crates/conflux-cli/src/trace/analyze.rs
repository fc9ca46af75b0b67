//! What the ranks' records say together: each collective matched across ranks, how long each
//! rank waited in it for the last one to arrive, what each kind of operation cost, and which
//! rank the others kept waiting for. Pure functions over `&[RankTrace]`.

use std::collections::{BTreeMap, HashMap};

use conflux::trace::RankTrace;

use super::intervals::{median, percentile};

/// Where a record is: `ranks[rank].ops[op]` (indices into the slice, not global ranks).
pub type At = (usize, usize);

/// One collective call, as the ranks that recorded it recorded it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub records: Vec<At>,
    /// Every rank of the communicator recorded it.
    pub complete: bool,
    /// The latest `started`: when the last rank arrived.
    pub last_arrival: i64,
}

/// The name, size and link of the communicator an operation ran on, as its rank knows it.
/// An id the meta file does not list (it was cut short) gets a made-up name and size 0, so
/// its collectives never count as complete.
pub fn comm_of(r: &RankTrace, id: u16) -> (String, usize, String) {
    match r.comm(id) {
        Some(c) => (c.name.clone(), c.ranks.len(), c.link.clone()),
        None => (format!("comm#{id}"), 0, "?".into()),
    }
}

/// Groups collective, non-failed records by (communicator name, lane, seq): the same call on
/// every rank. Failed calls are left out, as their ranks may disagree about them.
pub fn instances(ranks: &[RankTrace]) -> Vec<Instance> {
    let mut groups: BTreeMap<(String, u8, u64), (usize, Vec<At>)> = BTreeMap::new();
    for (ri, r) in ranks.iter().enumerate() {
        for (oi, op) in r.ops.iter().enumerate() {
            if !op.op.is_collective() || op.failed {
                continue;
            }
            let (name, size, _) = comm_of(r, op.comm);
            let g = groups.entry((name, op.lane, op.seq)).or_insert((size, Vec::new()));
            g.0 = g.0.max(size);
            g.1.push((ri, oi));
        }
    }
    groups
        .into_values()
        .map(|(size, records)| {
            let mut who: Vec<usize> = records.iter().map(|&(ri, _)| ranks[ri].meta.rank).collect();
            who.sort_unstable();
            who.dedup();
            let last_arrival = records.iter().map(|&(ri, oi)| ranks[ri].ops[oi].started).max().unwrap_or(0);
            Instance { complete: size > 0 && who.len() >= size, records, last_arrival }
        })
        .collect()
}

/// Each record's wait for its peers in ns, `wait[rank][op]`: from its start until the last
/// rank arrived, but no longer than it ran. Zero for point-to-point and unmatched records.
pub fn waits_for_peers(ranks: &[RankTrace], inst: &[Instance]) -> Vec<Vec<i64>> {
    let mut wait: Vec<Vec<i64>> = ranks.iter().map(|r| vec![0; r.ops.len()]).collect();
    for i in inst {
        for &(ri, oi) in &i.records {
            let op = &ranks[ri].ops[oi];
            let ran = (op.ended - op.started).max(0);
            wait[ri][oi] = (i.last_arrival - op.started).clamp(0, ran);
        }
    }
    wait
}

/// The rank the others waited for.
#[derive(Debug, Clone, PartialEq)]
pub struct Straggler {
    /// Global rank.
    pub rank: usize,
    /// Of complete collectives of two ranks or more, how many it arrived last at.
    pub last_fraction: f64,
    pub late_ms_median: f64,
    pub late_ms_p99: f64,
    /// Complete collectives of two ranks or more.
    pub collectives: usize,
}

/// The rank that arrived last most often at complete collectives, and by how much the others
/// waited for it then (per collective: the median over the others of their wait). Ties in
/// arrival go to the lower rank; ties in count too.
pub fn straggler(ranks: &[RankTrace], inst: &[Instance]) -> Option<Straggler> {
    let mut late: HashMap<usize, Vec<f64>> = HashMap::new();
    let mut n = 0;
    for i in inst.iter().filter(|i| i.complete && i.records.len() >= 2) {
        n += 1;
        let op = |&(ri, oi): &At| &ranks[ri].ops[oi];
        let Some(&last) = i.records.iter().min_by_key(|at| (std::cmp::Reverse(op(at).started), ranks[at.0].meta.rank))
        else {
            continue;
        };
        let others: Vec<f64> =
            i.records.iter().filter(|&&at| at != last).map(|at| (i.last_arrival - op(at).started) as f64).collect();
        late.entry(ranks[last.0].meta.rank).or_default().push(median(&others) / 1e6);
    }
    let (rank, ms) = late.into_iter().max_by_key(|(rank, v)| (v.len(), std::cmp::Reverse(*rank)))?;
    Some(Straggler {
        rank,
        last_fraction: ms.len() as f64 / n as f64,
        late_ms_median: median(&ms),
        late_ms_p99: percentile(&ms, 99.0),
        collectives: n,
    })
}

/// One row of the per-operation table.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    pub op: &'static str,
    /// Bytes rounded up to a power of two.
    pub bytes_class: u64,
    pub algo: String,
    pub link: String,
    /// Ranks of the communicator (bus bandwidth depends on it, so it splits rows too).
    pub ranks: usize,
    /// Records over all ranks.
    pub count: usize,
    pub total_ms: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

/// nccl-tests' table from every non-failed record: time is started → ended (the operation's
/// own run, not its queueing), algbw = bytes / p50 time with the group's median size, busbw =
/// algbw × the operation's bus factor at the communicator's size.
pub fn op_table(ranks: &[RankTrace]) -> Vec<OpRow> {
    type Key = (&'static str, u64, String, String, usize);
    let mut groups: BTreeMap<Key, (conflux::trace::Op, Vec<f64>, Vec<u64>)> = BTreeMap::new();
    for r in ranks {
        for op in r.ops.iter().filter(|o| !o.failed) {
            let (_, size, link) = comm_of(r, op.comm);
            let algo = op.algo.map_or_else(|| "-".to_string(), |a| a.name().to_string());
            let class = op.bytes.checked_next_power_of_two().unwrap_or(op.bytes);
            let g = groups.entry((op.op.name(), class, algo, link, size)).or_insert((op.op, Vec::new(), Vec::new()));
            g.1.push((op.ended - op.started).max(0) as f64);
            g.2.push(op.bytes);
        }
    }
    groups
        .into_iter()
        .map(|((name, class, algo, link, size), (op, ns, mut bytes))| {
            bytes.sort_unstable();
            let p50 = median(&ns);
            let total: f64 = ns.iter().sum();
            let algbw = if p50 > 0.0 { bytes[bytes.len() / 2] as f64 / p50 } else { 0.0 };
            OpRow {
                op: name,
                bytes_class: class,
                algo,
                link,
                ranks: size,
                count: ns.len(),
                total_ms: total / 1e6,
                mean_us: total / ns.len() as f64 / 1e3,
                p50_us: p50 / 1e3,
                p99_us: percentile(&ns, 99.0) / 1e3,
                algbw_gbps: algbw,
                busbw_gbps: algbw * op.bus_factor(size),
            }
        })
        .collect()
}
