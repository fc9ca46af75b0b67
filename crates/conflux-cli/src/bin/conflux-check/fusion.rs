//! Fusion and priorities: coalesced all_reduce, the gradient Bucketer against per-tensor
//! all_reduce, and a high-priority operation overtaking a large normal one.

use std::time::Instant;

use conflux::{Communicator, Priority, ReduceOp};
use conflux_cli::verify;

use super::Checker;

/// Tensor lengths shaped like a small transformer's parameters, with odd sizes mixed in, and
/// runs of small ones both sides of tensors over 1 MiB (which the ring reduces unstaged).
const LENGTHS: [usize; 17] =
    [768, 768, 2304, 768 * 3, 65537, 1, 0, 3072, 300_001, 768 * 40, 7, 768, 768, 50000, 262_144, 270_000, 12];

/// A rank's gradient values: not exactly representable sums, so a different reduction order
/// would show in the bits.
fn grad(rank: usize, t: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((rank * 31 + t * 7 + i) as f32 * 0.37).sin() * 1.7).collect()
}

pub fn scenario_fusion(comm: Communicator, bitwise: bool) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let (n, r) = (c.comm.size(), c.comm.rank());

    // Coalesced, against an exact reference on integer inputs.
    let mut bufs: Vec<Vec<i32>> = LENGTHS.iter().enumerate().map(|(t, &l)| vec![(r + t) as i32; l]).collect();
    let mut views: Vec<&mut [i32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let res = c.comm.all_reduce_coalesced(&mut views, ReduceOp::Sum);
    if c.ok("all_reduce_coalesced", res) {
        for (t, b) in bufs.iter().enumerate() {
            let want = (0..n).map(|q| q + t).sum::<usize>() as f64;
            c.expect(&format!("all_reduce_coalesced tensor {t}"), verify::first_wrong(b, |_| want));
        }
    }

    for op in [ReduceOp::Sum, ReduceOp::Avg] {
        // Per tensor, one all_reduce each: the reference.
        let mut single: Vec<Vec<f32>> = LENGTHS.iter().enumerate().map(|(t, &l)| grad(r, t, l)).collect();
        for (t, g) in single.iter_mut().enumerate() {
            let res = c.comm.all_reduce(g, op);
            c.ok(&format!("per-tensor all_reduce {t}"), res);
        }
        // Bucketed, with buckets small enough that several are in flight at once.
        let mut grads: Vec<Vec<f32>> = LENGTHS.iter().enumerate().map(|(t, &l)| grad(r, t, l)).collect();
        let res = c.comm.bucketed(op, |b| {
            b.set_bucket_bytes(64 << 10);
            let mut launched_early = false;
            for g in grads.iter_mut() {
                b.push(g);
                launched_early |= b.buckets() > 0;
            }
            (launched_early, b.buckets())
        });
        let Ok((launched_early, buckets)) = res else {
            c.ok(&format!("bucketed ({op})"), res.map(|_| ()));
            continue;
        };
        if !launched_early || buckets < 3 {
            c.failed.push(format!("bucketed ({op}): {buckets} buckets, launched early: {launched_early}"));
        }
        for (t, (got, want)) in grads.iter().zip(&single).enumerate() {
            let what = format!("bucketed ({op}) tensor {t}");
            if bitwise {
                match got.iter().zip(want).position(|(x, y)| x.to_bits() != y.to_bits()) {
                    None => c.passed += 1,
                    Some(i) => c.failed.push(format!("{what}: element {i} is {}, per-tensor gave {}", got[i], want[i])),
                }
            } else {
                // Another reduction order (ring blocks): equal to rounding.
                let far = got.iter().zip(want).position(|(x, y)| (x - y).abs() > 1e-5 * (1.0 + y.abs()));
                match far {
                    None => c.passed += 1,
                    Some(i) => c.failed.push(format!("{what}: element {i} is {}, per-tensor gave {}", got[i], want[i])),
                }
            }
        }
    }
    c
}

/// A small high-priority all_reduce issued after a large normal one finishes first; a small
/// normal one issued after it does not (issue order within a priority is kept).
pub fn scenario_priority(comm: Communicator, big_elems: usize) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let n = c.comm.size();
    let urgent = c.comm.with_priority(Priority::High);
    for round in 0..2 {
        let big = c.comm.all_reduce_async(vec![1.0f32; big_elems], ReduceOp::Sum);
        let t = Instant::now();
        let mut small = vec![2i64; 16];
        let res = urgent.all_reduce(&mut small, ReduceOp::Sum);
        let small_done = t.elapsed();
        let big_was_done = big.is_completed();
        if c.ok("high-priority all_reduce", res) {
            c.expect("high-priority all_reduce", verify::first_wrong(&small, |_| 2.0 * n as f64));
        }
        // The normal lane keeps issue order: this one completes only after the big one.
        let after = c.comm.all_reduce_async(vec![3u8; 4], ReduceOp::Max);
        match after.wait() {
            Ok(v) => c.expect("normal all_reduce after the big one", verify::first_wrong(&v, |_| 3.0)),
            Err(e) => c.failed.push(format!("normal all_reduce after the big one: {e}")),
        }
        if !big.is_completed() {
            c.failed.push("a normal operation completed before one issued earlier".into());
        }
        match big.wait() {
            Ok(v) => c.expect("big normal all_reduce", verify::first_wrong(&v, |_| n as f64)),
            Err(e) => c.failed.push(format!("big normal all_reduce: {e}")),
        }
        let total = t.elapsed();
        if big_was_done {
            c.failed.push(format!(
                "round {round}: high-priority all_reduce took {small_done:?} and finished after the big one ({total:?})"
            ));
        } else {
            c.passed += 1;
        }
        println!(
            "rank {}: priority round {round}: small high-priority op {:.2} ms, big normal op {:.1} ms",
            c.comm.rank(),
            small_done.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3
        );
    }
    // Both lanes under one communicator survive interleaved async use.
    let w1 = urgent.all_reduce_async(vec![1i32; 1000], ReduceOp::Sum);
    let w0 = c.comm.all_reduce_async(vec![1i32; 1000], ReduceOp::Sum);
    for (what, w) in [("high lane async", w1), ("normal lane async", w0)] {
        match w.wait() {
            Ok(v) => c.expect(what, verify::first_wrong(&v, |_| n as f64)),
            Err(e) => c.failed.push(format!("{what}: {e}")),
        }
    }
    c
}
