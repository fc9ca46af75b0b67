//! `conflux-check shrink VICTIM`: rank VICTIM SIGKILLs itself in the middle of a run of
//! all_reduces; the survivors fail, `shrink()` to a communicator of themselves (renumbered, in
//! order), and run 100 more collectives (all_reduce, broadcast from every root, all_gather),
//! each checked against the value computed here.

use std::process::ExitCode;

use conflux::{Communicator, ReduceOp};

fn value(rank: usize, i: usize, j: usize) -> f32 {
    ((rank + 1) * 1000 + (i * 31 + j) % 97) as f32
}

/// The 100 collectives on the shrunk communicator; the first wrong one, if any.
fn after(comm: &Communicator) -> Result<(), String> {
    let (n, r) = (comm.size(), comm.rank());
    let len = 1000;
    for i in 0..100 {
        let mut buf: Vec<f32> = (0..len).map(|j| value(r, i, j)).collect();
        let (what, want): (&str, Box<dyn Fn(usize) -> f32>) = match i % 3 {
            0 => {
                comm.all_reduce(&mut buf, ReduceOp::Sum).map_err(|e| format!("#{i} all_reduce: {e}"))?;
                ("all_reduce", Box::new(move |j| (0..n).map(|k| value(k, i, j)).sum()))
            }
            1 => {
                let root = i % n;
                comm.broadcast(&mut buf, root).map_err(|e| format!("#{i} broadcast: {e}"))?;
                ("broadcast", Box::new(move |j| value(root, i, j)))
            }
            _ => {
                let mut all = vec![0f32; len * n];
                comm.all_gather(&buf, &mut all).map_err(|e| format!("#{i} all_gather: {e}"))?;
                buf = all;
                ("all_gather", Box::new(move |j| value(j / len, i, j % len)))
            }
        };
        if let Some(j) = (0..buf.len()).find(|&j| buf[j] != want(j)) {
            return Err(format!("#{i} {what}: element {j} is {}, expected {}", buf[j], want(j)));
        }
    }
    Ok(())
}

pub(crate) fn scenario_shrink(comm: Communicator, victim: usize) -> ExitCode {
    let r = comm.rank();
    let mut buf = vec![1f32; 1 << 16];
    for i in 0.. {
        if r == victim && i == 20 {
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        }
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Sum) {
            println!("rank {r}: failed as expected: {e}");
            break;
        }
        buf.iter_mut().for_each(|x| *x = 1.0);
    }
    let small = match comm.shrink() {
        Ok(c) => c,
        Err(e) => {
            println!("rank {r}: shrink failed: {e}");
            return ExitCode::from(1);
        }
    };
    let ranks = small.world_ranks().to_vec();
    match after(&small) {
        Ok(()) => {
            println!(
                "rank {r}: SHRUNK to {} ranks {ranks:?} as rank {}: 100 collectives correct",
                small.size(),
                small.rank()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("rank {r}: after shrinking to {ranks:?}: {e}");
            ExitCode::from(1)
        }
    }
}
