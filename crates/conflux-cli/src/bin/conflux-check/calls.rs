//! `conflux-check calls KIND`: rank 1 makes a call that differs from the other ranks' in one
//! respect (KIND: op, root, dtype, redop, count, inline, inline_bound, gather, gather_bound,
//! scatter, alltoall, alltoall_bound, alltoall_algo, algo).
//! Every rank must fail — in that call or,
//! if its own part of it could finish (a broadcast root), in the next — within seconds, with
//! an error that shows both calls; nobody may hang or return a wrong answer.
//!
//! KIND `stashed`: the mismatched call's message reaches rank 1 while rank 1 has a
//! point-to-point receive from the sender posted, which reads it aside first (see
//! `scenario_stashed`).

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
        // Inline both, in two lines of the inline block on one side and one on the other
        // (algo/direct/mod.rs, Inline); then inline on one side only (at most 328 bytes inline).
        ("inline", true) => comm.all_reduce(&mut f[..13], ReduceOp::Sum),
        ("inline", false) => comm.all_reduce(&mut f[..12], ReduceOp::Sum),
        ("inline_bound", true) => comm.all_reduce(&mut f[..83], ReduceOp::Sum),
        ("inline_bound", false) => comm.all_reduce(&mut f[..82], ReduceOp::Sum),
        // Another block size: inline both (7 against 6 floats a rank), inline on one side only
        // (83 against 82), and through the slots.
        ("gather" | "gather_bound", _) => {
            let per = match (kind, odd) {
                ("gather", true) => 7,
                ("gather", false) => 6,
                (_, true) => 83,
                (_, false) => 82,
            };
            comm.all_gather(&f[..per], &mut vec![0f32; per * comm.size()])
        }
        // all_to_all of 5 against 6 floats a block (inline both, direct with equal blocks),
        // of 28 against 27 at 3 ranks (through the slots against inline), and direct against
        // pairwise.
        ("alltoall" | "alltoall_bound", _) => {
            let per = match (kind, odd) {
                ("alltoall", true) => 6,
                ("alltoall", false) => 5,
                (_, true) => 28,
                (_, false) => 27,
            };
            comm.all_to_all(&f[..per * comm.size()], &mut vec![0f32; per * comm.size()])
        }
        ("alltoall_algo", _) => {
            let algo = if odd { Algo::Pairwise } else { Algo::Direct };
            comm.with_algo(Some(algo)).all_to_all(&f[..6 * comm.size()], &mut vec![0f32; 6 * comm.size()])
        }
        ("scatter", _) => {
            let per = if odd { 301 } else { 300 };
            comm.reduce_scatter(&f[..per * comm.size()], &mut vec![0f32; per], ReduceOp::Sum)
        }
        ("algo", true) => comm.with_algo(Some(Algo::Ring)).all_reduce(&mut f, ReduceOp::Sum),
        ("algo", false) => comm.with_algo(Some(Algo::Rd)).all_reduce(&mut f, ReduceOp::Sum),
        ("stashed", _) => scenario_stashed(&comm, &mut f),
        (_, _) => comm.all_reduce(&mut f, ReduceOp::Sum),
    });
    let (err, when) = match first {
        Err(e) => (e, "in the call"),
        // Its part could finish: the failure must reach it at the next call.
        Ok(()) => match comm.all_reduce(&mut f, ReduceOp::Sum) {
            Err(e) => (e, "in the next call"),
            Ok(()) => {
                println!("rank {r}: two calls after a mismatched one succeeded");
                return ExitCode::from(1);
            }
        },
    };
    println!("rank {r}: CALL-MISMATCH {when}, after {:.2}s: {err}", t.elapsed().as_secs_f64());
    // Returning shuts the communicator down: rank 0, which serves the store, relays its own
    // report and waits for the others' goodbyes before it exits.
    ExitCode::SUCCESS
}

/// Rank 0 reduces to rank 1 with max and then sends it a tag-7 message; rank 1 has posted the
/// tag-7 receive, waits until rank 0's part is surely sent, and reduces with sum. Its posted
/// receive reads rank 0's reduce message aside (it comes first); the reduce must still compare
/// that message's call with its own. (Other ranks, if any, only make the reduce rank 1 makes.)
fn scenario_stashed(comm: &Communicator, f: &mut [f32]) -> conflux::Result<()> {
    match comm.rank() {
        0 => {
            comm.reduce(f, ReduceOp::Max, 1)?;
            comm.send(&[7f32; 4], 1, 7)
        }
        1 => {
            let seven = comm.recv_async(vec![0f32; 4], 0, 7);
            std::thread::sleep(std::time::Duration::from_millis(300));
            comm.reduce(f, ReduceOp::Sum, 1)?;
            seven.wait().map(|_| ())
        }
        _ => comm.reduce(f, ReduceOp::Sum, 1),
    }
}
