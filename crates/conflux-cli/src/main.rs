//! The `conflux` command: `run` starts a job's ranks, `bench` measures collectives,
//! `tune` fits the cost model to this machine, `doctor` checks every pair of ranks' link,
//! `soak` runs random collectives for a while and checks every result, `trace` reads what
//! `CONFLUX_TRACE` recorded.

use clap::{Parser, Subcommand};
use conflux_cli::{bench, doctor, run, soak, trace, tune};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "conflux", version, about = "Collective communication for CPU processes")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

// Parsed once per process: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Start N ranks of a program with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...).
    Run(run::RunArgs),
    /// nccl-tests-style bandwidth and latency tables for one collective or all of them.
    Bench(bench::BenchArgs),
    /// Measure the cost model's parameters on this machine and write the tuning file.
    Tune(tune::TuneArgs),
    /// Measure every pair of ranks' link (latency, bandwidth) and flag the slow ones.
    Doctor(doctor::DoctorArgs),
    /// Random collectives for a while, every result checked and memory watched.
    Soak(soak::SoakArgs),
    /// Read a CONFLUX_TRACE directory: `report` (costs, steps, straggler) or `merge` (Chrome trace).
    Trace(trace::TraceArgs),
}

#[allow(unsafe_code)]
fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a closed stdout (`conflux bench | head`) would be a panic in
    // every println. Like other command-line tools, end quietly instead.
    // SAFETY: called first thing in main, before any thread starts, with the default
    // disposition, which installs no handler; nothing else in the process depends on SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    conflux_cli::init_logging();
    match Cli::parse().command {
        Cmd::Run(a) => run::main(a),
        Cmd::Bench(a) => bench::main(a),
        Cmd::Tune(a) => tune::main(a),
        Cmd::Doctor(a) => doctor::main(a),
        Cmd::Soak(a) => soak::main(a),
        Cmd::Trace(a) => trace::main(a),
    }
}
