//! `conflux-check cut VICTIM` (inside a network namespace, as root): after a few collectives
//! rank VICTIM takes its host's link down (`ip link set eth0 down`) while the others are in an
//! all_reduce: a host that vanished without closing anything. The others must fail within the
//! keep-alive window, naming it, not at their deadline.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use conflux::{Communicator, ReduceOp};

pub(crate) fn scenario_cut(comm: Communicator, victim: usize) -> ExitCode {
    let r = comm.rank();
    let mut buf = match super::warm_up(&comm, 1 << 16, 5) {
        Ok(b) => b,
        Err(code) => return code,
    };
    if r == victim {
        // Let the others enter the next all_reduce first.
        std::thread::sleep(Duration::from_millis(300));
        let cut = std::process::Command::new("ip").args(["link", "set", "eth0", "down"]).status();
        println!("rank {r}: CUT ({cut:?})");
        // Silent from now on, like a host that lost power; exit before the launcher's grace ends.
        std::thread::sleep(Duration::from_secs(20));
        std::process::exit(0);
    }
    let t = Instant::now();
    let err = loop {
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Sum) {
            break e;
        }
    };
    let secs = t.elapsed().as_secs_f64();
    println!("rank {r}: CUT-DETECTED after {secs:.2}s: {err}");
    std::process::exit(if err.peer() == Some(victim) { 0 } else { 1 })
}
