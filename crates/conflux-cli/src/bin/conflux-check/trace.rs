//! Jobs with a known shape for the trace tests (run with `CONFLUX_TRACE=DIR`): the report of
//! each must find what the scenario built in. Every result is still checked, on a sample of
//! elements inside the steps (so checking does not count as computation the test cannot
//! predict) and in full after the last step.

use std::process::ExitCode;
use std::time::Duration;

use conflux::{Communicator, ReduceOp};

use super::Checker;

/// Rank r's element i; their sum over n ranks is `n(n+1)/2 · (i % 7 + 1)`, exact in f32.
fn fill(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((rank + 1) * (i % 7 + 1)) as f32).collect()
}

fn check(c: &mut Checker, what: &str, buf: &[f32], n: usize, every: usize) {
    let tri = (n * (n + 1) / 2) as f32;
    let wrong = (0..buf.len())
        .step_by(every.max(1))
        .chain(buf.len().saturating_sub(1)..buf.len())
        .find(|&i| buf[i] != tri * (i % 7 + 1) as f32)
        .map(|i| (i, f64::from(buf[i]), f64::from(tri * (i % 7 + 1) as f32)));
    c.expect(what, wrong);
}

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `trace-steps SLOW_RANK SLOW_MS BASE_MS STEPS ELEMS`: each step every rank computes (sleeps)
/// BASE_MS, SLOW_RANK SLOW_MS, then all_reduces ELEMS floats: SLOW_RANK arrives last at every
/// collective, SLOW_MS − BASE_MS late. The reduction is a maximum, so the buffer needs no
/// refill between steps and the sleep is all of a step's computation.
pub(crate) fn scenario_steps(comm: Communicator, args: &[String]) -> Checker {
    let (slow, slow_ms, base_ms) = (arg(args, 1, 2) as usize, arg(args, 2, 7), arg(args, 3, 4));
    let (steps, elems) = (arg(args, 4, 30), arg(args, 5, 1 << 20) as usize);
    let (r, n) = (comm.rank(), comm.size());
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let mut buf = fill(r, elems);
    for step in 0..steps {
        c.comm.mark_step();
        std::thread::sleep(Duration::from_millis(if r == slow { slow_ms } else { base_ms }));
        if c.ok(&format!("step {step} all_reduce"), c.comm.all_reduce(&mut buf, ReduceOp::Max)) {
            check_max(&mut c, &format!("step {step} all_reduce"), &buf, n, 4099);
        }
    }
    c.comm.mark_step();
    check_max(&mut c, "last all_reduce, every element", &buf, n, 1);
    c
}

/// The maximum of `fill` over n ranks is rank n − 1's.
fn check_max(c: &mut Checker, what: &str, buf: &[f32], n: usize, every: usize) {
    let want = |i: usize| (n * (i % 7 + 1)) as f32;
    let wrong = (0..buf.len())
        .step_by(every.max(1))
        .chain(buf.len().saturating_sub(1)..buf.len())
        .find(|&i| buf[i] != want(i))
        .map(|i| (i, f64::from(buf[i]), f64::from(want(i))));
    c.expect(what, wrong);
}

/// `trace-overlap STEPS ELEMS COMPUTE_MS`: each step starts an all_reduce of ELEMS floats,
/// computes (sleeps) COMPUTE_MS, which hides the transfer, then waits for it.
pub(crate) fn scenario_overlap(comm: Communicator, args: &[String]) -> Checker {
    let (steps, elems, compute_ms) = (arg(args, 1, 10), arg(args, 2, 1 << 20) as usize, arg(args, 3, 40));
    let (r, n) = (comm.rank(), comm.size());
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let mut last = Vec::new();
    for step in 0..steps {
        c.comm.mark_step();
        let work = c.comm.all_reduce_async(fill(r, elems), ReduceOp::Sum);
        std::thread::sleep(Duration::from_millis(compute_ms));
        if let Some(buf) = c.ok_value(&format!("step {step} async all_reduce"), work.wait()) {
            check(&mut c, &format!("step {step} async all_reduce"), &buf, n, 4099);
            last = buf;
        }
    }
    c.comm.mark_step();
    check(&mut c, "last async all_reduce, every element", &last, n, 1);
    c
}

/// `trace-kill VICTIM AFTER`: steps of a 2 ms sleep and a small all_reduce; at step AFTER rank
/// VICTIM kills itself (SIGKILL). The others must fail naming it, and return normally, so
/// their traces are closed as any program's would be.
pub(crate) fn scenario_kill(comm: Communicator, args: &[String]) -> ExitCode {
    let (victim, after) = (arg(args, 1, 2) as usize, arg(args, 2, 10));
    let r = comm.rank();
    for step in 0..10 * after + 100 {
        comm.mark_step();
        if r == victim && step == after {
            let me = std::process::id().to_string();
            let _ = std::process::Command::new("kill").args(["-KILL", &me]).status();
        }
        std::thread::sleep(Duration::from_millis(2));
        let mut buf = fill(r, 1000);
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Sum) {
            let named = e.peer() == Some(victim) || e.to_string().contains(&format!("rank {victim}"));
            println!("rank {r}: KILL-SEEN at step {step} (names the victim: {named}): {e}");
            return if named { ExitCode::SUCCESS } else { ExitCode::from(1) };
        }
    }
    println!("rank {r}: every all_reduce succeeded although rank {victim} was killed");
    ExitCode::from(1)
}
