//! Jobs started the way Slurm's srun and Open MPI's mpirun start them: each rank gets only
//! that launcher's variables (no RANK, WORLD_SIZE, MASTER_*), and `Communicator::from_env`
//! finds its rank, the job's size and the store from them.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);
/// torchrun's variables, which would win over the launcher's: never inherited here.
const TORCHRUN: &[&str] = &["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"];

/// Runs `conflux-check quick` at `n` ranks, rank r with `vars(r)` only, and asserts every
/// rank passed every check.
fn job_with(n: usize, vars: impl Fn(usize) -> Vec<(String, String)>) {
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(CHECK);
            cmd.arg("quick").env("CONFLUX_TIMEOUT_S", "60");
            for v in TORCHRUN {
                cmd.env_remove(v);
            }
            cmd.envs(vars(r)).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect();
    let outs: Vec<_> = children.into_iter().map(|c| wait_output(c, LIMIT).0).collect();
    for (r, out) in outs.iter().enumerate() {
        let t = text(out);
        assert!(out.status.success(), "rank {r} failed ({}):\n{t}", out.status);
        assert!(t.contains(" passed, 0 failed"), "rank {r} did not pass its checks:\n{t}");
    }
}

fn pairs(v: &[(&str, String)]) -> Vec<(String, String)> {
    v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

#[test]
fn srun_variables_alone_start_a_job() {
    // The store's port comes from the job id (20000 + id mod 10000): pick an id whose port is free.
    let port = free_port() as usize;
    let job_id = if (20000..30000).contains(&port) { port - 20000 + 5_550_000 } else { 0 };
    let n = 3;
    job_with(n, |r| {
        let mut v = pairs(&[
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_NTASKS", n.to_string()),
            ("SLURM_STEP_NUM_TASKS", n.to_string()),
            ("SLURM_JOB_NODELIST", "localhost".into()),
        ]);
        if job_id != 0 {
            v.push(("SLURM_JOB_ID".into(), job_id.to_string()));
        } else {
            v.push(("MASTER_PORT".into(), port.to_string()));
        }
        v
    });
}

#[test]
fn open_mpi_variables_alone_start_a_job() {
    let port = free_port().to_string();
    let n = 2;
    job_with(n, |r| {
        pairs(&[
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", n.to_string()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            ("MASTER_PORT", port.clone()),
        ])
    });
}

/// The real mpirun, when this machine has Open MPI (../shared/peers installs it); without it the
/// test says it was skipped.
#[test]
fn mpirun_starts_a_job() {
    let has_mpirun =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("mpirun").is_file()));
    if !has_mpirun {
        println!("skipped: no mpirun on PATH");
        return;
    }
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", "2", CHECK, "quick"]);
    for v in TORCHRUN {
        cmd.env_remove(v);
    }
    let out = wait_output(
        cmd.env("CONFLUX_TIMEOUT_S", "60").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(),
        LIMIT,
    )
    .0;
    assert_all_passed(&out, 2);
}
