//! Training-step benchmarks: `conflux bench fusion` (one model's gradients all-reduced per
//! tensor, coalesced, and bucketed asynchronously) and `conflux bench overlap` (a matrix
//! multiply with the previous bucket's all_reduce running underneath).

use std::time::Instant;

use conflux::{Communicator, ReduceOp};

use super::{models, BenchArgs};

/// The slowest rank's time, in seconds.
fn slowest(comm: &Communicator, secs: f64) -> conflux::Result<f64> {
    let mut s = [secs];
    comm.all_reduce(&mut s, ReduceOp::Max)?;
    Ok(s[0])
}

/// Times `step` (after `warmup` untimed runs) and returns the slowest rank's mean in seconds.
fn time_steps(
    comm: &Communicator,
    warmup: usize,
    iters: usize,
    mut step: impl FnMut() -> conflux::Result<()>,
) -> conflux::Result<f64> {
    // Each step is marked for the trace (CONFLUX_TRACE), whose report breaks it down.
    for _ in 0..warmup {
        comm.mark_step();
        step()?;
    }
    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        comm.mark_step();
        step()?;
    }
    comm.mark_step();
    slowest(comm, t.elapsed().as_secs_f64() / iters as f64)
}

/// Wrong elements, summed over ranks, when every rank's tensors hold rank + 1 (sum known).
fn wrong_after(comm: &Communicator, grads: &[Vec<f32>]) -> conflux::Result<i64> {
    let n = comm.size();
    let want = (n * (n + 1) / 2) as f32;
    let mut w = [grads.iter().map(|g| g.iter().filter(|&&x| x != want).count() as i64).sum::<i64>()];
    comm.all_reduce(&mut w, ReduceOp::Sum)?;
    Ok(w[0])
}

pub fn fusion(comm: &Communicator, args: &BenchArgs) -> Result<bool, String> {
    let (name, lens) = models::by_name(&args.model).ok_or_else(|| format!("unknown model {:?}", args.model))?;
    let lead = comm.rank() == 0;
    let params: usize = lens.iter().sum();
    let mine = (comm.rank() + 1) as f32;
    let fresh = || -> Vec<Vec<f32>> { lens.iter().map(|&l| vec![mine; l]).collect() };
    let bucket_mb = comm.config().bucket_bytes as f64 / (1 << 20) as f64;
    if lead {
        println!(
            "# conflux bench fusion: {} ranks, {name}: {} tensors, {params} f32 parameters ({:.1} MB), bucket {bucket_mb} MB",
            comm.size(),
            lens.len(),
            params as f64 * 4e-6,
        );
        println!(
            "#{:>22} {:>12} {:>9} {:>10} {:>8} {:>7}",
            "method", "step(ms)", "calls", "busbw", "speedup", "#wrong"
        );
    }
    let iters = args.iters.clamp(1, 20);
    let warmup = args.warmup.min(2);
    let busbw = |secs: f64| {
        let n = comm.size() as f64;
        params as f64 * 4.0 / secs / 1e9 * 2.0 * (n - 1.0) / n
    };
    let mut per_tensor = 0.0;
    let mut all_right = true;
    for method in ["per-tensor all_reduce", "all_reduce_coalesced", "bucketed async"] {
        let mut calls = 0;
        // Gradients come in reverse definition order, as backward produces them.
        let mut step = |grads: &mut Vec<Vec<f32>>| match method {
            "per-tensor all_reduce" => {
                calls = grads.len();
                grads.iter_mut().rev().try_for_each(|g| comm.all_reduce(g, ReduceOp::Sum))
            }
            "all_reduce_coalesced" => {
                calls = 1;
                let mut views: Vec<&mut [f32]> = grads.iter_mut().rev().map(|g| g.as_mut_slice()).collect();
                comm.all_reduce_coalesced(&mut views, ReduceOp::Sum)
            }
            _ => comm.bucketed(ReduceOp::Sum, |b| {
                for g in grads.iter_mut().rev() {
                    b.push(g);
                }
                b.flush();
                calls = b.buckets();
            }),
        };
        // Timed steps reduce the previous step's results (the values grow, the work is the same);
        // the checked step starts from fresh inputs.
        let mut grads = fresh();
        let secs = time_steps(comm, warmup, iters, || step(&mut grads)).map_err(|e| e.to_string())?;
        let wrong = if args.check {
            let mut grads = fresh();
            step(&mut grads).map_err(|e| e.to_string())?;
            wrong_after(comm, &grads).map_err(|e| e.to_string())?
        } else {
            0
        };
        all_right &= wrong == 0;
        if method.starts_with("per-tensor") {
            per_tensor = secs;
        }
        if lead {
            println!(
                " {method:>22} {:>12.2} {calls:>9} {:>10.3} {:>7.2}x {:>7}",
                secs * 1e3,
                busbw(secs),
                per_tensor / secs,
                if args.check { wrong.to_string() } else { "N/A".into() }
            );
        }
    }
    Ok(all_right)
}

/// `c = a x b` for square row-major matrices of side `m`; the i-k-j order vectorizes.
fn matmul(a: &[f32], b: &[f32], c: &mut [f32], m: usize) {
    c.fill(0.0);
    for i in 0..m {
        let row = &mut c[i * m..(i + 1) * m];
        for k in 0..m {
            let x = a[i * m + k];
            for (cj, bj) in row.iter_mut().zip(&b[k * m..(k + 1) * m]) {
                *cj += x * bj;
            }
        }
    }
}

pub fn overlap(comm: &Communicator, args: &BenchArgs) -> Result<bool, String> {
    let err = |e: conflux::Error| e.to_string();
    let lead = comm.rank() == 0;
    let n = comm.size() as f32;
    let elems = comm.config().bucket_bytes / 4;
    let iters = args.iters.clamp(3, 50);
    let warmup = args.warmup.clamp(1, 5);
    let mut bucket = vec![1.0f32; elems];

    // Communication alone: one bucket's all_reduce.
    let comm_s = time_steps(comm, warmup, iters, || comm.all_reduce(&mut bucket, ReduceOp::Sum)).map_err(err)?;

    // Size the multiply so that compute takes about as long, from one probe.
    let probe = 256;
    let (a, b) = (vec![1.0f32; probe * probe], vec![0.5f32; probe * probe]);
    let mut c = vec![0.0f32; probe * probe];
    let t = Instant::now();
    matmul(&a, &b, &mut c, probe);
    let mut probe_s = [t.elapsed().as_secs_f64()];
    comm.all_reduce(&mut probe_s, ReduceOp::Max).map_err(err)?;
    let m = ((probe as f64) * (comm_s / probe_s[0]).cbrt()).round().clamp(64.0, 4096.0) as usize;
    let (a, b) = (vec![1.0f32; m * m], vec![0.5f32; m * m]);
    let mut c = vec![0.0f32; m * m];

    let compute_s = time_steps(comm, warmup, iters, || {
        matmul(&a, &b, &mut c, m);
        Ok(())
    })
    .map_err(err)?;

    // The step: the previous bucket reduces underneath this step's multiply. Timed steps
    // reduce the last step's result again (same work); the checked step starts afresh.
    let step = |bucket: Vec<f32>, c: &mut [f32]| -> conflux::Result<Vec<f32>> {
        let work = comm.all_reduce_async(bucket, ReduceOp::Sum);
        matmul(&a, &b, c, m);
        work.wait()
    };
    let mut held = Some(bucket);
    let step_s = time_steps(comm, warmup, iters, || {
        held = Some(step(held.take().expect("the bucket comes back every step"), &mut c)?);
        Ok(())
    })
    .map_err(err)?;
    let bad = if args.check {
        let mut fresh = held.take().expect("returned");
        fresh.fill(1.0);
        let reduced = step(fresh, &mut c).map_err(err)?;
        let wrong = reduced.iter().filter(|&&x| x != n).count();
        let mut w = [wrong as i64 + (c[0] != 0.5 * m as f32) as i64];
        comm.all_reduce(&mut w, ReduceOp::Sum).map_err(err)?;
        w[0]
    } else {
        0
    };
    let (hi, lo) = (compute_s.max(comm_s), compute_s.min(comm_s));
    let overlap = 1.0 - (step_s - hi) / lo;
    if lead {
        println!(
            "# conflux bench overlap: {} ranks, bucket {:.1} MB f32 all_reduce under a {m}x{m} f32 matmul, {iters} steps",
            comm.size(),
            elems as f64 * 4e-6
        );
        println!(
            "#{:>12} {:>12} {:>12} {:>14} {:>9} {:>7}",
            "compute(ms)", "comm(ms)", "step(ms)", "step/max", "overlap", "#wrong"
        );
        println!(
            " {:>12.2} {:>12.2} {:>12.2} {:>14.3} {:>8.0}% {:>7}",
            compute_s * 1e3,
            comm_s * 1e3,
            step_s * 1e3,
            step_s / hi,
            overlap * 100.0,
            if args.check { bad.to_string() } else { "N/A".into() }
        );
    }
    Ok(bad == 0)
}
