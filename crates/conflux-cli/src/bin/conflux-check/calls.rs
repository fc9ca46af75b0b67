//! `conflux-check calls KIND`: rank 1 makes a call that differs from the other ranks' in one
//! respect (KIND: op, root, dtype, redop, count, algo). Every rank must fail — in that call or,
//! if its own part of it could finish (a broadcast root), in the next — within seconds, with
//! an error that shows both calls; nobody may hang or return a wrong answer.

use std::process::ExitCode;
use std::time::Instant;

use conflux::{Algo, Communicator, ReduceOp};

pub(crate) fn scenario_calls(comm: Communicator, kind: &str) -> ExitCode {
    let r = comm.rank();
    let odd = r == 1;
    let mut f = vec![1f32; 1000];
    let mut i = vec![1i32; 1000];
    let t = Instant::now();
    // One good call first, so the bad one is not the first of the communicator's sequence. It
    // may fail too: a rank still finishing it can hear of the mismatch from the store first.
    let first = comm.all_reduce(&mut f, ReduceOp::Sum).and_then(|()| match (kind, odd) {
        ("op", true) => comm.broadcast(&mut f, 1),
        ("root", _) => comm.broadcast(&mut f, usize::from(odd)),
        ("dtype", true) => comm.all_reduce(&mut i, ReduceOp::Sum),
        ("redop", true) => comm.all_reduce(&mut f, ReduceOp::Max),
        ("count", true) => comm.all_reduce(&mut f[..999], ReduceOp::Sum),
        ("algo", true) => comm.with_algo(Some(Algo::Ring)).all_reduce(&mut f, ReduceOp::Sum),
        ("algo", false) => comm.with_algo(Some(Algo::Rd)).all_reduce(&mut f, ReduceOp::Sum),
        (_, _) => comm.all_reduce(&mut f, ReduceOp::Sum),
    });
    let err = match first {
        Err(e) => e,
        // Its part could finish: the failure must reach it at the next call.
        Ok(()) => match comm.all_reduce(&mut f, ReduceOp::Sum) {
            Err(e) => e,
            Ok(()) => {
                println!("rank {r}: two calls after a mismatched one succeeded");
                return ExitCode::from(1);
            }
        },
    };
    println!("rank {r}: CALL-MISMATCH after {:.2}s: {err}", t.elapsed().as_secs_f64());
    // Returning shuts the communicator down: rank 0, which serves the store, relays its own
    // report and waits for the others' goodbyes before it exits.
    ExitCode::SUCCESS
}
