//! Fusion of many small tensors into few large transfers: `all_reduce_coalesced` for a list
//! at hand, and the `Bucketer` for gradients that become ready one by one (DDP's and Horovod's
//! gradient buckets).
//!
//! Both copy the tensors into one contiguous buffer, reduce it with one all_reduce, and copy
//! the result back. Every algorithm here reduces each element independently of where it sits
//! in the buffer on one host's shared segment (rank order), so fused and per-tensor results
//! are bitwise equal there; the ring's order depends on the element's block, so across hosts
//! they agree to rounding.

use super::{Communicator, Work};
use crate::dtype::{Element, ReduceOp};
use crate::error::Result;

impl Communicator {
    /// Reduces every buffer of `bufs` across all ranks, in place, as one transfer. Ranks must
    /// pass buffers of the same lengths in the same order.
    pub fn all_reduce_coalesced<T: Element>(&self, bufs: &mut [&mut [T]], op: ReduceOp) -> Result<()> {
        let mut flat = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
        for b in bufs.iter() {
            flat.extend_from_slice(b);
        }
        self.all_reduce(&mut flat, op)?;
        scatter(&flat, bufs.iter_mut().map(|b| &mut **b));
        Ok(())
    }
}

/// Gradient fusion: register tensors in the order they become ready; whenever the open bucket
/// reaches the communicator's bucket size (`CONFLUX_BUCKET_MB`, default 25 MiB) it is reduced
/// asynchronously while more tensors arrive; `finish` waits for all and writes every result
/// back into its tensor. With `ReduceOp::Avg` the result is divided by the number of ranks.
/// A tensor larger than a bucket goes alone. Ranks must push tensors of the same lengths in
/// the same order.
pub struct Bucketer<'a, T: Element> {
    comm: &'a Communicator,
    op: ReduceOp,
    /// Bucket capacity in elements.
    cap: usize,
    open: Vec<T>,
    open_parts: Vec<&'a mut [T]>,
    launched: Vec<(Work<Vec<T>>, Vec<&'a mut [T]>)>,
}

impl<'a, T: Element> Bucketer<'a, T> {
    pub fn new(comm: &'a Communicator, op: ReduceOp) -> Bucketer<'a, T> {
        let cap = (comm.config().bucket_bytes / T::DTYPE.size()).max(1);
        Bucketer { comm, op, cap, open: Vec::new(), open_parts: Vec::new(), launched: Vec::new() }
    }

    /// Overrides the bucket size.
    pub fn with_bucket_bytes(mut self, bytes: usize) -> Bucketer<'a, T> {
        self.cap = (bytes / T::DTYPE.size()).max(1);
        self
    }

    /// Adds a ready tensor; launches the open bucket when this one would overflow it, or
    /// fills it. The tensor stays borrowed until `finish` has written its result.
    pub fn push(&mut self, tensor: &'a mut [T]) {
        if !self.open.is_empty() && self.open.len() + tensor.len() > self.cap {
            self.flush();
        }
        if self.open.is_empty() {
            self.open.reserve_exact(self.cap.max(tensor.len()));
        }
        self.open.extend_from_slice(tensor);
        self.open_parts.push(tensor);
        if self.open.len() >= self.cap {
            self.flush();
        }
    }

    /// Launches the open bucket now, full or not.
    pub fn flush(&mut self) {
        if self.open_parts.is_empty() {
            return;
        }
        let buf = std::mem::take(&mut self.open);
        let work = self.comm.all_reduce_async(buf, self.op);
        self.launched.push((work, std::mem::take(&mut self.open_parts)));
    }

    /// Buckets launched so far.
    pub fn buckets(&self) -> usize {
        self.launched.len()
    }

    /// Launches what is left, waits for every bucket and scatters the results back. Returns
    /// the first error; tensors of failed buckets keep their input.
    pub fn finish(mut self) -> Result<()> {
        self.flush();
        let mut first_err = Ok(());
        for (work, parts) in self.launched.drain(..) {
            match work.wait() {
                Ok(flat) => scatter(&flat, parts.into_iter()),
                Err(e) => {
                    if first_err.is_ok() {
                        first_err = Err(e);
                    }
                }
            }
        }
        first_err
    }
}

/// Copies consecutive pieces of `flat` back into `parts`.
fn scatter<'b, T: Element>(flat: &[T], parts: impl Iterator<Item = &'b mut [T]>) {
    let mut at = 0;
    for p in parts {
        p.copy_from_slice(&flat[at..at + p.len()]);
        at += p.len();
    }
}
