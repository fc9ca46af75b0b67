//! The README's example: `cargo build --release --examples` then
//! `target/release/conflux run -n 4 -- target/release/examples/quickstart`.

use conflux::{Communicator, ReduceOp};

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
    println!("rank {rank}/{size}: ok (params[0] = {}, {busy:.0})", params[0]);
    Ok(())
}
