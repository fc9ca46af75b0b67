//! `conflux-check stuck VICTIM`: after a few collectives rank VICTIM stops itself with a real
//! SIGSTOP (it neither exits nor answers) while the others enter one more. They must fail at
//! their deadline naming it, each with its flight recorder on stderr.

use std::process::ExitCode;
use std::time::Instant;

use conflux::{Communicator, ReduceOp};

pub(crate) fn scenario_stuck(comm: Communicator, victim: usize) -> ExitCode {
    let r = comm.rank();
    let mut buf = match super::warm_up(&comm, 1000, 5) {
        Ok(b) => b,
        Err(code) => return code,
    };
    if r == victim {
        println!("rank {r}: stopping");
        let me = std::process::id().to_string();
        let stopped = std::process::Command::new("kill").args(["-STOP", &me]).status();
        // Reached only once someone sends SIGCONT.
        println!("rank {r}: continued ({stopped:?})");
        return ExitCode::SUCCESS;
    }
    let t = Instant::now();
    match comm.all_reduce(&mut buf, ReduceOp::Sum) {
        Ok(()) => {
            println!("rank {r}: an all_reduce without rank {victim} succeeded");
            ExitCode::from(1)
        }
        Err(e) => {
            println!("rank {r}: STUCK-DETECTED after {:.2}s: {e}", t.elapsed().as_secs_f64());
            // The victim never says goodbye: do not wait for it at shutdown.
            std::process::exit(0)
        }
    }
}
