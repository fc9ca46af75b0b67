//! Reduction kernels: AVX2 and F16C when the CPU has both (detected at run time), portable
//! code otherwise (also for every dtype on a CPU or VM that shows AVX2 but hides F16C).
//!
//! Both paths are the same generic code (`kernel.rs`), compiled twice: once as ordinary code
//! and once inside a function with AVX2 and F16C enabled, where the compiler vectorizes the
//! loops with 256-bit registers and f16 converts eight elements an instruction. Buffers are
//! plain bytes at any alignment (shared-memory slots and wire chunks have no alignment
//! promise). f32, f64 and integers are read and written in place with unaligned loads; f16
//! and bf16 are widened block by block into f32 stack arrays, which stay in L1, and rounded
//! once at the end. `cargo bench -p conflux --bench reduce` measures them against a copy.
//!
//! Results are identical on both paths: the order of operations per element is fixed (sources
//! in the order given) and neither path contracts multiply-adds.

mod kernel;

use crate::dtype::{DataType, ReduceOp};
use std::sync::OnceLock;

/// `dst[i] = dst[i] op src[i]` over whole elements. `src` must be at least as long as `dst`.
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    let n = n - n % dtype.size();
    run(dtype, op, &mut dst[..n], Some(0), &[&src[..n]]);
}

/// `dst[i] = srcs[0][i] op srcs[1][i] op ...`, in that order; f16 and bf16 accumulate in f32
/// across all sources and round once. An empty `srcs` leaves `dst` as it is.
pub fn reduce_many(dtype: DataType, op: ReduceOp, dst: &mut [u8], srcs: &[&[u8]]) {
    if !srcs.is_empty() {
        trimmed(dtype, op, dst, None, srcs);
    }
}

/// `reduce_many` with `dst`'s own contents as the source at position `at` (at most
/// `srcs.len()`): `dst[i] = srcs[0][i] op .. op dst[i] op .. op srcs[last][i]`, in that order,
/// with no copy of `dst` made first.
pub fn reduce_many_with_dst(dtype: DataType, op: ReduceOp, dst: &mut [u8], at: usize, srcs: &[&[u8]]) {
    debug_assert!(at <= srcs.len());
    trimmed(dtype, op, dst, Some(at.min(srcs.len())), srcs);
}

/// Runs the kernel over the whole elements that `dst` and every source have.
fn trimmed(dtype: DataType, op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    let n = srcs.iter().map(|s| s.len()).fold(dst.len(), usize::min);
    let n = n - n % dtype.size();
    // On the stack for the usual handful of ranks: this runs once per small all_reduce.
    let srcs: smallvec::SmallVec<[&[u8]; 8]> = srcs.iter().map(|s| &s[..n]).collect();
    run(dtype, op, &mut dst[..n], dst_at, &srcs);
}

/// Divides every element by `n` (the second half of Avg). Integers truncate toward zero, as
/// NCCL's and torch's integer averages do.
pub fn divide(dtype: DataType, dst: &mut [u8], n: usize) {
    if n > 1 {
        let len = dst.len() - dst.len() % dtype.size();
        kernel::divide(dtype, &mut dst[..len], n);
    }
}

/// Which kernel this process uses: "avx2" (with F16C) or "portable".
pub fn kernel_name() -> &'static str {
    if has_avx2_f16c() {
        "avx2"
    } else {
        "portable"
    }
}

fn has_avx2_f16c() -> bool {
    static DETECTED: OnceLock<bool> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

fn run(dtype: DataType, op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() {
        // SAFETY: the CPU supports AVX2 and F16C (checked at run time just above); that is the
        // only requirement of a `target_feature(enable = "avx2,f16c")` function.
        unsafe { kernel::fold_avx2(dtype, op, dst, dst_at, srcs) };
        return;
    }
    kernel::fold_portable(dtype, op, dst, dst_at, srcs);
}

#[cfg(test)]
mod tests;
