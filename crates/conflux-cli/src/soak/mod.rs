//! `conflux soak -n N --seconds S`: every rank makes the same long pseudo-random sequence of
//! calls (operation, dtype, reduce op, size, root, in place or not, blocking or not, forced
//! algorithm or auto, whole job or a sub-group), checks each result against an exact
//! reference, and watches resident memory; the job fails on any wrong result or a leak.
//!
//! Like `conflux bench`, it starts N copies of itself through the launcher when not inside a
//! job, and is one rank inside `conflux run` (so it runs across nodes the same way).
//!
//! Ranks it starts itself run with glibc's MALLOC_MMAP_THRESHOLD_ fixed (unless set), so that
//! RSS measures live memory; inside `conflux run`, set it there for the same measure.
//!
//! Test-only: CONFLUX_SOAK_CORRUPT=1 makes the job's last rank damage one element of one
//! result before checking it, to prove that the checker reports it and the job fails.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use conflux::config::parse_size;
use conflux::{Communicator, Config, ReduceOp, TransportKind};

mod draw;
mod exec;
mod report;

use crate::launch;
use draw::{draw, Draw, Rng};
use exec::Outcome;
use report::{Rss, Summary, Tally};

/// Options of `conflux soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// Ranks to start (ignored inside an enclosing `conflux run`).
    #[arg(short = 'n', long, default_value_t = 2)]
    pub nproc: usize,
    /// How long to keep making calls.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// The sequence's seed (rank 0's is used by all); default: from the clock. The report
    /// prints it, so that a failing sequence can be run again.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The largest buffer one call uses (e.g. 4M, 256K).
    #[arg(long, default_value = "4M")]
    pub max_bytes: String,
    /// auto, shm or tcp (CONFLUX_TRANSPORT).
    #[arg(long)]
    pub transport: Option<String>,
    /// The report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How many iterations run between two checks of the clock (each check is one small
/// all_reduce, which keeps every rank's decision to stop identical).
const CLOCK_EVERY: u64 = 8;
/// glibc's knob for the size above which buffers are mapped on their own (see `main`).
const MMAP_THRESHOLD: &str = "MALLOC_MMAP_THRESHOLD_";
/// Wrong results each rank describes on stderr; the rest are only counted.
const DESCRIBED: u64 = 5;

/// Runs `conflux soak`: as one rank inside a job, else as the launcher of N ranks.
pub fn main(args: SoakArgs) -> ExitCode {
    if std::env::var_os("WORLD_SIZE").is_some() {
        return match run_rank(&args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(3),
            Err(e) => {
                eprintln!("conflux soak: rank {}: {e}", std::env::var("RANK").unwrap_or_default());
                ExitCode::from(1)
            }
        };
    }
    // glibc moves its mmap threshold up to the largest buffer freed, after which every freed
    // buffer of up to 32 MiB stays in one of its per-thread arenas (one per engine thread):
    // RSS then follows the allocator's caching, not live memory, and grows by tens of MiB
    // over a run without any leak. A fixed threshold hands large buffers back on free, so
    // that growth means memory still held. Measured: 4 ranks, 30 s, 4 MiB buffers grew
    // 28-42 MiB with the default and 12-15 MiB (no trend past 20 s) with this one.
    let malloc: &[(&str, &str)] =
        if std::env::var_os(MMAP_THRESHOLD).is_some() { &[] } else { &[(MMAP_THRESHOLD, "131072")] };
    let mut env: Vec<(String, String)> = malloc.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    if let Some(t) = &args.transport {
        env.push(("CONFLUX_TRANSPORT".into(), t.clone()));
    }
    match launch::self_job(args.nproc, env).and_then(|spec| launch::launch(&spec)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conflux soak: {e}");
            ExitCode::from(1)
        }
    }
}

/// One rank's soak; Ok(passed) once the job agreed on its result.
fn run_rank(args: &SoakArgs) -> Result<bool, String> {
    let max_bytes = parse_size(&args.max_bytes).ok_or_else(|| format!("bad --max-bytes {:?}", args.max_bytes))?;
    let max_bytes = usize::try_from(max_bytes).map_err(|_| format!("--max-bytes {} is too large", args.max_bytes))?;
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(format!("--seconds must be a positive number of seconds, not {}", args.seconds));
    }
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(t) = &args.transport {
        cfg.transport = TransportKind::parse(t).ok_or_else(|| format!("unknown transport {t:?}"))?;
    }
    let world = Communicator::from_env_with(cfg).map_err(|e| e.to_string())?;
    let e = |e: conflux::Error| e.to_string();
    let seed = agree_seed(&world, args.seed).map_err(e)?;
    let groups = make_groups(&world).map_err(e)?;
    let mut corrupt = std::env::var("CONFLUX_SOAK_CORRUPT").is_ok_and(|v| v == "1") && world.rank() == world.size() - 1;

    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let total = Duration::from_secs_f64(args.seconds);
    // The sequence opens with the largest call of every kind on every group, blocking and
    // not (`draw::largest`), and RSS is first read once those ran and some time passed: by
    // then the allocator's arenas (one per engine thread) hold the largest buffers they will
    // ever need, links and segments are up, and most of the run is still to be measured.
    let warm_up = (total / 5).min(Duration::from_secs(2));
    let warm_draws = draw::largest(max_bytes, groups.len());
    let start = Instant::now();
    let mut rss_start = None;
    let mut iter = 0u64;
    loop {
        if iter.is_multiple_of(CLOCK_EVERY) {
            let mut slowest = [start.elapsed().as_micros() as i64];
            world.all_reduce(&mut slowest, ReduceOp::Max).map_err(e)?;
            let elapsed = Duration::from_micros(slowest[0] as u64);
            if rss_start.is_none() && elapsed >= warm_up && iter >= warm_draws.len() as u64 {
                rss_start = Some(rss_kib()?);
            }
            if elapsed >= total {
                break;
            }
        }
        let d = match warm_draws.get(iter as usize) {
            Some(w) => w.clone(),
            None => draw(&mut rng, max_bytes, groups.len()),
        };
        if let Some((_, Some(comm))) = groups.get(d.group) {
            let outcome = exec::run(comm, &d, iter, &mut corrupt).map_err(|err| describe(&d, comm, iter, &err))?;
            if let Outcome::Wrong { detail, .. } = &outcome {
                if tally.wrong_calls < DESCRIBED {
                    eprintln!(
                        "conflux soak: rank {}: wrong result: {}: {detail}",
                        world.rank(),
                        describe(&d, comm, iter, &"")
                    );
                }
            }
            tally.record(&d, &outcome);
        }
        iter += 1;
    }
    let rss = Rss { start_kib: rss_start.unwrap_or(0), end_kib: rss_kib()? };
    let (sum, all_rss) = report::gather(&world, &tally, rss).map_err(e)?;
    let summary = Summary {
        ranks: world.size(),
        seed,
        seconds: start.elapsed().as_secs_f64(),
        max_bytes,
        transport: std::env::var("CONFLUX_TRANSPORT").unwrap_or_else(|_| "auto".into()),
        groups: groups.iter().map(|(name, _)| name.clone()).collect(),
        tally: sum,
        rss: all_rss,
    };
    if world.rank() == 0 {
        print!("{}", if args.json { summary.json() + "\n" } else { summary.text() });
    }
    // Sub-groups first: the job's goodbye lets rank 0 stop the store they use.
    for (_, g) in groups.into_iter().skip(1) {
        if let Some(g) = g {
            g.shutdown().map_err(e)?;
        }
    }
    world.shutdown().map_err(e)?;
    Ok(summary.passed())
}

/// Rank 0's seed (the one given, or one from its clock), on every rank.
fn agree_seed(world: &Communicator, given: Option<u64>) -> conflux::Result<u64> {
    let mine = given.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    });
    let mut s = [mine as i64];
    world.broadcast(&mut s, 0)?;
    Ok(s[0] as u64)
}

/// The communicators draws choose from, each with a name for the report: the whole job, then
/// sub-groups of different shapes (this rank's is None where it is not a member). Made once
/// and reused, as a training job does; making them is collective, so every rank makes all.
fn make_groups(world: &Communicator) -> conflux::Result<Vec<(String, Option<Communicator>)>> {
    let (n, r) = (world.size(), world.rank());
    let all: Vec<usize> = (0..n).collect();
    // Parity halves, each numbered backwards: the two run at the same time, differently sized.
    let halves = world.split(Some((r % 2) as u32), -(r as i64))?;
    // Without rank 0, the rank that serves the store (the whole job when there is one rank).
    let rest = if n > 1 { &all[1..] } else { &all[..] };
    let without_0 = world.new_group(rest)?;
    let reversed: Vec<usize> = all.iter().rev().copied().collect();
    let backwards = world.new_group(&reversed)?;
    Ok(vec![
        (format!("world ({n})"), Some(world.with_algo(None))),
        (format!("parity halves ({}+{})", n.div_ceil(2), n / 2), halves),
        (format!("ranks {rest:?}"), without_0),
        ("world reversed".into(), backwards),
    ])
}

/// One call as a person reads it in a message: what was drawn, where, and why it failed.
fn describe(d: &Draw, comm: &Communicator, iter: u64, err: &dyn std::fmt::Display) -> String {
    let algo = d.algo.map_or("auto".to_string(), |a| a.to_string());
    let how = format!(
        "{}{}",
        if d.in_place { "in place" } else { "out of place" },
        if d.nonblocking { ", async" } else { "" }
    );
    let what = format!(
        "iteration {iter}: {}({} bytes of {}, {}, algo {algo}, {how}) on group {} of {} ranks",
        d.kind.name(),
        d.bytes,
        d.dtype,
        exec::redop_label(d),
        d.group,
        comm.size()
    );
    let err = err.to_string();
    if err.is_empty() {
        what
    } else {
        format!("{what}: {err}")
    }
}

/// This process's resident memory (VmRSS), in KiB.
fn rss_kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("reading /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS line in /proc/self/status".to_string())
}
