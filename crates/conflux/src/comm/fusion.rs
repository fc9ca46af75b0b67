//! Fusion of many small tensors into few large transfers: `all_reduce_coalesced` for a list
//! at hand, and the `Bucketer` for gradients that become ready one by one (DDP's and Horovod's
//! gradient buckets).
//!
//! Both hand the tensors to the algorithm as pieces of one message: on one host's shared
//! segment they are gathered straight into the segment's slots and the result scattered
//! straight back, with no staging copy; the ring stages them in a buffer the transport keeps.
//! A bucket's tensors stay where they are: the Bucketer lends them to the progress engine for
//! the length of a scope that does not end before every bucket is done (as `std::thread::scope`
//! lends to threads).
//!
//! The shared-segment algorithm reduces each element over ranks 0..N in order wherever it
//! sits in the message, so fused and per-tensor results are bitwise equal there; the ring's
//! order depends on the element's block, so across hosts they agree to rounding.

use super::ops;
use super::{bytes_mut, Buffer, Communicator, Work};
use crate::algo::coll::Coll;
use crate::dtype::{Element, ReduceOp};
use crate::error::Result;

impl Communicator {
    /// Reduces every buffer of `bufs` across all ranks, in place, as one message. Ranks must
    /// pass buffers of the same lengths in the same order.
    pub fn all_reduce_coalesced<T: Element>(&self, bufs: &mut [&mut [T]], op: ReduceOp) -> Result<()> {
        let mut pieces: Vec<&mut [u8]> = bufs.iter_mut().map(|b| bytes_mut(b)).collect();
        self.blocking(Coll::AllReduce { input: None, out: &mut pieces, op }, T::DTYPE)
    }

    /// Non-blocking `all_reduce_coalesced`: the buffers come back through the handle.
    pub fn all_reduce_coalesced_async<B: Buffer>(&self, mut bufs: Vec<B>, op: ReduceOp) -> Work<Vec<B>> {
        let dtype = <B::Elem as Element>::DTYPE;
        let total: usize = bufs.iter().map(|b| b.as_slice().len()).sum();
        let what = format!("all_reduce({dtype} x {total}) of {} coalesced buffers", bufs.len());
        self.spawn(what, move |t, plan| {
            let mut pieces: Vec<&mut [u8]> = bufs.iter_mut().map(|b| bytes_mut(b.as_mut_slice())).collect();
            ops::run(t, plan, Coll::AllReduce { input: None, out: &mut pieces, op }, dtype)?;
            Ok(bufs)
        })
    }

    /// Gradient fusion, as DDP's and Horovod's buckets: inside `f`, push tensors in the order
    /// their gradients become ready; whenever the open bucket reaches the bucket size
    /// (`CONFLUX_BUCKET_MB`, default 25 MiB) it is reduced asynchronously, in place, while `f`
    /// goes on. When `f` returns, the rest is launched and everything waited for
    /// ([`Bucketer::finish`]); then every tensor holds its result. `ReduceOp::Avg` divides by the number of ranks. A tensor larger
    /// than a bucket goes alone. Ranks must push tensors of the same lengths in the same order.
    /// Returns `f`'s value, or the first failed bucket's error.
    ///
    /// ```no_run
    /// # let comm = conflux::Communicator::from_env()?;
    /// # let mut grads: Vec<Vec<f32>> = vec![vec![0.0; 1000]; 10];
    /// comm.bucketed(conflux::ReduceOp::Avg, |b| {
    ///     for g in grads.iter_mut().rev() {
    ///         b.push(g); // as backward produces them
    ///     }
    /// })?;
    /// # Ok::<(), conflux::Error>(())
    /// ```
    pub fn bucketed<'a, T: Element, R>(
        &self,
        op: ReduceOp,
        f: impl FnOnce(&mut Bucketer<'_, 'a, T>) -> R,
    ) -> Result<R> {
        let cap = (self.config().bucket_bytes / T::DTYPE.size()).max(1);
        let mut b = Bucketer { comm: self, op, cap, open: Vec::new(), open_len: 0, launched: Vec::new() };
        let r = f(&mut b);
        b.finish().map(|_| r)
    }
}

/// The open bucket and the launched ones of a [`Communicator::bucketed`] scope.
pub struct Bucketer<'c, 'a, T: Element> {
    comm: &'c Communicator,
    op: ReduceOp,
    /// Bucket capacity in elements.
    cap: usize,
    open: Vec<&'a mut [T]>,
    open_len: usize,
    launched: Vec<Work<()>>,
}

impl<'a, T: Element> Bucketer<'_, 'a, T> {
    /// Adds a ready tensor; launches the open bucket first if this one would overflow it, and
    /// after if it is full.
    pub fn push(&mut self, tensor: &'a mut [T]) {
        if self.open_len > 0 && self.open_len + tensor.len() > self.cap {
            self.flush();
        }
        self.open_len += tensor.len();
        self.open.push(tensor);
        if self.open_len >= self.cap {
            self.flush();
        }
    }

    /// Launches the open bucket now, full or not.
    pub fn flush(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let what = format!("all_reduce({} x {}) of a bucket of {} tensors", T::DTYPE, self.open_len, self.open.len());
        let op = self.op;
        let mut pieces: Vec<&'static mut [u8]> = self
            .open
            .drain(..)
            .map(|t| {
                let b: &'a mut [u8] = bytes_mut(t);
                // SAFETY: the engine may use the tensor until the bucket's Work completes. A
                // Bucketer exists only inside `bucketed`, which owns it (callers get `&mut`, so
                // they can neither move nor forget it), and its Drop — run on return and on
                // unwinding alike — waits for every launched Work; so every bucket is done
                // before `bucketed` returns, hence before `'a`, which outlives that call, ends.
                // The `&'a mut` borrow moved in here keeps the caller off the tensor meanwhile.
                unsafe { std::mem::transmute::<&'a mut [u8], &'static mut [u8]>(b) }
            })
            .collect();
        self.open_len = 0;
        let work = self.comm.spawn(what, move |t, plan| {
            let mut out: Vec<&mut [u8]> = pieces.iter_mut().map(|p| &mut **p).collect();
            ops::run(t, plan, Coll::AllReduce { input: None, out: &mut out, op }, T::DTYPE)
        });
        self.launched.push(work);
    }

    /// Sets the bucket size for the buckets opened from now on (default: the communicator's).
    pub fn set_bucket_bytes(&mut self, bytes: usize) {
        self.cap = (bytes / T::DTYPE.size()).max(1);
    }

    /// Buckets launched so far.
    pub fn buckets(&self) -> usize {
        self.launched.len()
    }

    /// Launches the open bucket and waits for every bucket launched so far; the first error,
    /// if any. The end of the `bucketed` scope does this; the tensors can be read after it.
    pub fn finish(&mut self) -> Result<()> {
        self.flush();
        self.wait_all()
    }

    /// Waits for every launched bucket; the first error, if any.
    fn wait_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        for w in self.launched.drain(..) {
            if let Err(e) = w.wait() {
                first = first.and(Err(e));
            }
        }
        first
    }
}

impl<T: Element> Drop for Bucketer<'_, '_, T> {
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}
