//! The `conflux` command: `run` starts a job's ranks, `bench` measures collectives.

use clap::{Parser, Subcommand};
use conflux_cli::{bench, run};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "conflux", version, about = "Collective communication for CPU processes")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N ranks of a program with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...).
    Run(run::RunArgs),
    /// nccl-tests-style bandwidth and latency tables for one collective or all of them.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    conflux_cli::init_logging();
    match Cli::parse().command {
        Cmd::Run(a) => run::main(a),
        Cmd::Bench(a) => bench::main(a),
    }
}
