//! `conflux bench OP -n N`: nccl-tests' table (size, count, type, redop, root, time, algbw,
//! busbw, #wrong) for one collective or all of them, over a range of sizes.
//!
//! Without an enclosing job it starts N copies of itself through the launcher; inside a job
//! (`conflux run -n N -- conflux bench OP`) every process is one rank. algbw = size / time;
//! busbw = algbw x the nccl-tests factor of the operation, comparable across rank counts.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use conflux::algo::select::ModelSource;
use conflux::config::parse_size;
use conflux::{Algo, Communicator, Config, DataType, ReduceOp, TransportKind};

mod compare;
mod models;
pub mod plot;
mod stats;
mod step;
mod timing;

use crate::launch::{launch, self_job};
use conflux::with_dtype;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, reduce, sendrecv or all;
    /// or a training-step benchmark: fusion (per-tensor vs coalesced vs bucketed all_reduce of
    /// a model's gradients) or overlap (a matmul with a bucket's all_reduce underneath).
    pub op: String,
    /// The model whose gradients `fusion` reduces: gpt2 (148 tensors) or resnet50 (161).
    #[arg(long, default_value = "resnet50")]
    pub model: String,
    /// Ranks to start (ignored inside an enclosing `conflux run`).
    #[arg(short = 'n', long, default_value_t = 2)]
    pub nproc: usize,
    #[arg(short = 'b', long, default_value = "8")]
    pub min_bytes: String,
    #[arg(short = 'e', long, default_value = "64M")]
    pub max_bytes: String,
    /// Multiplier between sizes.
    #[arg(short = 'f', long, default_value_t = 4)]
    pub factor: u64,
    #[arg(short = 'd', long, default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long, visible_alias = "op", default_value = "sum")]
    pub redop: String,
    #[arg(short = 'r', long, default_value_t = 0)]
    pub root: usize,
    /// Timed iterations per size and algorithm, in all of its first --rounds rounds (a quarter
    /// for sizes over 1 MiB, at least 5); sizes given extra rounds (--max-rounds) run more.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed calls per size and algorithm before the timed ones (at least 2: the first,
    /// which pays the buffers' first touch, is left out of the estimate of a call's time that
    /// --min-ms sizes the batches by).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Run more iterations than --iters where needed for an algorithm's timed calls at one
    /// size to last this long over its first --rounds rounds (milliseconds; 0 = exactly
    /// --iters), so that small sizes are not timed over a few microseconds. Default 10, or 30
    /// with --report-auto, or 0 with --latency alone.
    #[arg(long)]
    pub min_ms: Option<f64>,
    /// all_reduce in place, on one buffer (what torch.distributed's all_reduce does), instead
    /// of from a send buffer into a receive buffer. As in nccl-tests, the timed calls reduce
    /// the previous result again; --check starts from the input.
    #[arg(long)]
    pub inplace: bool,
    /// Time each call on its own, the ranks meeting at a barrier (untimed) between calls, as
    /// OSU's micro-benchmarks do, instead of back to back as nccl-tests does: what one call
    /// costs when the ranks start it together. Back to back, a rooted operation's ranks run
    /// ahead into the next call, and with more ranks than cores the scheduler decides how far.
    #[arg(long)]
    pub latency: bool,
    /// Validate every result against an independently computed expectation.
    #[arg(short = 'c', long)]
    pub check: bool,
    /// auto, shm or tcp (CONFLUX_TRANSPORT).
    #[arg(long)]
    pub transport: Option<String>,
    /// Algorithms to run side by side, e.g. `ring,tree,rabenseifner,auto`, or `all` (every
    /// one that implements the operation, and auto). Unset: auto alone, as CONFLUX_ALGO says.
    #[arg(long)]
    pub algo: Option<String>,
    /// After the tables, auto's busbw against the best forced algorithm's, size by size
    /// (with --algo; auto is added to the list).
    #[arg(long)]
    pub report_auto: bool,
    /// Split each algorithm's timed calls into this many batches, the algorithms taking
    /// turns batch by batch, and keep each one's median batch: drift and noise (4+ ranks on
    /// 2 cores) then reach every algorithm alike. Default 1, or 15 with --report-auto (which
    /// may add more: --max-rounds).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// With --report-auto: a size where auto's ratio to the best forced algorithm is still
    /// undecided against 0.90 (its 95% interval holds 0.90) runs --rounds more rounds, and
    /// again, up to this many in all. Default 4 x --rounds.
    #[arg(long)]
    pub max_rounds: Option<usize>,
    /// Also write every row to this CSV file.
    #[arg(long)]
    pub csv: Option<std::path::PathBuf>,
    /// Draw busbw and time against size, one line per algorithm, into this SVG file.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    pub json: bool,
}

const OPS: [&str; 7] = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "sendrecv"];

pub fn main(args: BenchArgs) -> ExitCode {
    if !matches!(args.op.as_str(), "all" | "fusion" | "overlap") && !OPS.contains(&args.op.as_str()) {
        eprintln!("conflux bench: unknown operation {:?}; one of {}, all, fusion or overlap", args.op, OPS.join(", "));
        return ExitCode::from(2);
    }
    if std::env::var_os("WORLD_SIZE").is_some() {
        return rank_main(&args);
    }
    // Start the ranks: this same program, inside a job of N.
    let mut extra_env = Vec::new();
    if let Some(t) = &args.transport {
        extra_env.push(("CONFLUX_TRANSPORT".to_string(), t.clone()));
    }
    let spec = match self_job(args.nproc, extra_env) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("conflux bench: {e}");
            return ExitCode::from(2);
        }
    };
    match launch(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conflux bench: {e}");
            ExitCode::from(1)
        }
    }
}

pub(crate) struct Row {
    op: &'static str,
    /// The algorithm forced for this row; None is auto.
    forced: Option<Algo>,
    /// The algorithm that served it (auto's choice, or the forced one).
    chosen: Option<Algo>,
    bytes: usize,
    count: usize,
    dtype: DataType,
    redop: Option<ReduceOp>,
    root: Option<usize>,
    us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
    /// Microseconds per call in each round (at least one), in round order (`us` is their median).
    samples: Vec<f64>,
}

impl Row {
    /// `ring`, or for auto the algorithm it chose: `auto(rd)`.
    fn label(&self) -> String {
        match (self.forced, self.chosen) {
            (Some(a), _) => a.name().to_string(),
            (None, Some(c)) => format!("auto({c})"),
            (None, None) => "auto".into(),
        }
    }
}

fn rank_main(args: &BenchArgs) -> ExitCode {
    match run_ranks(args) {
        Ok(all_right) => {
            if all_right {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            }
        }
        Err(e) => {
            eprintln!("conflux bench: rank {}: {e}", std::env::var("RANK").unwrap_or_default());
            ExitCode::from(1)
        }
    }
}

fn run_ranks(args: &BenchArgs) -> Result<bool, String> {
    let dtype = DataType::parse(&args.dtype).ok_or_else(|| format!("unknown dtype {:?}", args.dtype))?;
    let redop = ReduceOp::parse(&args.redop).ok_or_else(|| format!("unknown reduction {:?}", args.redop))?;
    let min = parse_size(&args.min_bytes).ok_or_else(|| format!("bad --min-bytes {:?}", args.min_bytes))? as usize;
    let max = parse_size(&args.max_bytes).ok_or_else(|| format!("bad --max-bytes {:?}", args.max_bytes))? as usize;
    if args.factor < 2 {
        return Err("--factor must be at least 2".into());
    }
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(t) = &args.transport {
        cfg.transport = TransportKind::parse(t).ok_or_else(|| format!("unknown transport {t:?}"))?;
    }
    let comm = Communicator::from_env_with(cfg).map_err(|e| e.to_string())?;
    match args.op.as_str() {
        "fusion" => return step::fusion(&comm, args),
        "overlap" => return step::overlap(&comm, args),
        _ => {}
    }
    if args.root >= comm.size() {
        return Err(format!("--root {} is out of range for {} ranks", args.root, comm.size()));
    }
    let ops: Vec<&'static str> =
        if args.op == "all" { OPS.to_vec() } else { OPS.iter().copied().filter(|o| *o == args.op).collect() };
    let mut algos = compare::parse(args.algo.as_deref())?;
    if args.report_auto && !algos.contains(&None) {
        algos.push(None);
    }
    let comparing = args.algo.is_some();
    let lead = comm.rank() == 0;
    if lead && !args.json {
        print_header(&comm, args, dtype);
    }
    let mut all_right = true;
    let mut rows = Vec::new();
    for op in ops {
        let mut list = compare::for_op(&algos, op);
        if lead && !args.json {
            println!("# {op}");
            let algo = if comparing { format!(" {:>20}", "algo") } else { String::new() };
            println!(
                "#{:>12} {:>12} {:>9} {:>6} {:>5}{algo} {:>11} {:>9} {:>9} {:>7}",
                "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"
            );
            let blank = if comparing { format!(" {:>20}", "") } else { String::new() };
            println!(
                "#{:>12} {:>12} {:>9} {:>6} {:>5}{blank} {:>11} {:>9} {:>9} {:>7}",
                "(B)", "(elements)", "", "", "", "", "(GB/s)", "(GB/s)", ""
            );
        }
        let mut bytes = min.max(dtype.size());
        while bytes <= max {
            let skipped = |why: &str| {
                if lead && !args.json {
                    println!("# skipped: {why}");
                }
            };
            let measured =
                with_dtype!(dtype, T => timing::measure::<T>(&comm, &mut list, op, bytes, redop, args, skipped));
            for row in measured.map_err(|e| e.to_string())? {
                all_right &= row.wrong == 0;
                if lead {
                    print_row(&row, args, comparing);
                }
                rows.push(row);
            }
            bytes = match bytes.checked_mul(args.factor as usize) {
                Some(b) => b,
                None => break,
            };
        }
    }
    if lead {
        write_outputs(&comm, args, dtype, &rows)?;
    }
    Ok(all_right)
}

/// The report, CSV and plot that rank 0 writes after the tables.
fn write_outputs(comm: &Communicator, args: &BenchArgs, dtype: DataType, rows: &[Row]) -> Result<(), String> {
    if args.report_auto {
        print!("{}", compare::report_auto(rows));
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, compare::csv(rows)).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title =
            format!("conflux bench {}: {} ranks ({} per host), {dtype}", args.op, comm.size(), comm.local_size());
        let subtitle = format!(
            "transport {}, {} iterations per size{}; busbw as nccl-tests computes it",
            std::env::var("CONFLUX_TRANSPORT").unwrap_or_else(|_| "auto".into()),
            args.iters,
            if args.latency { ", each call timed alone (--latency)" } else { "" }
        );
        let doc = compare::svg(rows, &title, &subtitle);
        std::fs::write(path, doc).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("# plot written to {}", path.display());
    }
    Ok(())
}

/// Single-core memcpy of 64 MiB, the reference the table is read against.
fn memcpy_gbps() -> f64 {
    let n = 64 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let t = Instant::now();
    let reps = 4;
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&src));
    }
    std::hint::black_box(&dst);
    (n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn print_header(comm: &Communicator, args: &BenchArgs, dtype: DataType) {
    println!(
        "# conflux bench: {} ranks ({} on this host), dtype {dtype}, {} iters, {} warmup, check {}{}{}",
        comm.size(),
        comm.local_size(),
        args.iters,
        args.warmup,
        if args.check { "on" } else { "off" },
        if args.inplace { ", all_reduce in place" } else { "" },
        if args.latency { ", latency: each call timed alone between barriers" } else { "" }
    );
    println!(
        "# transport {}, algo {}, reduction kernel {}",
        std::env::var("CONFLUX_TRANSPORT").unwrap_or_else(|_| "auto".into()),
        std::env::var("CONFLUX_ALGO").unwrap_or_else(|_| "auto".into()),
        conflux::reduce::kernel_name()
    );
    let m = comm.cost_model();
    let source = match comm.cost_model_source() {
        ModelSource::Defaults => "defaults",
        ModelSource::TuningFile => "rank 0's CONFLUX_TUNE_FILE",
        ModelSource::MeasuredTcp => "defaults, TCP's GB/s measured between the nodes",
    };
    // Four decimals, trailing zeros dropped: a measured rate of 0.0042 GB/s still shows.
    let short = |v: f64| format!("{v:.4}").trim_end_matches('0').trim_end_matches('.').to_string();
    println!(
        "# cost model ({source}): shm {} us {} GB/s, tcp {} us {} GB/s",
        short(m.shm.alpha_us),
        short(m.shm.gbps),
        short(m.tcp.alpha_us),
        short(m.tcp.gbps)
    );
    println!("# reference: single-core memcpy of 64 MiB on this machine: {:.2} GB/s", memcpy_gbps());
}

fn print_row(r: &Row, args: &BenchArgs, comparing: bool) {
    let redop = r.redop.map_or("none", |o| o.name());
    let root = r.root.map_or(-1, |x| x as i64);
    if args.json {
        println!(
            "{{\"op\":\"{}\",\"algo\":\"{}\",\"size\":{},\"count\":{},\"type\":\"{}\",\"redop\":\"{redop}\",\"root\":{root},\"time_us\":{:.3},\"algbw\":{:.4},\"busbw\":{:.4},\"wrong\":{}}}",
            r.op,
            r.label(),
            r.bytes,
            r.count,
            r.dtype,
            r.us,
            r.algbw,
            r.busbw,
            r.wrong
        );
    } else {
        let mut line = String::new();
        let _ = write!(
            line,
            " {:>12} {:>12} {:>9} {:>6} {:>5}{} {:>11.2} {:>9.3} {:>9.3} {:>7}",
            r.bytes,
            r.count,
            r.dtype.name(),
            redop,
            root,
            if comparing { format!(" {:>20}", r.label()) } else { String::new() },
            r.us,
            r.algbw,
            r.busbw,
            if args.check { r.wrong.to_string() } else { "N/A".into() }
        );
        println!("{line}");
    }
}
