//! The generic block kernel behind every dtype and op, and its two compilations.

use crate::dtype::{DataType, ReduceOp};
use bytemuck::Pod;
use half::{bf16, f16, slice::HalfFloatSliceExt};

/// Elements per block: 2 KiB of f32, so a block and its accumulator sit in L1.
const BLOCK: usize = 512;

/// Arithmetic of the type a reduction runs in.
trait Arith: Pod + Default {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    /// The bitwise ops; floats get them on their bit patterns, but callers never ask for that.
    fn band(self, o: Self) -> Self;
    fn bor(self, o: Self) -> Self;
    fn bxor(self, o: Self) -> Self;
}

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        #[allow(clippy::float_cmp)]
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn band(self, o: Self) -> Self { <$t>::from_bits(self.to_bits() & o.to_bits()) }
            #[inline(always)] fn bor(self, o: Self) -> Self { <$t>::from_bits(self.to_bits() | o.to_bits()) }
            #[inline(always)] fn bxor(self, o: Self) -> Self { <$t>::from_bits(self.to_bits() ^ o.to_bits()) }
        }
    )*};
}
macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn band(self, o: Self) -> Self { self & o }
            #[inline(always)] fn bor(self, o: Self) -> Self { self | o }
            #[inline(always)] fn bxor(self, o: Self) -> Self { self ^ o }
        }
    )*};
}
arith_float!(f32, f64);
arith_int!(i8, u8, i16, i32, i64);

/// How a stored element type becomes the type its arithmetic runs in, and back.
trait Storage {
    type Acc: Arith;
    /// Bytes per stored element (f16 and bf16 store 2 but compute in 4).
    const STORED: usize;
    fn widen(src: &[u8], out: &mut [Self::Acc]);
    fn narrow(src: &[Self::Acc], out: &mut [u8]);
}

/// Types stored as they compute.
struct Plain<T>(std::marker::PhantomData<T>);
impl<T: Arith> Storage for Plain<T> {
    type Acc = T;
    const STORED: usize = std::mem::size_of::<T>();
    #[inline(always)]
    fn widen(src: &[u8], out: &mut [T]) {
        bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(src);
    }
    #[inline(always)]
    fn narrow(src: &[T], out: &mut [u8]) {
        out.copy_from_slice(bytemuck::cast_slice(src));
    }
}

/// Half-precision types, computed in f32.
struct Half<H>(std::marker::PhantomData<H>);
macro_rules! half_storage {
    ($($h:ty),*) => {$(
        impl Storage for Half<$h> {
            type Acc = f32;
            const STORED: usize = 2;
            #[inline(always)]
            fn widen(src: &[u8], out: &mut [f32]) {
                let mut h = [<$h>::ZERO; BLOCK];
                let h = &mut h[..out.len()];
                bytemuck::cast_slice_mut::<$h, u8>(h).copy_from_slice(src);
                h.convert_to_f32_slice(out);
            }
            #[inline(always)]
            fn narrow(src: &[f32], out: &mut [u8]) {
                let mut h = [<$h>::ZERO; BLOCK];
                let h = &mut h[..src.len()];
                h.convert_from_f32_slice(src);
                out.copy_from_slice(bytemuck::cast_slice(h));
            }
        }
    )*};
}
half_storage!(f16, bf16);

#[inline(always)]
fn combine<A: Arith>(op: ReduceOp, acc: &mut [A], x: &[A]) {
    let pairs = acc.iter_mut().zip(x);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, b)| *a = a.add(*b)),
        ReduceOp::Prod => pairs.for_each(|(a, b)| *a = a.mul(*b)),
        ReduceOp::Min => pairs.for_each(|(a, b)| *a = Arith::min(*a, *b)),
        ReduceOp::Max => pairs.for_each(|(a, b)| *a = Arith::max(*a, *b)),
        ReduceOp::BitAnd => pairs.for_each(|(a, b)| *a = a.band(*b)),
        ReduceOp::BitOr => pairs.for_each(|(a, b)| *a = a.bor(*b)),
        ReduceOp::BitXor => pairs.for_each(|(a, b)| *a = a.bxor(*b)),
    }
}

/// Folds `dst` (when `with_dst`) and `srcs` block by block into `dst`. Every source is at
/// least as long as `dst`, and `dst` holds whole elements (the callers in mod.rs trim).
#[inline(always)]
fn fold<S: Storage>(op: ReduceOp, dst: &mut [u8], with_dst: bool, srcs: &[&[u8]]) {
    let es = S::STORED;
    let mut acc = [S::Acc::default(); BLOCK];
    let mut tmp = [S::Acc::default(); BLOCK];
    let n = dst.len() / es;
    let mut start = 0;
    while start < n {
        let m = BLOCK.min(n - start);
        let bytes = start * es..(start + m) * es;
        let (acc, tmp) = (&mut acc[..m], &mut tmp[..m]);
        let rest = if with_dst {
            S::widen(&dst[bytes.clone()], acc);
            srcs
        } else {
            S::widen(&srcs[0][bytes.clone()], acc);
            &srcs[1..]
        };
        for s in rest {
            S::widen(&s[bytes.clone()], tmp);
            combine(op, acc, tmp);
        }
        S::narrow(acc, &mut dst[bytes]);
        start += m;
    }
}

#[inline(always)]
fn dispatch(dtype: DataType, op: ReduceOp, dst: &mut [u8], with_dst: bool, srcs: &[&[u8]]) {
    match dtype {
        DataType::F32 => fold::<Plain<f32>>(op, dst, with_dst, srcs),
        DataType::F64 => fold::<Plain<f64>>(op, dst, with_dst, srcs),
        DataType::F16 => fold::<Half<f16>>(op, dst, with_dst, srcs),
        DataType::BF16 => fold::<Half<bf16>>(op, dst, with_dst, srcs),
        DataType::I8 => fold::<Plain<i8>>(op, dst, with_dst, srcs),
        DataType::U8 => fold::<Plain<u8>>(op, dst, with_dst, srcs),
        DataType::I16 => fold::<Plain<i16>>(op, dst, with_dst, srcs),
        DataType::I32 => fold::<Plain<i32>>(op, dst, with_dst, srcs),
        DataType::I64 => fold::<Plain<i64>>(op, dst, with_dst, srcs),
    }
}

pub(super) fn fold_portable(dtype: DataType, op: ReduceOp, dst: &mut [u8], with_dst: bool, srcs: &[&[u8]]) {
    dispatch(dtype, op, dst, with_dst, srcs)
}

/// The same code as `fold_portable`, vectorized for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn fold_avx2(dtype: DataType, op: ReduceOp, dst: &mut [u8], with_dst: bool, srcs: &[&[u8]]) {
    dispatch(dtype, op, dst, with_dst, srcs)
}

/// Divides every element by `n > 1`; integers truncate toward zero.
pub(super) fn divide(dtype: DataType, dst: &mut [u8], n: usize) {
    fn each<T: Pod>(dst: &mut [u8], f: impl Fn(T) -> T) {
        let size = std::mem::size_of::<T>();
        for c in dst.chunks_exact_mut(size) {
            let v: T = bytemuck::pod_read_unaligned(c);
            c.copy_from_slice(bytemuck::bytes_of(&f(v)));
        }
    }
    let ni = i64::try_from(n).unwrap_or(i64::MAX);
    match dtype {
        DataType::F32 => each(dst, |v: f32| v / n as f32),
        DataType::F64 => each(dst, |v: f64| v / n as f64),
        DataType::F16 => each(dst, |v: f16| f16::from_f32(v.to_f32() / n as f32)),
        DataType::BF16 => each(dst, |v: bf16| bf16::from_f32(v.to_f32() / n as f32)),
        DataType::I8 => each(dst, |v: i8| (v as i64 / ni) as i8),
        DataType::U8 => each(dst, |v: u8| (v as i64 / ni) as u8),
        DataType::I16 => each(dst, |v: i16| (v as i64 / ni) as i16),
        DataType::I32 => each(dst, |v: i32| (v as i64 / ni) as i32),
        DataType::I64 => each(dst, |v: i64| v / ni),
    }
}
