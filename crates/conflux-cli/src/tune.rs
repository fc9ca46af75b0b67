//! `conflux tune -n N`: measures the cost model's parameters ([`Model`]) on this machine and
//! writes the tuning file `CONFLUX_TUNE_FILE` points to. Started alone it launches N copies
//! of itself; inside `conflux run` every process is one rank. Times in µs, sizes in kB, as
//! `select::predict` uses them. Fits:
//!
//! - α and GB/s of a link: ping-pong between rank 0 and one peer (the other ranks wait at a
//!   barrier). α = half the median round trip of 8 bytes (2000, after 200 of warm-up);
//!   GB/s = 32 MiB / (half the median of 50 round trips − α), the step cost `α + b·β` solved
//!   for β. shm: rank 0's first peer on its host (none: the defaults stay). tcp: a rank on
//!   another node if the job spans nodes; else a second communicator forced to TCP (loopback);
//!   its GB/s only, α stays the default (see `measure`).
//! - oversub: the default unless the host runs more ranks than cores; then the median 8-byte
//!   ring all_reduce over shm / the 2(N−1)·α_shm the model charges it, scaled from this
//!   host's crowding to 4 ranks per core (`Model::latency_factor`), clamped to 1..50.
//! - sync_us: the median 8-byte direct all_reduce less the model's copy and reduce terms,
//!   divided by the factor the model puts on sync (`Model::sync_factor`), so that
//!   `predict(Direct, 8 B)` equals the measurement. Needs one shared segment; else the default.
//! - reduce_gbps: one core's f32 sum (`reduce_into`) of 32 MiB; copy_gbps: memcpy of 64 MiB;
//!   on rank 0 once the communicators are gone, so no other rank competes for the cores.

use std::convert::Infallible;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use conflux::algo::select::{predict, Call, LinkCost, Model, Topo};
use conflux::measure::{median_us, round_trip_us};
use conflux::{Algo, Communicator, Config, DataType, OpKind, ReduceOp, TransportKind};

use crate::launch::{launch, self_job};

#[derive(clap::Args, Debug, Clone)]
pub struct TuneArgs {
    /// Ranks to start (ignored inside an enclosing `conflux run`); at least 2.
    #[arg(short = 'n', long, default_value_t = 2)]
    pub nproc: usize,
    /// The tuning file to write.
    #[arg(long, default_value = "conflux-tune.txt")]
    pub out: PathBuf,
    /// Links to measure: auto (shm and tcp), shm or tcp; the other keeps its default.
    #[arg(long, default_value = "auto")]
    pub transport: String,
}

const TAG: u32 = 0x7475_6e65;
/// Larger than this machine's 32 MiB L3 with its echo, so bandwidths are what large messages see, not cache.
const BIG: usize = 32 << 20;

pub fn main(args: TuneArgs) -> ExitCode {
    let Some(kind) = TransportKind::parse(&args.transport) else {
        return fail(2, format!("unknown transport {:?}; auto, shm or tcp", args.transport));
    };
    if std::env::var_os("WORLD_SIZE").is_some() {
        let rank = std::env::var("RANK").unwrap_or_default();
        return run_rank(&args, kind).map_or_else(|e| fail(1, format!("rank {rank}: {e}")), |()| ExitCode::SUCCESS);
    }
    if args.nproc < 2 {
        return fail(2, "-n must be at least 2 (links are measured between two ranks)".into());
    }
    let spec = match self_job(args.nproc, Vec::new()) {
        Ok(s) => s,
        Err(e) => return fail(2, e.to_string()),
    };
    launch(&spec).map_or_else(|e| fail(1, e.to_string()), |()| ExitCode::SUCCESS)
}

fn fail(code: u8, msg: String) -> ExitCode {
    eprintln!("conflux tune: {msg}");
    ExitCode::from(code)
}

fn es(e: conflux::Error) -> String {
    e.to_string()
}

fn run_rank(args: &TuneArgs, kind: TransportKind) -> Result<(), String> {
    let Some((mut m, mut lines, topo, direct)) = measure(kind)? else { return Ok(()) };
    // Rank 0, with every communicator gone and the other ranks leaving: one core's rates, then
    // sync_us, whose fit subtracts the copy and reduce terms.
    (m.reduce_gbps, m.copy_gbps) = local_gbps();
    let (r, c) = (m.reduce_gbps, m.copy_gbps);
    lines.insert(0, format!("measured: f32 sum of 32 MiB {r:.2} GB/s, memcpy of 64 MiB {c:.2} GB/s"));
    if let Some(t) = direct {
        m.sync_us = fit_sync(t, 8, &m, &topo);
    }
    write_file(args, &m, &topo, &lines)
}

type Measured = (Model, Vec<String>, Topo, Option<f64>);

/// Measures the links, oversub and the direct all_reduce's time; on rank 0 returns the model
/// so far, the lines for the file's comments, the topology and that time.
fn measure(kind: TransportKind) -> Result<Option<Measured>, String> {
    let mut cfg = Config::from_env().map_err(es)?;
    cfg.tune_file = None; // measuring: no model is needed, and the old file may be bad
    cfg.transport = kind;
    let comm = Communicator::from_env_with(cfg.clone()).map_err(es)?;
    let (rank, size, topo) = (comm.rank(), comm.size(), comm.topology().clone());
    if size < 2 {
        return Err("needs at least 2 ranks (links are measured between two)".into());
    }
    let lead = rank == 0;
    let (mut m, mut lines, mut direct) = (Model::default(), Vec::<String>::new(), None);
    let (shm_peer, remote) = (topo.nodes[0].get(1).copied(), topo.nodes.get(1).map(|r| r[0]));
    let mut shm_measured = false;
    if kind != TransportKind::Tcp {
        match shm_peer {
            Some(p) => {
                let rtt = ping_pong(&comm, p)?;
                if let Some((r8, rb)) = rtt {
                    m.shm = fit_link(r8, rb, BIG);
                    lines.push(format!("measured: shm ranks 0-{p}: round trip 8 B {r8:.2} us, 32 MiB {rb:.1} us"));
                }
                shm_measured = true;
            }
            None => lines.push("note: rank 0 has no peer on its host: shm parameters are the defaults".into()),
        }
    } else {
        lines.push("note: --transport tcp: shm, sync_us and oversub are the defaults".into());
    }
    if shm_measured && topo.oversubscribed() {
        lines.push(
            "note: more ranks than cores: the idle ranks' barrier may inflate shm alpha (tune at N <= cores too)"
                .into(),
        );
    }
    if shm_measured && topo.oversubscribed() && topo.one_segment {
        if let Some(t) = timed_all_reduce(&comm.with_algo(Some(Algo::Ring)))? {
            m.oversub = fit_oversub(t, &topo, m.shm.alpha_us);
            lines.push(format!("measured: oversubscribed: 8-byte ring all_reduce at {size} ranks {t:.2} us"));
        }
    }
    if shm_measured && topo.one_segment {
        if let Some(t) = timed_all_reduce(&comm.with_algo(Some(Algo::Direct)))? {
            direct = Some(t);
            lines.push(format!("measured: 8-byte direct all_reduce at {size} ranks {t:.2} us"));
        }
    } else if kind != TransportKind::Tcp {
        lines.push("note: no shared segment spans the job: sync_us (and oversub) are the defaults".into());
    }
    if kind == TransportKind::Shm {
        lines.push("note: --transport shm: tcp parameters are the defaults".into());
    } else {
        let tag = if remote.is_some() { "" } else { " (loopback)" };
        let r = if kind == TransportKind::Tcp || remote.is_some() {
            ping_pong(&comm, remote.unwrap_or(1))?
        } else {
            // A second store on a port rank 0 picks, so the TCP communicator meets nowhere near the first.
            let addr = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
            let mut port = [if lead { crate::launch::free_port(&addr).map_err(|e| e.to_string())? as i64 } else { 0 }];
            comm.broadcast(&mut port, 0).map_err(es)?;
            drop(comm);
            let tcp = Communicator::builder(rank, size)
                .store(format!("{addr}:{}", port[0]))
                .config(Config { transport: TransportKind::Tcp, ..cfg })
                .build()
                .map_err(es)?;
            ping_pong(&tcp, 1)?
        };
        if let Some((r8, rb)) = r {
            // TCP's α stays the default: the model's α is a fitted per-step cost, which half a
            // ping-pong underestimates (5.2 us on the netns testbed, where that file chose worse
            // than the default 40: comm/calibrate.rs).
            m.tcp.gbps = fit_link(r8, rb, BIG).gbps;
            let p = remote.unwrap_or(1);
            lines.push(format!("measured: tcp ranks 0-{p}{tag}: round trip 8 B {r8:.2} us, 32 MiB {rb:.1} us"));
            lines.push(format!("note: tcp_alpha_us is the default, the model's per-step cost, not {:.2}", r8 / 2.0));
        }
    }
    Ok(lead.then_some((m, lines, topo, direct)))
}

fn write_file(args: &TuneArgs, m: &Model, topo: &Topo, lines: &[String]) -> Result<(), String> {
    let when = utc(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let (size, nodes, here, host) = (topo.size, topo.nodes.len(), topo.nodes[0].len(), host.trim());
    let over = if topo.oversubscribed() { ", oversubscribed" } else { "" };
    let mut text = format!(
        "# conflux tune, {when}: {size} ranks on {nodes} node(s), {here} on host {host} ({cores} cores{over})\n"
    );
    text += &format!("# links measured: {}; reduction kernel {}\n", args.transport, conflux::reduce::kernel_name());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: f64 = load.split(' ').next().and_then(|l| l.parse().ok()).unwrap_or(0.0);
    if load > cores as f64 {
        text +=
            &format!("# note: load average {load} over {cores} cores: other programs may have inflated the times\n");
    }
    for line in lines {
        text += &format!("# {line}\n");
    }
    text += &m.to_text();
    std::fs::write(&args.out, &text).map_err(|e| format!("writing {}: {e}", args.out.display()))?;
    print!("{text}");
    let path = std::fs::canonicalize(&args.out).unwrap_or_else(|_| args.out.clone());
    println!("# tuning file written to {}", path.display());
    println!("# use it: CONFLUX_TUNE_FILE={} conflux run ... (rank 0 reads it; every rank uses it)", path.display());
    Ok(())
}

/// Rank 0's median round trips (µs) with `peer` of 8 bytes and of 32 MiB; the peer echoes, the
/// other ranks wait at the barrier. Some on rank 0 only.
fn ping_pong(comm: &Communicator, peer: usize) -> Result<Option<(f64, f64)>, String> {
    let me = comm.rank();
    let mut out = None;
    if me == 0 || me == peer {
        let (mut small, mut big) = ([0u8; 8], vec![0u8; BIG]);
        let r8 = round_trip_us(comm, peer_of(me, peer), &mut small, 200, 2000, TAG).map_err(es)?;
        let rb = round_trip_us(comm, peer_of(me, peer), &mut big, 3, 50, TAG).map_err(es)?;
        out = (me == 0).then_some((r8, rb));
    }
    comm.barrier().map_err(es)?;
    Ok(out)
}

/// Rank 0's partner is `peer`; the peer's is rank 0.
fn peer_of(me: usize, peer: usize) -> usize {
    if me == 0 {
        peer
    } else {
        0
    }
}

/// Median time (µs) of an 8-byte sum all_reduce on every rank, as rank 0 sees it (Some there).
fn timed_all_reduce(h: &Communicator) -> Result<Option<f64>, String> {
    let mut buf = [1.0f32; 2];
    let t = median_us(100, 1000, || h.all_reduce(&mut buf, ReduceOp::Sum).map_err(es))?;
    h.barrier().map_err(es)?;
    Ok((h.rank() == 0).then_some(t))
}

/// One core's f32 sum of 32 MiB into 32 MiB, and memcpy of 64 MiB, in GB/s (= kB/µs).
fn local_gbps() -> (f64, f64) {
    let src: Vec<u8> = (0..BIG / 4).flat_map(|_| 1.0f32.to_ne_bytes()).collect();
    let mut dst = vec![0u8; BIG];
    let reduce = |d: &mut [u8]| {
        conflux::reduce::reduce_into(DataType::F32, ReduceOp::Sum, d, black_box(&src));
        Ok::<(), Infallible>(())
    };
    let r = median_us(2, 20, || reduce(black_box(&mut dst))).unwrap_or(f64::NAN);
    let (src, mut dst) = (vec![1u8; 64 << 20], vec![0u8; 64 << 20]);
    let copy = || {
        black_box(&mut dst).copy_from_slice(black_box(&src));
        Ok::<(), Infallible>(())
    };
    let c = median_us(1, 5, copy).unwrap_or(f64::NAN);
    (BIG as f64 * 1e-3 / r, src.len() as f64 * 1e-3 / c)
}

/// α = half the small round trip; GB/s = bytes / (half the big one − α), in kB/µs.
fn fit_link(rtt_small_us: f64, rtt_big_us: f64, big_bytes: usize) -> LinkCost {
    let alpha_us = (rtt_small_us / 2.0).max(1e-3);
    let beta_time = (rtt_big_us / 2.0 - alpha_us).max(1e-3);
    LinkCost { alpha_us, gbps: big_bytes as f64 * 1e-3 / beta_time }
}

/// The 8-byte ring costs 2(N−1)·α·f in the model (its byte terms are negligible), f being
/// `1 + (oversub − 1)·crowding`; solved for oversub.
fn fit_oversub(ring_us: f64, topo: &Topo, shm_alpha_us: f64) -> f64 {
    let f = ring_us / (2.0 * (topo.size as f64 - 1.0) * shm_alpha_us);
    let crowding = topo.crowding();
    if crowding <= 0.0 {
        return Model::default().oversub;
    }
    (1.0 + (f - 1.0) / crowding).clamp(1.0, 50.0)
}

/// Solves the model's small direct all_reduce, `sync·f` plus its copy and reduce terms (f the
/// model's `sync_factor`), for sync: the terms are `predict`'s with sync set to 0.
fn fit_sync(measured_us: f64, bytes: usize, m: &Model, topo: &Topo) -> f64 {
    let call = Call { op: OpKind::AllReduce, bytes, even: true, pieces: false, half: false };
    let terms = predict(&Model { sync_us: 0.0, ..*m }, Algo::Direct, &call, topo).unwrap_or(0.0);
    ((measured_us - terms) / m.sync_factor(topo)).max(1e-3)
}

/// "YYYY-MM-DD HH:MM:SS UTC" of a Unix time (Howard Hinnant's days-to-civil).
fn utc(secs: u64) -> String {
    let (days, s) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let (d, mo) = (doy - (153 * mp + 2) / 5 + 1, if mp < 10 { mp + 3 } else { mp - 9 });
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_fit_inverts_the_step_cost() {
        let l = fit_link(2.0, 2.0 * (1.0 + 33554.432 / 4.0), BIG);
        assert!((l.alpha_us - 1.0).abs() < 1e-9 && (l.gbps - 4.0).abs() < 1e-9, "{l:?}");
        assert!(fit_link(0.0, 0.0, BIG).gbps.is_finite());
    }

    #[test]
    fn sync_fit_makes_predict_match_the_measurement() {
        for (n, load) in [(2, 1.0), (4, 2.0), (8, 4.0), (12, 6.0)] {
            let mut m = Model { oversub: 3.0, ..Model::default() };
            let topo = Topo { load, ..Topo::single(n, true) };
            m.sync_us = fit_sync(7.5, 8, &m, &topo);
            let call = Call { op: OpKind::AllReduce, bytes: 8, even: true, pieces: false, half: false };
            let p = predict(&m, Algo::Direct, &call, &topo).unwrap();
            assert!((p - 7.5).abs() < 1e-9, "n={n}: predicted {p}");
        }
        assert!(fit_sync(0.0, 8, &Model::default(), &Topo::single(2, true)) > 0.0);
    }

    #[test]
    fn oversub_fit_inverts_the_latency_factor_and_is_clamped() {
        let eight = Topo { load: 4.0, ..Topo::single(8, true) };
        assert_eq!(fit_oversub(56.0, &eight, 1.0), 4.0);
        // 4 ranks on 2 cores sit half-way to 4 per core: a factor of 2 there is 3 at 4 per core.
        let four = Topo { load: 2.0, ..Topo::single(4, true) };
        let m = Model { oversub: fit_oversub(12.0, &four, 1.0), ..Model::default() };
        assert!((m.oversub - 3.0).abs() < 1e-9 && (m.latency_factor(&four) - 2.0).abs() < 1e-9, "{m:?}");
        assert_eq!(fit_oversub(0.1, &eight, 1.0), 1.0);
        assert_eq!(fit_oversub(1e6, &eight, 1.0), 50.0);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }
}
