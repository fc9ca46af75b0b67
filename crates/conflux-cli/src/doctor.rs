//! `conflux doctor -n N`: measures every pair of ranks' link ([`Communicator::link_health`])
//! and prints the latency and bandwidth matrices with each pair's link kind, then the pairs
//! far worse than others of their kind. Started alone it launches N copies of itself; inside
//! `conflux run` (or a netns node) every process is one rank.
//!
//! Exit status: 0 when every link is healthy; 3 when a pair was flagged (rank 0, which
//! reports, exits so; the others exit 0 so that the launcher does not cut its report short);
//! 1 when a rank failed (the error names it); 2 for bad arguments.

use std::fmt::Write as _;
use std::process::ExitCode;

use conflux::config::parse_size;
use conflux::{Communicator, HealthOptions, LinkHealth};

use crate::launch::{launch, self_job, LaunchError};

/// The exit status of a check that flagged a pair.
const UNHEALTHY: u8 = 3;

/// `conflux doctor`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Ranks to start (ignored inside an enclosing `conflux run`); at least 2.
    #[arg(short = 'n', long, default_value_t = 2)]
    pub nproc: usize,
    /// Bytes of each bandwidth round trip (k, M, G suffixes).
    #[arg(long, default_value = "4M")]
    pub bytes: String,
    /// Timed bandwidth round trips per pair; latency takes ten times as many of 8 bytes.
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Flag a pair whose bandwidth is below THRESHOLD x its kind's reference, or whose
    /// latency is above the reference / THRESHOLD; in (0, 1].
    #[arg(long, default_value_t = 0.5)]
    pub threshold: f64,
    /// One JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs the check: as one rank inside a job, else by launching `-n` copies of itself.
pub fn main(args: DoctorArgs) -> ExitCode {
    let opts = match options(&args) {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    if std::env::var_os("WORLD_SIZE").is_some() {
        let rank = std::env::var("RANK").unwrap_or_default();
        return run_rank(&opts, args.json).unwrap_or_else(|e| fail(1, format!("rank {rank}: {e}")));
    }
    if args.nproc < 2 {
        return fail(2, "-n must be at least 2 (links are measured between two ranks)".into());
    }
    let spec = match self_job(args.nproc, Vec::new()) {
        Ok(s) => s,
        Err(e) => return fail(2, e.to_string()),
    };
    match launch(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(LaunchError::RankFailed { rank: 0, code: Some(c), .. }) if c == i32::from(UNHEALTHY) => {
            fail(UNHEALTHY, "unhealthy links (flagged above)".into())
        }
        Err(e) => fail(1, e.to_string()),
    }
}

fn options(args: &DoctorArgs) -> Result<HealthOptions, String> {
    let bytes = parse_size(&args.bytes).ok_or_else(|| format!("--bytes {:?} is not a size (e.g. 4M)", args.bytes))?;
    let opts = HealthOptions {
        bytes: usize::try_from(bytes).map_err(|_| format!("--bytes {bytes} is too large"))?,
        iters: args.iters,
        threshold: args.threshold,
    };
    opts.validate().map_err(|e| e.to_string())?;
    Ok(opts)
}

fn fail(code: u8, msg: String) -> ExitCode {
    eprintln!("conflux doctor: {msg}");
    ExitCode::from(code)
}

fn run_rank(opts: &HealthOptions, json: bool) -> Result<ExitCode, String> {
    let es = |e: conflux::Error| e.to_string();
    let comm = Communicator::from_env().map_err(es)?;
    if comm.size() < 2 {
        return Err("needs at least 2 ranks (links are measured between two)".into());
    }
    let health = comm.link_health(opts).map_err(es)?;
    let lead = comm.rank() == 0;
    if lead {
        let nodes = comm.topology().nodes.len();
        print!("{}", if json { to_json(&health, opts, nodes) } else { report(&health, opts, nodes) });
    }
    // The others wait for the report, so that a launcher stopping the job cannot cut it short.
    comm.barrier().map_err(es)?;
    comm.shutdown().map_err(es)?;
    Ok(if lead && !health.healthy() { ExitCode::from(UNHEALTHY) } else { ExitCode::SUCCESS })
}

/// The tables, the references and the verdict, as rank 0 prints them.
fn report(h: &LinkHealth, opts: &HealthOptions, nodes: usize) -> String {
    let n = h.size();
    let mut out = format!(
        "# conflux doctor: {n} ranks on {nodes} node(s); bandwidth round trips of {} bytes x {}, latency of 8 bytes x {}\n",
        opts.bytes,
        opts.iters,
        opts.iters * 10
    );
    let table = |out: &mut String, title: &str, m: &[Vec<f64>], prec: usize| {
        let _ = writeln!(out, "\n# {title}");
        let _ = writeln!(out, "{:>6}{}", "rank", (0..n).map(|b| format!("{b:>14}")).collect::<String>());
        for (a, row) in m.iter().enumerate() {
            let cells: String = (0..n)
                .map(|b| match h.kind[a][b] {
                    Some(k) => format!("{:>10.prec$} {k}", row[b]),
                    None => format!("{:>14}", "-"),
                })
                .collect();
            let _ = writeln!(out, "{a:>6}{cells}");
        }
    };
    table(&mut out, "latency, us (one way, half the median round trip)", &h.latency_us, 2);
    table(&mut out, "bandwidth, GB/s", &h.gbps, 3);
    let _ = writeln!(out, "\n# reference per link kind (the median over ranks of each rank's median link):");
    for r in &h.reference {
        let _ = writeln!(out, "#   {}: {:.2} us, {:.3} GB/s ({} pairs)", r.kind, r.latency_us, r.gbps, r.pairs);
    }
    for &(a, b, ratio) in &h.slow {
        let kind = h.kind[a][b].map_or("?", |k| k.name());
        let _ = writeln!(
            out,
            "SLOW: ranks {a} and {b} ({kind}): bandwidth {:.3} GB/s = {:.3} x reference, latency {:.2} us = {:.2} x reference (worse ratio {ratio:.3} < threshold {})",
            h.gbps[a][b],
            h.bandwidth_ratio(a, b).unwrap_or(f64::NAN),
            h.latency_us[a][b],
            h.latency_ratio(a, b).unwrap_or(f64::NAN),
            opts.threshold
        );
    }
    if h.healthy() {
        out += "all links healthy\n";
    } else {
        let _ = writeln!(out, "{} of {} links flagged", h.slow.len(), n * (n - 1) / 2);
    }
    out
}

/// JSON has no NaN or infinity: those (and the diagonal) are null.
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "null".into()
    }
}

/// One JSON object: the options, matrices (diagonal null), link kinds, references and flagged pairs.
fn to_json(h: &LinkHealth, opts: &HealthOptions, nodes: usize) -> String {
    let n = h.size();
    let matrix = |m: &[Vec<f64>]| {
        let rows: Vec<String> = (0..n)
            .map(|a| {
                let cells: Vec<String> =
                    (0..n).map(|b| if h.kind[a][b].is_some() { num(m[a][b]) } else { "null".into() }).collect();
                format!("[{}]", cells.join(","))
            })
            .collect();
        format!("[{}]", rows.join(","))
    };
    let kinds: Vec<String> = h
        .kind
        .iter()
        .map(|row| {
            let cells: Vec<String> = row.iter().map(|k| k.map_or("null".into(), |k| format!("\"{k}\""))).collect();
            format!("[{}]", cells.join(","))
        })
        .collect();
    let refs: Vec<String> = h
        .reference
        .iter()
        .map(|r| {
            format!(
                "{{\"kind\":\"{}\",\"latency_us\":{},\"gbps\":{},\"pairs\":{}}}",
                r.kind,
                num(r.latency_us),
                num(r.gbps),
                r.pairs
            )
        })
        .collect();
    let slow: Vec<String> = h
        .slow
        .iter()
        .map(|&(a, b, ratio)| {
            let (bw, lat) = (h.bandwidth_ratio(a, b).unwrap_or(f64::NAN), h.latency_ratio(a, b).unwrap_or(f64::NAN));
            format!(
                "{{\"a\":{a},\"b\":{b},\"ratio\":{},\"bandwidth_ratio\":{},\"latency_ratio\":{}}}",
                num(ratio),
                num(bw),
                num(lat)
            )
        })
        .collect();
    format!(
        "{{\"ranks\":{n},\"nodes\":{nodes},\"bytes\":{},\"iters\":{},\"threshold\":{},\"latency_us\":{},\"bandwidth_gbps\":{},\"link\":[{}],\"reference\":[{}],\"slow\":[{}],\"healthy\":{}}}\n",
        opts.bytes,
        opts.iters,
        num(opts.threshold),
        matrix(&h.latency_us),
        matrix(&h.gbps),
        kinds.join(","),
        refs.join(","),
        slow.join(","),
        h.healthy()
    )
}
