//! `conflux bench OP -n N`: nccl-tests' table (size, count, type, redop, root, time, algbw,
//! busbw, #wrong) for one collective or all of them, over a range of sizes.
//!
//! Without an enclosing job it starts N copies of itself through the launcher; inside a job
//! (`conflux run -n N -- conflux bench OP`) every process is one rank. algbw = size / time;
//! busbw = algbw x the nccl-tests factor of the operation, comparable across rank counts.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use conflux::config::parse_size;
use conflux::{Algo, Communicator, Config, DataType, OpKind, ReduceOp, TransportKind};

mod compare;
mod models;
pub mod plot;
mod step;

use crate::launch::{launch, self_job};
use crate::verify::{self, Num};
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
    /// Timed iterations per size (fewer are run for sizes over 1 MiB, at least 5).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Run more iterations than --iters where needed for a measurement to last this long
    /// (milliseconds; 0 = exactly --iters), so that small sizes are not timed over a few
    /// microseconds. Default 0, or 5 with --report-auto.
    #[arg(long)]
    pub min_ms: Option<f64>,
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
    /// Measure each size this many times, the algorithms taking turns, and keep each one's
    /// median: drift and noise (4+ ranks on 2 cores) then favour no algorithm. (The best of
    /// several noisy runs would favour the forced algorithms: the best of three is likelier
    /// to be an outlier than auto's one.) Default 1, or 7 with --report-auto.
    #[arg(long)]
    pub rounds: Option<usize>,
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
        let rounds = args.rounds.unwrap_or(if args.report_auto { 7 } else { 1 }).max(1);
        let mut bytes = min.max(dtype.size());
        while bytes <= max {
            let mut runs: Vec<Vec<Row>> = Vec::new();
            for _ in 0..rounds {
                let mut k = 0;
                while k < list.len() {
                    let forced = list[k];
                    let h = comm.with_algo(forced);
                    match with_dtype!(dtype, T => measure::<T>(&comm, &h, op, bytes, redop, args)) {
                        Ok(row) => {
                            all_right &= row.wrong == 0;
                            runs.resize_with(list.len(), Vec::new);
                            runs[k].push(row);
                            k += 1;
                        }
                        // A forced algorithm that cannot serve this job (every rank refuses alike).
                        Err(conflux::Error::InvalidArgument(why)) if forced.is_some() => {
                            if lead && !args.json {
                                println!("# skipped: {why}");
                            }
                            list.remove(k);
                            if k < runs.len() {
                                runs.remove(k);
                            }
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
            }
            for row in runs.into_iter().filter_map(median) {
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
            "transport {}, {} iterations per size; busbw as nccl-tests computes it",
            std::env::var("CONFLUX_TRANSPORT").unwrap_or_else(|_| "auto".into()),
            args.iters
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
        "# conflux bench: {} ranks ({} on this host), dtype {dtype}, {} iters, {} warmup, check {}",
        comm.size(),
        comm.local_size(),
        args.iters,
        args.warmup,
        if args.check { "on" } else { "off" }
    );
    println!(
        "# transport {}, algo {}, reduction kernel {}",
        std::env::var("CONFLUX_TRANSPORT").unwrap_or_else(|_| "auto".into()),
        std::env::var("CONFLUX_ALGO").unwrap_or_else(|_| "auto".into()),
        conflux::reduce::kernel_name()
    );
    println!("# reference: single-core memcpy of 64 MiB on this machine: {:.2} GB/s", memcpy_gbps());
}

/// The run of median time (the faster of the middle two for an even count), with the wrong
/// results of all runs.
fn median(mut runs: Vec<Row>) -> Option<Row> {
    runs.sort_by(|a, b| a.us.total_cmp(&b.us));
    let wrong = runs.iter().map(|r| r.wrong).sum();
    let mid = runs.len().saturating_sub(1) / 2;
    (!runs.is_empty()).then(|| Row { wrong, ..runs.swap_remove(mid) })
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

/// Runs one operation at one size: warm-up, timed iterations, then (with --check) a count of
/// wrong elements summed over ranks. The time is the slowest rank's average.
/// `h` runs the measured operation (with its algorithm forced or not); `comm` the bookkeeping.
fn measure<T: Num>(
    comm: &Communicator,
    h: &Communicator,
    op: &'static str,
    bytes: usize,
    redop: ReduceOp,
    args: &BenchArgs,
) -> conflux::Result<Row> {
    let (n, r) = (comm.size(), comm.rank());
    let es = T::DTYPE.size();
    let root = args.root;
    // Sizes follow nccl-tests: all_gather's is the total output, reduce_scatter's the total
    // input, all_to_all's the whole send buffer of one rank.
    let per_rank = |total: usize| total / es / n;
    let count = match op {
        "all_gather" | "reduce_scatter" | "all_to_all" => per_rank(bytes) * n,
        _ => bytes / es,
    };
    let block = count / n;
    let fill = |len: usize, base: usize| {
        let mut v = vec![T::zeroed(); len];
        verify::fill(&mut v, redop, r, base);
        v
    };
    let (send, mut recv): (Vec<T>, Vec<T>) = match op {
        "all_gather" => (fill(block, 0), vec![T::zeroed(); block * n]),
        "reduce_scatter" => (fill(block * n, 0), vec![T::zeroed(); block]),
        "broadcast" => (Vec::new(), if r == root { fill(count, 0) } else { vec![T::zeroed(); count] }),
        _ => (fill(count, 0), vec![T::zeroed(); count]),
    };
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let once = |recv: &mut Vec<T>| -> conflux::Result<()> {
        match op {
            "all_reduce" => h.all_reduce_into(&send, recv, redop),
            "all_gather" => h.all_gather(&send, recv),
            "reduce_scatter" => h.reduce_scatter(&send, recv, redop),
            "broadcast" => h.broadcast(recv, root),
            "all_to_all" => h.all_to_all(&send, recv),
            "reduce" => h.reduce_into(&send, recv, redop, root),
            "sendrecv" => {
                if n == 1 {
                    recv.copy_from_slice(&send);
                    return Ok(());
                }
                let w = h.send_async(send.clone(), right, 0);
                h.recv(recv, left, 0)?;
                w.wait().map(|_| ())
            }
            _ => unreachable!("checked in main"),
        }
    };
    let mut iters = if bytes > 1 << 20 { (args.iters / 4).max(5) } else { args.iters };
    let warm = Instant::now();
    for _ in 0..args.warmup {
        once(&mut recv)?;
    }
    let min_ms = args.min_ms.unwrap_or(if args.report_auto { 5.0 } else { 0.0 });
    if min_ms > 0.0 && args.warmup > 0 {
        // Enough iterations that one measurement lasts --min-ms, from the slowest rank's
        // warm-up (so every rank runs the same number).
        let mut per = [warm.elapsed().as_secs_f64() / args.warmup as f64];
        comm.all_reduce(&mut per, ReduceOp::Max)?;
        let want = (min_ms * 1e-3 / per[0].max(1e-9)).ceil() as usize;
        iters = iters.max(want.min(20_000));
    }
    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        once(&mut recv)?;
    }
    let mut secs = [t.elapsed().as_secs_f64() / iters as f64];
    comm.all_reduce(&mut secs, ReduceOp::Max)?;
    let wrong = if args.check { count_wrong(&recv, op, redop, n, r, root, block, left) } else { 0 };
    let mut w = [wrong as i64];
    comm.all_reduce(&mut w, ReduceOp::Sum)?;
    let algbw = bytes as f64 / secs[0] / 1e9;
    let factor = match op {
        "all_reduce" => 2.0 * (n as f64 - 1.0) / n as f64,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n as f64 - 1.0) / n as f64,
        _ => 1.0,
    };
    let reduces = matches!(op, "all_reduce" | "reduce_scatter" | "reduce");
    let chosen = OpKind::parse(op).and_then(|k| h.algo_for(k, bytes).ok()).filter(|_| n > 1);
    Ok(Row {
        op,
        forced: h.algo(),
        chosen,
        bytes,
        count,
        dtype: T::DTYPE,
        redop: reduces.then_some(redop),
        root: matches!(op, "broadcast" | "reduce").then_some(root),
        us: secs[0] * 1e6,
        algbw,
        busbw: algbw * factor,
        wrong: w[0] as u64,
    })
}

/// Wrong elements of this rank's result, against `verify`'s exact expectations.
#[allow(clippy::too_many_arguments)]
fn count_wrong<T: Num>(
    recv: &[T],
    op: &str,
    redop: ReduceOp,
    n: usize,
    r: usize,
    root: usize,
    block: usize,
    left: usize,
) -> usize {
    let d = T::DTYPE;
    let b = block.max(1);
    match op {
        "all_reduce" => verify::count_wrong(recv, |i| verify::reduced(d, redop, n, i)),
        "reduce" if r == root => verify::count_wrong(recv, |i| verify::reduced(d, redop, n, i)),
        "reduce" => 0,
        "reduce_scatter" => verify::count_wrong(recv, |i| verify::reduced(d, redop, n, r * block + i)),
        "all_gather" => verify::count_wrong(recv, |i| verify::input(d, redop, i / b, i % b)),
        "broadcast" => verify::count_wrong(recv, |i| verify::input(d, redop, root, i)),
        "all_to_all" => verify::count_wrong(recv, |i| verify::input(d, redop, i / b, r * block + i % b)),
        "sendrecv" => verify::count_wrong(recv, |i| verify::input(d, redop, left, i)),
        _ => 0,
    }
}
