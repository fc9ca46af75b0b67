//! `conflux run`: a torchrun-compatible launcher for one node of a job.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::launch::{launch, LaunchError, LaunchSpec};

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Ranks on this node.
    #[arg(short = 'n', long = "nproc-per-node", visible_alias = "nproc_per_node", default_value_t = 1)]
    pub nproc_per_node: usize,
    /// Nodes in the job; each runs its own `conflux run`.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This node's index, 0..nnodes.
    #[arg(long = "node-rank", visible_alias = "node_rank", default_value_t = 0)]
    pub node_rank: usize,
    /// Where rank 0 serves the job's store.
    #[arg(long = "master-addr", visible_alias = "master_addr", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The store's port: a free one when there is one node, else 29500.
    #[arg(long = "master-port", visible_alias = "master_port")]
    pub master_port: Option<u16>,
    /// Accepted for torchrun compatibility: a one-node job is always standalone here.
    #[arg(long)]
    pub standalone: bool,
    /// Do not prefix output lines with "[rank]: ".
    #[arg(long)]
    pub no_prefix: bool,
    /// The program (a .py file runs under python3) and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

pub fn main(args: RunArgs) -> ExitCode {
    let mut command = args.command.into_iter();
    let Some(program) = command.next() else {
        eprintln!("conflux run: no program given");
        return ExitCode::from(2);
    };
    let spec = LaunchSpec {
        nproc_per_node: args.nproc_per_node,
        nnodes: args.nnodes,
        node_rank: args.node_rank,
        master_addr: args.master_addr,
        master_port: args.master_port,
        program: PathBuf::from(program),
        args: command.collect(),
        extra_env: Vec::new(),
        prefix_output: !args.no_prefix,
    };
    match launch(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ LaunchError::Invalid(_)) => {
            eprintln!("conflux run: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("conflux run: {e}");
            ExitCode::from(1)
        }
    }
}
