//! `conflux trace`: reading what ranks recorded with `CONFLUX_TRACE=DIR`.
//!
//! - `conflux trace report DIR [--json] [--svg FILE]`: what each kind of collective cost, how
//!   much of each step was exposed communication (waiting for peers vs moving data), and
//!   which rank the others waited for.
//! - `conflux trace merge DIR -o FILE`: every rank's records as one Chrome trace-event file,
//!   for Perfetto or chrome://tracing.
//!
//! Exit status: 0, or 1 with a message when the directory holds no usable trace or an output
//! cannot be written.

use std::path::PathBuf;
use std::process::ExitCode;

use conflux::trace::RankTrace;

pub mod analyze;
pub mod intervals;
pub mod load;
pub mod merge;
pub mod report;
pub mod steps;
pub mod svg;

#[cfg(test)]
mod fixture;
#[cfg(test)]
mod tests;

/// `conflux trace`'s subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum TraceCmd {
    /// Per-operation costs, where step time went, and the straggler.
    Report(ReportArgs),
    /// One Chrome trace-event JSON file of every rank (Perfetto, chrome://tracing).
    Merge(MergeArgs),
}

/// `conflux trace`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    #[command(subcommand)]
    pub cmd: TraceCmd,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// The trace directory (what CONFLUX_TRACE named).
    pub dir: PathBuf,
    /// One JSON object on stdout instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Also draw the steps' timeline and each rank's time split as an SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct MergeArgs {
    /// The trace directory (what CONFLUX_TRACE named).
    pub dir: PathBuf,
    /// The Chrome trace file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

/// Everything the report and the drawing say, computed once.
pub struct Analysis {
    pub ranks: Vec<RankTrace>,
    pub instances: Vec<analyze::Instance>,
    /// `wait[rank index][op index]`, ns.
    pub wait: Vec<Vec<i64>>,
    pub sets: Vec<steps::RankSets>,
    pub ops: Vec<analyze::OpRow>,
    pub steps: steps::Steps,
    pub straggler: Option<analyze::Straggler>,
}

impl Analysis {
    pub fn of(ranks: Vec<RankTrace>) -> Analysis {
        let instances = analyze::instances(&ranks);
        let wait = analyze::waits_for_peers(&ranks, &instances);
        let sets: Vec<_> = ranks.iter().zip(&wait).map(|(r, w)| steps::rank_sets(r, w)).collect();
        let steps = steps::steps(&ranks, &sets);
        let ops = analyze::op_table(&ranks);
        let straggler = analyze::straggler(&ranks, &instances);
        Analysis { ranks, instances, wait, sets, ops, steps, straggler }
    }
}

pub fn main(args: TraceArgs) -> ExitCode {
    let run = match args.cmd {
        TraceCmd::Report(a) => run_report(&a),
        TraceCmd::Merge(a) => run_merge(&a),
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conflux trace: {e}");
            ExitCode::FAILURE
        }
    }
}

fn loaded(dir: &std::path::Path) -> Result<Vec<RankTrace>, String> {
    let (ranks, warnings) = load::load(dir)?;
    for w in warnings {
        eprintln!("conflux trace: warning: {w}");
    }
    Ok(ranks)
}

fn run_report(a: &ReportArgs) -> Result<(), String> {
    let an = Analysis::of(loaded(&a.dir)?);
    if let Some(path) = &a.svg {
        std::fs::write(path, svg::draw(&an)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if a.json {
        println!("{}", report::json(&an));
    } else {
        print!("{}", report::text(&an));
    }
    Ok(())
}

fn run_merge(a: &MergeArgs) -> Result<(), String> {
    let ranks = loaded(&a.dir)?;
    let cannot = |e: std::io::Error| format!("cannot write {}: {e}", a.output.display());
    let file = std::fs::File::create(&a.output).map_err(cannot)?;
    merge::write_chrome_trace(&ranks, &mut std::io::BufWriter::new(file)).map_err(cannot)?;
    eprintln!("conflux trace: wrote {} (open it in https://ui.perfetto.dev or chrome://tracing)", a.output.display());
    Ok(())
}
