//! `conflux-check abort VICTIM`: rank VICTIM issues an all_reduce the others join only a
//! second later, and aborts its communicator from another thread 200 ms in. Its pending
//! operation must end at once (the time is printed), later ones must fail without waiting, and
//! the other ranks must fail naming the abort (in that all_reduce or the next), long before
//! their deadline.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use conflux::{Communicator, ReduceOp};

pub(crate) fn scenario_abort(comm: Communicator, victim: usize) -> ExitCode {
    let r = comm.rank();
    let mut buf = match super::warm_up(&comm, 1000, 1) {
        Ok(b) => b,
        Err(code) => return code,
    };
    if r != victim {
        std::thread::sleep(Duration::from_secs(1));
        let t = Instant::now();
        // The victim's part may have been posted before it aborted (the direct algorithm's
        // slot): then this call completes, correctly, and the next one must fail.
        let first = comm.all_reduce(&mut buf, ReduceOp::Sum);
        return match first.and_then(|()| comm.all_reduce(&mut buf, ReduceOp::Sum)) {
            Ok(()) => {
                println!("rank {r}: two all_reduces with an aborted rank succeeded");
                ExitCode::from(1)
            }
            Err(e) => {
                println!("rank {r}: PEER-SAW-ABORT after {:.3}s: {e}", t.elapsed().as_secs_f64());
                ExitCode::SUCCESS
            }
        };
    }
    let pending = comm.all_reduce_async(buf, ReduceOp::Sum);
    let aborter = comm.with_algo(None);
    let at = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        aborter.abort();
        Instant::now()
    });
    let result = pending.wait();
    let ended = Instant::now();
    let aborted_at = at.join().expect("the aborting thread");
    let Err(e) = result else {
        println!("rank {r}: the pending all_reduce succeeded after abort");
        return ExitCode::from(1);
    };
    let ms = ended.saturating_duration_since(aborted_at).as_secs_f64() * 1e3;
    println!("rank {r}: ABORT-UNBLOCKED in {ms:.1} ms: {e}");
    let t = Instant::now();
    let mut more = vec![0f32; 10];
    match comm.all_reduce(&mut more, ReduceOp::Sum) {
        Ok(()) => {
            println!("rank {r}: an all_reduce after abort succeeded");
            ExitCode::from(1)
        }
        Err(e) => {
            println!("rank {r}: FUTURE-FAILED in {:.1} ms: {e}", t.elapsed().as_secs_f64() * 1e3);
            ExitCode::SUCCESS
        }
    }
}
