//! Synthetic traces for the tests: ranks' records built directly, no processes.

use conflux::trace::meta::{Clock, CommInfo, Meta, ThreadInfo, FORMAT, VERSION};
use conflux::trace::{Op, OpRecord, RankTrace, StepMark, WaitRecord};
use conflux::{Algo, DataType, OpKind};

/// Milliseconds as nanoseconds.
pub fn ms(v: f64) -> i64 {
    (v * 1e6).round() as i64
}

/// An empty trace of global `rank` in a job of `world`, one communicator of every rank.
pub fn rank(rank: usize, world: usize) -> RankTrace {
    let meta = Meta {
        format: FORMAT.into(),
        version: VERSION,
        rank,
        world_size: world,
        pid: 1000 + rank as u32,
        host: "node<1>&".into(),
        clock: Clock::same_host(),
        comms: vec![CommInfo { id: 0, name: "conflux".into(), ranks: (0..world).collect(), rank, link: "shm".into() }],
        threads: vec![ThreadInfo { id: 0, name: "main".into() }],
        dropped: 0,
    };
    RankTrace { meta, ops: Vec::new(), waits: Vec::new(), steps: Vec::new(), skipped: 0 }
}

/// Appends an all_reduce of 1000 bytes with call number `seq`; returns its id.
pub fn all_reduce(r: &mut RankTrace, seq: u64, is_async: bool, issued: i64, started: i64, ended: i64) -> u64 {
    push(r, Op::Coll(OpKind::AllReduce), seq, is_async, issued, started, ended)
}

/// Appends an operation on communicator 0, lane 0, thread 0; returns its id.
pub fn push(r: &mut RankTrace, op: Op, seq: u64, is_async: bool, issued: i64, started: i64, ended: i64) -> u64 {
    let id = r.ops.len() as u64;
    r.ops.push(OpRecord {
        id,
        op,
        dtype: Some(DataType::F32),
        algo: op.is_collective().then_some(Algo::Ring),
        comm: 0,
        lane: 0,
        seq,
        bytes: 1000,
        peer: (!op.is_collective()).then_some(0),
        thread: 0,
        is_async,
        failed: false,
        issued,
        started,
        ended,
    });
    id
}

pub fn wait(r: &mut RankTrace, op: u64, began: i64, ended: i64) {
    r.waits.push(WaitRecord { op, thread: 0, began, ended });
}

pub fn mark(r: &mut RankTrace, step: u64, at: i64) {
    r.steps.push(StepMark { step, thread: 0, at });
}

/// Four ranks, `n` closed steps of 10 ms. In each, every rank computes, then calls a blocking
/// all_reduce: ranks 0, 1 and 3 at 5 ms, rank 2 at 8 ms (3 ms late); all end at 9 ms.
/// So ranks 0, 1, 3 are blocked 4 ms (3 waiting, 1 transfer: share 40%), rank 2 1 ms (10%).
pub fn straggling(n: u64) -> Vec<RankTrace> {
    (0..4)
        .map(|ri| {
            let mut r = rank(ri, 4);
            for k in 0..n {
                let s = ms(10.0 * k as f64);
                mark(&mut r, k, s);
                let arrive = s + ms(if ri == 2 { 8.0 } else { 5.0 });
                all_reduce(&mut r, k, false, arrive, arrive, s + ms(9.0));
            }
            mark(&mut r, n, ms(10.0 * n as f64));
            r
        })
        .collect()
}
