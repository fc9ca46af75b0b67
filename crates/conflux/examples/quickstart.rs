//! The README's example: `cargo build --release --examples` then
//! `target/release/conflux run -n 4 -- target/release/examples/quickstart`.

use conflux::{Communicator, Priority, ReduceOp};

fn main() -> conflux::Result<()> {
    // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun or `conflux run` set them.
    let comm = Communicator::from_env()?;
    let (rank, size) = (comm.rank(), comm.size());

    // Sum a gradient across ranks, in place.
    let mut grad = vec![rank as f32; 1 << 20];
    comm.all_reduce(&mut grad, ReduceOp::Sum)?;
    assert!(grad.iter().all(|&g| g == (0..size).sum::<usize>() as f32));

    // Overlap: start an average in the background, compute, then wait.
    let pending = comm.all_reduce_async(vec![1.0f32; 1024], ReduceOp::Avg);
    let busy: f64 = (0..1_000_000).map(|i| (i as f64).sqrt()).sum();
    let avg = pending.wait()?;
    assert_eq!(avg[0], 1.0);

    // Rank 0's parameters to everyone.
    let mut params = if rank == 0 { vec![3.5f64; 16] } else { vec![0.0; 16] };
    comm.broadcast(&mut params, 0)?;

    // Pairs of neighbouring ranks as a group (tensor-parallel style), and the even ranks.
    let pair = comm.split(Some((rank / 2) as u32), rank as i64)?.expect("every rank has a color");
    let mut x = [1i64];
    pair.all_reduce(&mut x, ReduceOp::Sum)?;
    assert_eq!(x[0], pair.size() as i64);
    let evens: Vec<usize> = (0..size).step_by(2).collect();
    assert_eq!(comm.new_group(&evens)?.is_some(), rank % 2 == 0);

    // Gradients fused: two tensors as one message, then DDP-style buckets.
    let (mut w, mut b) = (vec![1.0f32; 1000], vec![2.0f32; 10]);
    comm.all_reduce_coalesced(&mut [&mut w[..], &mut b[..]], ReduceOp::Avg)?;
    let mut grads: Vec<Vec<f32>> = (0..20).map(|i| vec![i as f32; 50_000]).collect();
    comm.bucketed(ReduceOp::Avg, |bucket| {
        for g in grads.iter_mut().rev() {
            bucket.push(g);
        }
    })?;
    assert!(w[0] == 1.0 && b[0] == 2.0 && grads[7][0] == 7.0);

    // An urgent small operation is not queued behind a large one issued before it.
    let big = comm.all_reduce_async(vec![1.0f32; 4 << 20], ReduceOp::Sum);
    let mut urgent = [rank as f32];
    comm.with_priority(Priority::High).all_reduce(&mut urgent, ReduceOp::Max)?;
    big.wait()?;
    drop(pair);
    println!("rank {rank}/{size}: ok (params[0] = {}, {busy:.0}, max rank {})", params[0], urgent[0]);
    Ok(())
}
