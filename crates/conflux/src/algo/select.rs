//! Which algorithm serves a call: the one forced (per call, per operation, or for all), or the
//! one a cost model predicts to be fastest.
//!
//! # The model
//! Hockney's, as NCCL's tuner uses: a step that moves `b` bytes over a link costs `α + b·β`,
//! and reducing `b` bytes costs `b·γ`. Each algorithm's time is a sum of such terms over its
//! critical path (`predict`), but for broadcast and reduce on one host (below). The parameters
//! come per link class — shared memory and TCP — plus γ, the copy rate, and the shared
//! segment's all-ranks sync (the direct algorithm):
//!
//! - Flat algorithms over a job that spans nodes pay TCP's α and β; when several ranks of a
//!   node talk across nodes at once (every algorithm but the ring, whose nodes each have one
//!   outgoing edge) they share the node's link, so β is multiplied by the ranks per node.
//! - A host with more ranks than cores multiplies every α and sync (`Model::latency_factor`):
//!   a step then waits for a peer to be scheduled, not just for its data. The factor is
//!   `oversub` at 4 ranks per core, 1 with a core per rank, and grows with log2 of the ranks
//!   per core between (`Topo::crowding`). Rooted operations (broadcast, reduce) are the
//!   exception: no rank waits for the ones after it, so back-to-back calls pipeline and a call
//!   costs its busiest rank's waits at that factor, while the other steps of its path cost
//!   plain α (`rooted_alpha`).
//! - In the symmetric collectives (all but broadcast and reduce) every rank does the same
//!   copying and reducing, so on such a host byte terms are multiplied by ranks per core too.
//! - On one host, a rooted operation's bytes are hops through shared memory, one copy each,
//!   and it costs the longer of its path and its work over the cores (`select/rooted.rs`).
//! - Shared-memory messages of the symmetric collectives whose working set fits in cache
//!   (bytes × ranks ≤ 4 MiB) move 2.5× faster than `shm.gbps`, the streaming rate.
//! - Log-step schedules across nodes pay shared memory for the steps inside a node; hier's
//!   two levels overlap (its segments pipeline), so it pays the longer one and a share of the other.
//! - A few factors are fitted, not derived, each where it is used, with the measurement.
//!
//! Defaults were measured on the 2-core machine this project is built on; `conflux tune`
//! measures them on another and writes a file that `CONFLUX_TUNE_FILE` points to. Every rank
//! uses rank 0's parameters (published at creation), so all of them choose alike.

use std::fmt::Write as _;

use super::table::{self, Needs};
use super::{Algo, OpKind};

/// Where the ranks of a communicator are. Identical on every rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topo {
    pub size: usize,
    /// The ranks of each node in rank order; nodes ordered by their lowest rank.
    pub nodes: Vec<Vec<usize>>,
    /// Every rank maps one shared segment, so the direct algorithm can serve.
    pub one_segment: bool,
    /// Ranks of one node talk over TCP too (CONFLUX_TRANSPORT=tcp).
    pub local_tcp: bool,
    /// Ranks per core on the busiest node (above 1: oversubscribed).
    pub load: f64,
}

impl Topo {
    /// One rank, or all on one host with shared memory: what a test without a job sees.
    pub fn single(size: usize, one_segment: bool) -> Topo {
        Topo { size, nodes: vec![(0..size).collect()], one_segment, local_tcp: false, load: 1.0 }
    }
    /// Some node runs more ranks than it has cores.
    pub fn oversubscribed(&self) -> bool {
        self.load > 1.0
    }
    /// How oversubscribed, from 0 (a core per rank) to 1 (4 ranks per core, where the model's
    /// oversubscribed terms were measured: 8 ranks on 2 cores) and no further; half-way at 2
    /// ranks per core (an 8-byte ring all_reduce step took 2.4-2.9 us at 4 ranks on 2 cores
    /// against α = 1 us, and 4-8 us at 8: a factor of 2.5 where `oversub` is 4).
    pub fn crowding(&self) -> f64 {
        (self.load.max(1.0).log2() / 2.0).min(1.0)
    }
    /// Ranks per node, when every node has the same number.
    pub fn uniform(&self) -> Option<usize> {
        let l = self.nodes.first()?.len();
        self.nodes.iter().all(|n| n.len() == l).then_some(l)
    }
    fn per_node(&self) -> usize {
        self.nodes.iter().map(|n| n.len()).max().unwrap_or(1)
    }
}

/// One link class: latency of a message and bandwidth of one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    pub alpha_us: f64,
    pub gbps: f64,
}

/// The cost model's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    pub shm: LinkCost,
    pub tcp: LinkCost,
    /// One all-ranks sync through the shared segment.
    pub sync_us: f64,
    /// Reduction throughput of one core: `dst op= src` over b bytes costs b·γ, γ = 1 / this.
    pub reduce_gbps: f64,
    /// memcpy throughput of one core.
    pub copy_gbps: f64,
    /// Factor on every latency when a host runs more ranks than cores.
    pub oversub: f64,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            shm: LinkCost { alpha_us: 1.0, gbps: 4.0 },
            tcp: LinkCost { alpha_us: 40.0, gbps: 1.5 },
            sync_us: 0.6,
            // Fitted, like the other defaults, to bench --algo all runs at 2, 4 and 8 ranks
            // (replaying the model over their CSVs), for f32; f16 and bf16 cost `HALF_REDUCE`
            // times more. `conflux tune` measures a streaming 32 MiB sum instead: 12 GB/s on
            // this machine.
            reduce_gbps: 16.0,
            copy_gbps: 12.0,
            oversub: 4.0,
        }
    }
}

/// Where a communicator's cost model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelSource {
    /// The built-in defaults: a job on one host (or a job of one rank).
    #[default]
    Defaults,
    /// Rank 0's tuning file (`CONFLUX_TUNE_FILE`), as `conflux tune` writes it.
    TuningFile,
    /// The defaults, with TCP's bandwidth measured between the nodes as the communicator was
    /// made (`comm/calibrate.rs`).
    MeasuredTcp,
}

const KEYS: [&str; 8] =
    ["shm_alpha_us", "shm_gbps", "tcp_alpha_us", "tcp_gbps", "sync_us", "reduce_gbps", "copy_gbps", "oversub"];

impl Model {
    /// The factor on every latency on `topo`: 1 with a core per rank, `oversub` from 4 ranks
    /// per core, `1 + (oversub - 1) x crowding` between.
    pub fn latency_factor(&self, topo: &Topo) -> f64 {
        1.0 + (self.oversub - 1.0) * topo.crowding()
    }

    /// The factor on the shared segment's all-ranks sync: oversubscribed, the latency factor
    /// times N/2 (fitted to the 8-byte direct all_reduce at 4 and 8 ranks on 2 cores), else 1.
    pub fn sync_factor(&self, topo: &Topo) -> f64 {
        if topo.oversubscribed() {
            self.latency_factor(topo) * topo.size as f64 / 2.0
        } else {
            1.0
        }
    }

    fn fields(&mut self) -> [&mut f64; 8] {
        [
            &mut self.shm.alpha_us,
            &mut self.shm.gbps,
            &mut self.tcp.alpha_us,
            &mut self.tcp.gbps,
            &mut self.sync_us,
            &mut self.reduce_gbps,
            &mut self.copy_gbps,
            &mut self.oversub,
        ]
    }

    /// The tuning file's text: `key = value` lines, `#` comments.
    pub fn to_text(&self) -> String {
        let mut m = *self;
        let mut out = String::new();
        for (k, v) in KEYS.iter().zip(m.fields()) {
            let _ = writeln!(out, "{k} = {v}");
        }
        out
    }

    /// Parses a tuning file; keys it does not give keep their defaults.
    pub fn from_text(text: &str) -> Result<Model, String> {
        let mut m = Model::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| format!("line {}: expected key = value", i + 1))?;
            let v: f64 = v.trim().parse().map_err(|_| format!("line {}: {:?} is not a number", i + 1, v.trim()))?;
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("line {}: {} must be positive", i + 1, k.trim()));
            }
            let slot = KEYS.iter().position(|&x| x == k.trim()).ok_or_else(|| format!("unknown key {:?}", k.trim()))?;
            *m.fields()[slot] = v;
        }
        Ok(m)
    }
}

/// What about a call, besides its operation and size, decides what can serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Call {
    pub op: OpKind,
    /// all_reduce and broadcast/reduce: the buffer; all_gather: the whole output;
    /// reduce_scatter: the whole input; all_to_all: one rank's send buffer.
    pub bytes: usize,
    /// all_to_all: every block has the same size (Bruck needs it).
    pub even: bool,
    /// all_reduce of several pieces (coalesced): only ring and direct take pieces.
    pub pieces: bool,
    /// The elements are f16 or bf16, which reduce through f32 conversions (`HALF_REDUCE`).
    pub half: bool,
}

/// Whether `algo` has a schedule for `op` at all (a row in `table.rs`).
pub fn implements(algo: Algo, op: OpKind) -> bool {
    table::find(algo, op).is_some()
}

/// Whether `algo` has a schedule for this form of call: its operation (`implements`), and
/// for all_to_all uneven blocks, for all_reduce several pieces. An algorithm forced for every
/// operation (`CONFLUX_ALGO=bruck`) leaves the calls it has none for to the model; a topology
/// it cannot serve is still an error (`serves`).
pub fn implements_call(algo: Algo, call: &Call) -> bool {
    table::find(algo, call.op).is_some_and(|row| (row.uneven || call.even) && (row.pieces || !call.pieces))
}

/// Whether `algo` can serve `call` on `topo`, and if not, why (the error of a forced choice).
pub fn serves(algo: Algo, call: &Call, topo: &Topo) -> Result<(), String> {
    let Some(row) = table::find(algo, call.op) else {
        return Err(format!("{algo} does not implement {}", call.op));
    };
    match row.needs {
        Needs::OneSegment if !topo.one_segment => {
            return Err(format!("{algo} needs every rank on one host with shared memory"));
        }
        Needs::EvenNodes if topo.nodes.len() < 2 => {
            return Err(format!("{algo} needs a job that spans at least two nodes"));
        }
        Needs::EvenNodes if topo.uniform().is_none() => {
            return Err(format!("{algo} needs the same number of ranks on every node"));
        }
        _ => {}
    }
    if !row.uneven && !call.even {
        return Err(format!("{algo} {} needs equal blocks", call.op));
    }
    if !row.pieces && call.pieces {
        let takers: Vec<&str> =
            table::TABLE.iter().filter(|r| r.op() == call.op && r.pieces).map(|r| r.algo.name()).collect();
        let who = if takers.is_empty() { String::new() } else { format!(" ({} do)", takers.join(" and ")) };
        return Err(format!("{algo} does not take a coalesced {}{who}", call.op));
    }
    Ok(())
}

/// How much more a byte of f16 or bf16 costs to reduce than one of f32 (`reduce_gbps`): each
/// element is widened to f32 and rounded back. Measured with `cargo bench -p conflux --bench
/// reduce`, reduce_into per byte: 4-6x at 256 KiB, 2-3x at 16 MiB. At 1 (f32's rate) the
/// bf16 all_reduce of 32 KiB went to direct at 0.64 of the ring (2 ranks) and 0.66 of
/// rabenseifner (4 ranks): direct reduces all N slots on every rank.
const HALF_REDUCE: f64 = 4.0;

/// The same for a rooted reduce, whose hops reduce pairwise as a receive copies out, fitted to
/// its bf16 cells at 2 ranks, where the tree's one hop and the ring's split reduction cross
/// near 128 KiB (measured: tree/ring time 0.55 at 8 KiB, 0.81 at 32 KiB, 1.0 at 128 KiB,
/// 1.07-1.16 from 512 KiB). At `HALF_REDUCE` the ring took 32 KiB, at 0.79-0.81 of the tree; at
/// 2.5 (the kernel's in-cache ratio: reduce_into of bf16 at 6.6 GB/s against the model's f32
/// 16 GB/s) the tree kept 512 KiB-8 MiB, at 0.86-0.89 of the ring. 3 moves only 32 KiB; at 4
/// and 8 ranks the choices are those of `HALF_REDUCE`. Lowering `HALF_REDUCE` itself instead
/// moved 4-rank all_reduce of 128-512 KiB from direct to rabenseifner, at 0.62-0.77 of direct
/// (bench --algo all -d bf16, replayed through this model).
const HALF_REDUCE_ROOTED: f64 = 3.0;

/// The shares of the message that one rank of recursive doubling (all_gather) or halving
/// (reduce_scatter, and the two halves of rabenseifner) over `p` ranks sends inside its node
/// and across nodes, when its first (halving: last) `intra` steps stay inside: step k moves
/// 2^k / p of it; with none inside, all (p - 1) / p crosses. At 2 nodes x 2 ranks
/// that is 1/4 inside and 1/2 across, where charging all 3/4 to TCP priced rd at 2.5x its
/// measured time and lost the 32 KiB cells to the ring (netns 2x2 at 2 Gbit/s: all_gather rd
/// 108 us, ring 149; reduce_scatter rd 106, ring 117).
fn rd_shares(p: f64, intra: f64) -> (f64, f64) {
    let l = intra.exp2();
    ((l - 1.0) / p, (p - l) / p)
}

fn log2_ceil(n: usize) -> f64 {
    (usize::BITS - (n.max(1) - 1).leading_zeros()) as f64
}

/// Predicted time in microseconds of `algo` serving `call` on `topo`; None if it cannot.
pub fn predict(m: &Model, algo: Algo, call: &Call, topo: &Topo) -> Option<f64> {
    serves(algo, call, topo).ok()?;
    let n = topo.size.max(1) as f64;
    let b = call.bytes as f64 * 1e-3; // kB, so that b / GB/s is in microseconds
    let ovs = m.latency_factor(topo);
    let across = topo.nodes.len() > 1;
    let flat = if across || topo.local_tcp { m.tcp } else { m.shm };
    let a = flat.alpha_us * ovs;
    // Shared-memory messages whose whole working set stays in cache move faster than the
    // streaming rate `shm.gbps` describes (measured: 2.5x at 2 ranks, 512 KiB all_reduce).
    // The bound is one core's L2 here (4 MiB): above it, a 2-rank ring at 8 MiB was chosen
    // over direct at 0.84 of its busbw (bench --algo all --report-auto).
    let cached = !(across || topo.local_tcp) && call.bytes.saturating_mul(topo.size) <= 4 << 20;
    // In a symmetric collective every rank does the same copies and reductions, so ranks that
    // share a core take turns at them: byte terms scale with ranks per core. (Measured, 8 ranks
    // on 2 cores, 8-128 KiB all_reduce: rd and rabenseifner took 1.4-2.9x the time predicted
    // without it, direct as predicted with it.) A rooted operation's ranks have unequal work
    // and idle ones give way to busy ones, which `rooted_alpha` and `rooted.rs` model instead.
    let work = if matches!(call.op, OpKind::Broadcast | OpKind::Reduce) { 1.0 } else { topo.load.max(1.0) };
    let beta = work / flat.gbps / if cached { 2.5 } else { 1.0 };
    // Algorithms other than the ring have all ranks of a node crossing nodes at once.
    let shared = if across { topo.per_node() as f64 } else { 1.0 };
    let half = if call.op == OpKind::Reduce { HALF_REDUCE_ROOTED } else { HALF_REDUCE };
    let g = work * if call.half { half } else { 1.0 } / m.reduce_gbps;
    let cp = work / m.copy_gbps;
    let logn = log2_ceil(topo.size);
    let p = (1usize << (usize::BITS - 1 - topo.size.max(1).leading_zeros())) as f64;
    let folded = if p < n { 1.0 } else { 0.0 };
    let logp = p.log2();
    // Recursive doubling's first log2(ranks per node) steps (and halving's last) stay inside a
    // node when nodes hold consecutive ranks, as launchers place them: those pay shared
    // memory's α and β, the others TCP's, shared by the node's ranks.
    let split = across && folded == 0.0 && topo.uniform().is_some_and(|l| l.is_power_of_two());
    let intra = if split { (topo.per_node() as f64).log2() } else { 0.0 };
    let (sa, sb) = (m.shm.alpha_us * ovs, work / m.shm.gbps);
    let nodes = topo.nodes.len() as f64;
    // A rooted operation's α: `waits` steps that its busiest rank blocks on, of `steps` on
    // its path. Oversubscribed, the rest overlap with the next call's, at plain α: a
    // broadcast's ranks each wait once, for their parent. (A reduce's chain once took this
    // too, from 8 ranks on 2 cores, 8 B: chain 4-11 us, tree 13-15; no longer, see below.)
    let relaxed = if topo.oversubscribed() { flat.alpha_us } else { a };
    let rooted_alpha = |waits: f64, steps: f64| waits * a + (steps - waits).max(0.0) * relaxed;
    // Steps and bytes (as multiples of b) of a log-step schedule, inside nodes and across.
    let logstep = |steps_in: f64, bytes_in: f64, steps_out: f64, bytes_out: f64| {
        steps_in * sa + bytes_in * b * sb + steps_out * a + bytes_out * b * beta * shared
    };
    let ring = |steps: f64, moved: f64, reduced: f64| steps * a + moved * b * beta + reduced * b * g;
    // Fitted on one host (bench --algo all --report-auto, 2-8 ranks) before `rooted.rs` priced
    // rooted operations there by their copies; kept for the rooted path model over TCP, which
    // has no measurement of its own: scatter + all-gather pays the ring's copies twice over,
    // and the ring reduce's gather to the root costs about one more pass.
    let sag_bw = 1.5;
    let ring_reduce_bw = 1.0;
    // Recursive doubling's and halving's half-message steps lose to the ring's pipelined
    // blocks once the working set leaves the cache: on one host, all_gather and
    // reduce_scatter took 1.1-1.3x the ring's time from 512 KiB at 8 ranks and from 2 MiB at 4
    // (where rd was up to 2x faster at 128 KiB); across netns TCP at 2x2, from 32 KiB per rank.
    // Over loopback TCP (CONFLUX_TRANSPORT=tcp on one host) only from 32 MiB in all: at 4
    // ranks rd took 0.55-0.8x the ring's time for all_gather and reduce_scatter of 64 KiB - 1
    // MiB, even at 2-4 MiB, and lost at 8 MiB (ring 1.15-1.25x faster); at 8 ranks rd took
    // 0.6-0.8x to 256 KiB, even at 1-4 MiB.
    let spills = if across {
        call.bytes / topo.size.max(1) >= 32 << 10
    } else {
        call.bytes.saturating_mul(topo.size) >= if topo.local_tcp { 32 << 20 } else { 4 << 20 }
    };
    let rd_big = if spills { 1.5 } else { 1.0 };
    // The chain's pipeline (chain.rs): its chunk in kB, its chunks, and its steps with the
    // fill of N - 2 hops.
    let chain_chunk = (call.bytes.min(super::chain::CHUNK) as f64) * 1e-3;
    let chain_chunks = (call.bytes as f64 / super::chain::CHUNK as f64).ceil().max(1.0);
    let chain_steps = (chain_chunks + n - 2.0).max(1.0);
    // A rooted operation's latency `lat` and, across nodes, its `bytes` along its path. On one
    // host its bytes are hops through shared memory (`rooted.rs`): a path after the latency,
    // and a work bound that the waits do not add to, since a waiting rank leaves its core to
    // the others (the work-span bound: no schedule beats its critical path, nor its work over
    // the cores). Over loopback TCP (CONFLUX_TRANSPORT=tcp on one host) the same holds from 2
    // ranks per core, a hop costing a link's β where shared memory's costs a copy: priced
    // along their path, the chain's pipelined hops took 4 ranks' large broadcasts (1-8 MiB)
    // from the tree, which was 1.1-1.4x faster (--report-auto -f 2), both being bound by the
    // same work. At 3 ranks on 2 cores the path still decides (the chain 1.15-1.2x faster at
    // 2-16 MiB).
    let one_host = !across && (!topo.local_tcp || topo.load >= 2.0);
    let hop = if topo.local_tcp { work / flat.gbps } else { cp };
    let shape = rooted::Shape {
        bytes: call.bytes,
        n,
        load: topo.load,
        chunks: chain_chunks,
        steps: chain_steps,
        alpha: flat.alpha_us,
    };
    let rooted_cost = |lat: f64, bytes: f64| {
        if !one_host {
            return Some(lat + bytes);
        }
        let (path, work) = rooted::bytes(call.op, algo, &shape, hop, g)?;
        Some((lat + path).max(work))
    };
    // Pairwise all_to_all posts its N - 1 exchanges at once. Through shared memory they
    // overlap, each beyond the first costing 0.3 of a step; over TCP each still pays its own
    // system calls on the sender's and receiver's cores: 0.7 (measured, 4 ranks over loopback
    // TCP and over netns 2x2, 8 B - 8 KiB: pairwise took 1.1-1.2x Bruck's time, where 0.3
    // predicted 0.8x).
    let overlap = if across || topo.local_tcp { 0.7 } else { 0.3 };
    use Algo::*;
    use OpKind::*;
    let t = match (call.op, algo) {
        // At 2 ranks rd's one exchange, whose reduction follows the peer's data in as it
        // arrives, beats the two exchanges of half the message that the ring and Rabenseifner
        // make, to 128 KiB on shared memory: in the same runs the ring took 1.04-1.2x rd's
        // time at 8-64 KiB out of place and 1.0-1.2x in place, Rabenseifner 1.2x out of place
        // at 64-128 KiB; from 256 KiB they are even, and past 2 MiB the ring is the safer (rd
        // at 0.87 at 64 MiB once). Over TCP (loopback, --algo ring,rd -f 2) to 512 KiB: the
        // ring took 1.1-1.2x rd's time at 256-512 KiB out of place, 1.1-1.2x in place; at 1
        // MiB even out of place, rd 1.27x the ring's in place. A coalesced call, which rd
        // cannot take, keeps the ring; so do f16 and bf16, whose whole-message reduction costs
        // rd more than the exchange saves (bf16 on shared memory: rd at 0.70-0.93 of the ring
        // at 8-128 KiB).
        (AllReduce, Ring | Rabenseifner)
            if topo.size <= 2
                && !call.pieces
                && !call.half
                && call.bytes <= if across || topo.local_tcp { 512 << 10 } else { 128 << 10 } =>
        {
            return None
        }
        (AllReduce, Ring) => ring(2.0 * (n - 1.0), 2.0 * (n - 1.0) / n, (n - 1.0) / n),
        (AllReduce, Rd) => {
            let out = logp - intra + 2.0 * folded;
            logstep(intra, intra, out, out) + (logp + 2.0 * folded) * b * (g + cp)
        }
        (AllReduce, Rabenseifner) => {
            let (inside, outside) = rd_shares(p, intra);
            logstep(2.0 * intra, 2.0 * inside, 2.0 * (logp - intra) + 2.0 * folded, 2.0 * outside + 2.0 * folded)
                + ((p - 1.0) / p + folded) * b * g
        }
        (AllReduce, Tree) => {
            let chunks = (call.bytes as f64 / 2.0 / (64 << 10) as f64).ceil().max(1.0);
            2.0 * (chunks + logn) * a + 2.0 * b * beta * shared + b * g
        }
        // At 2 ranks the ring, rd and Rabenseifner are one or two exchanges that copy nothing
        // (out of place they read the input where it is): past 2 MiB they beat direct, in
        // place and out of place (--report-auto, 5 runs, 4-16 MiB: direct at 0.56-0.83 of the
        // best; even at 32-64 MiB). Since rd and the ring stopped copying their input, they
        // beat it from 8 KiB too (--report-auto -f 2, in place and out of place, 8-32 KiB:
        // direct took 1.2-1.4x rd's time, intervals within 0.02; 4 KiB even).
        (AllReduce, Direct) if topo.size <= 2 && call.bytes > 4 << 10 => return None,
        (AllReduce, Direct) => {
            let sync = m.sync_us * m.sync_factor(topo);
            if call.bytes as f64 / n <= (16 << 10) as f64 {
                // Every rank reduces all N slots: N streams in, one out, memory-bound, so
                // (N + 1) / 3 of a pairwise reduction (two in, one out), which γ is.
                sync + b * cp + (n + 1.0) / 3.0 * b * g
            } else {
                let chunks = (call.bytes as f64 / (256 << 10) as f64).ceil();
                2.0 * chunks * sync + b * cp + b * g
            }
        }
        (AllReduce, Hier) => {
            let l = topo.uniform()? as f64;
            let (ta, tb) = (m.tcp.alpha_us * ovs, 1.0 / m.tcp.gbps);
            let intra = 2.0 * ((l - 1.0) * sa + (l - 1.0) / l * b * sb) + (l - 1.0) / l * b * g;
            let inter = 2.0 * (nodes - 1.0) * ta + 2.0 * (nodes - 1.0) / nodes * b * tb + b / l * g;
            // Segments pipeline the two levels (hier.rs): the shorter one hides behind the longer.
            let segments = (call.bytes / (4 << 20)).clamp(1, 16) as f64;
            intra.max(inter) + intra.min(inter) / segments
        }
        // Each rank waits once, for its parent; across nodes the root's sends share its link.
        (Broadcast, Tree) => rooted_cost(rooted_alpha(1.0, logn), logn * b * beta * shared)?,
        (Broadcast, Chain) => rooted_cost(rooted_alpha(chain_chunks, chain_steps), chain_steps * chain_chunk * beta)?,
        (Broadcast, ScatterAllGather) => {
            rooted_cost((2.0 * n - 1.0) * a, sag_bw * 2.0 * (n - 1.0) / n * b * beta * shared)?
        }
        // The root waits for each of its log2(N) children in turn.
        (Reduce, Tree) => {
            rooted_cost(rooted_alpha(logn, logn), b * (beta * shared + g) * (1.0 + 0.25 * (logn - 1.0)) + b * cp)?
        }
        // Every step waits: the fill's hops no longer hide behind the next call once a chain
        // step stopped allocating (measured, 3, 4 and 8 ranks on 2 cores, 8 B - 2 KiB: the
        // tree took 0.5-0.9x the chain's time, where `rooted_alpha` had picked the chain).
        (Reduce, Chain) => {
            rooted_cost(rooted_alpha(chain_steps, chain_steps), chain_steps * chain_chunk * (beta + g) + b * cp)?
        }
        (Reduce, Ring) => {
            rooted_cost(n * a, (n - 1.0) / n * b * (2.0 * beta * shared + g) + ring_reduce_bw * b * beta + b * cp)?
        }
        // At 2 ranks the ring's single exchange overlaps its copy in and its copy out: from
        // 16 KiB it beat direct, since the ring's receivers publish freed space lazily
        // (--report-auto, 3 runs: direct at 0.83-0.92 of the ring at 16-64 KiB).
        (AllGather, Direct) if topo.size <= 2 && call.bytes > 8 << 10 => return None,
        // Each rank copies its block in and the others' out: the whole message once, with a
        // sync per slot-sized window of a block (of all the blocks side by side, for
        // reduce_scatter, which reduces one block from N streams: see all_reduce).
        // Fitted: while the message fits in cache its copies are taken 2.5x faster, the
        // factor β has there (measured, 4 ranks on 2 cores, all_gather of 128 KiB: direct 24
        // us, rd 30-37, which the plain copy rate called even); with a core per rank, 1.5x
        // (first fitted at 2 ranks, where 2.5x had auto(direct) at 0.86-0.91 of the best at
        // 512 KiB).
        (AllGather, Direct) => {
            let windows = (call.bytes as f64 / n / (256 << 10) as f64).ceil().max(1.0);
            let faster = if !cached {
                1.0
            } else if topo.oversubscribed() {
                2.5
            } else {
                1.5
            };
            windows * m.sync_us * m.sync_factor(topo) + b * cp / faster
        }
        // At 2 ranks the ring is one exchange that reads the input where it is, combines the
        // peer's block with it straight into the output and copies nothing: from 16 KiB it
        // beat direct (--report-auto, 3 runs, 8 KiB - 16 MiB: direct at 0.47-0.77 of the
        // ring's busbw, even at 8 KiB).
        (ReduceScatter, Direct) if topo.size <= 2 && call.bytes > 8 << 10 => return None,
        // All_gather's cache factor, but 2.5x whatever the load.
        (ReduceScatter, Direct) => {
            let windows = (call.bytes as f64 / (256 << 10) as f64).ceil().max(1.0);
            let copies = b * cp / if cached { 2.5 } else { 1.0 };
            windows * m.sync_us * m.sync_factor(topo) + copies + (n + 1.0) / 3.0 * b / n * g
        }
        (AllGather, Ring) => ring(n - 1.0, (n - 1.0) / n, 0.0),
        (AllGather, Rd) => {
            let (inside, outside) = rd_shares(p, intra);
            logstep(intra, inside * rd_big, logp - intra + 2.0 * folded, (outside + 2.0 * folded) * rd_big)
        }
        (AllGather, Bruck) => logn * a + (n - 1.0) / n * b * beta * shared + 2.0 * b * cp,
        (ReduceScatter, Ring) => ring(n - 1.0, (n - 1.0) / n, (n - 1.0) / n),
        (ReduceScatter, Rd) => {
            let (inside, outside) = rd_shares(p, intra);
            logstep(intra, inside * rd_big, logp - intra + 2.0 * folded, (outside + 2.0 * folded) * rd_big)
                + ((p - 1.0) / p + 2.0 * folded) * b * g
        }
        (AllToAll, Pairwise) => a * (1.0 + overlap * (n - 2.0).max(0.0)) + (n - 1.0) / n * b * beta * shared,
        // A transpose through the segment, as reduce_scatter's: each rank writes the N - 1
        // blocks it sends and reads the N - 1 it receives, a sync per window (counted here
        // per slot of the whole buffer; the code's windows are per block). Over four windows (two
        // from 5 ranks) the model leaves it out: pairwise's streams then win (measured, --algo all -f 4:
        // direct 1.1-2x faster to 128 KiB at 2-8 ranks and even at 512 KiB, pairwise 1.1x
        // faster at 2 MiB and 1.8x at 8 MiB on 4 ranks), which this sum does not foresee.
        // (It was two: at 1 MiB and 4 ranks, --algo direct,pairwise -f 2 gave direct 0.75-0.82x
        // pairwise's time, even with pairwise's blocks by single copy. At 8 ranks it stays two:
        // direct's 1 MiB swung between 0.76x and 2.4x pairwise's from run to run, single
        // copy's pairwise took 607-718 us steadily.)
        // At 2 ranks pairwise is one exchange through the ring, whose copy in and copy out
        // overlap: from 8 KiB it beat direct (--report-auto, 8-512 KiB: direct at 0.77-0.95 of
        // pairwise's busbw; even at 4 KiB).
        (AllToAll, Direct) => {
            let windows = (call.bytes as f64 / (256 << 10) as f64).ceil().max(1.0);
            let most = if topo.size <= 4 { 4.0 } else { 2.0 };
            if windows > most || (topo.size <= 2 && call.bytes > 4 << 10) {
                return None;
            }
            let faster = if cached { 2.5 } else { 1.0 };
            windows * m.sync_us * m.sync_factor(topo) + 2.0 * (n - 1.0) / n * b * cp / faster
        }
        (AllToAll, Bruck) => logn * a + logn / 2.0 * b * beta * shared + (2.0 + logn) * b * cp,
        _ => return None,
    };
    Some(t)
}

/// The algorithms that can serve `call` on `topo`, with their predicted times, fastest first.
pub fn ranked(m: &Model, call: &Call, topo: &Topo) -> Vec<(Algo, f64)> {
    let mut v: Vec<(Algo, f64)> = Algo::ALL.iter().filter_map(|&a| Some((a, predict(m, a, call, topo)?))).collect();
    v.sort_by(|x, y| x.1.total_cmp(&y.1));
    v
}

/// The algorithm for `call`: `forced` if given (an error if it cannot serve), else the
/// model's fastest. Every call has at least one algorithm that serves it.
pub fn choose(m: &Model, call: &Call, topo: &Topo, forced: Option<Algo>) -> Result<Algo, String> {
    if let Some(a) = forced {
        serves(a, call, topo).map_err(|why| format!("algorithm {a} cannot serve this {}: {why}", call.op))?;
        return Ok(a);
    }
    ranked(m, call, topo).first().map(|x| x.0).ok_or_else(|| format!("no algorithm serves {}", call.op))
}

mod rooted;

#[cfg(test)]
mod tests;
