//! Starting real rank processes for the integration tests: through `conflux run`, the way
//! users start jobs, or one by one with torchrun's variables when a test must control each
//! rank (killing one, giving each its own node id).

#![allow(dead_code)]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const CHECK: &str = env!("CARGO_BIN_EXE_conflux-check");
pub const CONFLUX: &str = env!("CARGO_BIN_EXE_conflux");

pub fn free_port() -> u16 {
    conflux_cli::launch::free_port("127.0.0.1").unwrap()
}

/// Waits for a child at most `limit`, killing it past that so that a hang fails the test.
pub fn wait_output(mut child: Child, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (out, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "process did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `conflux run -n N -- conflux-check ARGS` with extra environment; returns its output.
pub fn run_job(n: usize, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(CONFLUX);
    cmd.arg("run").arg("-n").arg(n.to_string()).arg("--").arg(CHECK).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_output(child, limit).0
}

/// Runs `conflux-check SCENARIO` as a job of `n` over `transport` and asserts every check passed.
pub fn run_checks(n: usize, scenario: &str, transport: &str, timeout_s: &str, limit: Duration) {
    let out = run_job(n, &[scenario], &[("CONFLUX_TRANSPORT", transport), ("CONFLUX_TIMEOUT_S", timeout_s)], limit);
    assert_all_passed(&out, n);
}

/// Asserts that a job ran every rank's checks and none failed.
pub fn assert_all_passed(out: &Output, n: usize) {
    let t = text(out);
    assert!(out.status.success(), "job failed ({}):\n{t}", out.status);
    let summaries: Vec<&str> = t.lines().filter(|l| l.contains(" passed, ")).collect();
    assert_eq!(summaries.len(), n, "expected one summary per rank:\n{t}");
    for s in summaries {
        assert!(s.contains(", 0 failed"), "a rank failed checks:\n{t}");
        let passed: usize = s.split(": ").last().unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(passed > 0, "a rank checked nothing:\n{t}");
    }
}

/// Starts `n` ranks of `conflux-check ARGS` directly, rank r with `env(r)` added.
pub fn spawn_ranks(n: usize, args: &[&str], env: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Child> {
    let port = free_port().to_string();
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(CHECK);
            cmd.args(args)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port);
            for (k, v) in env(r) {
                cmd.env(k, v);
            }
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
        })
        .collect()
}

pub fn shm_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}
