//! The generic kernels behind every dtype and op, and their two compilations: `fold_plain` for
//! types stored as they compute, straight from the byte buffers; `fold` for f16 and bf16,
//! staged through f32 blocks.

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

/// How a half-precision element becomes the f32 its arithmetic runs in, and back. Types stored
/// as they compute skip this (`fold_plain`).
trait Storage {
    fn widen(src: &[u8], out: &mut [f32]);
    fn narrow(src: &[f32], out: &mut [u8]);
}

/// Half-precision types, computed in f32.
struct Half<H>(std::marker::PhantomData<H>);

/// f16 through `half`'s slice conversions: the portable path. (`half` reaches F16C through an
/// out-of-line call per 8 elements, about 3 GB/s; the AVX2 path uses `F16c` instead.)
impl Storage for Half<f16> {
    #[inline(always)]
    fn widen(src: &[u8], out: &mut [f32]) {
        let mut h = [f16::ZERO; BLOCK];
        let h = &mut h[..out.len()];
        bytemuck::cast_slice_mut::<f16, u8>(h).copy_from_slice(src);
        h.convert_to_f32_slice(out);
    }
    #[inline(always)]
    fn narrow(src: &[f32], out: &mut [u8]) {
        let mut h = [f16::ZERO; BLOCK];
        let h = &mut h[..src.len()];
        h.convert_from_f32_slice(src);
        out.copy_from_slice(bytemuck::cast_slice(h));
    }
}

/// f16 with the F16C instructions inline, eight elements an instruction; the last few go
/// through `half`. Only `fold_avx2` (and a test) name it, both unsafe to call without F16C.
#[cfg(target_arch = "x86_64")]
struct F16c;

#[cfg(target_arch = "x86_64")]
impl Storage for F16c {
    #[inline(always)]
    fn widen(src: &[u8], out: &mut [f32]) {
        use std::arch::x86_64::{__m128i, _mm256_cvtph_ps};
        let whole = out.len() / 8 * 8;
        let ((src, src_rest), (out, out_rest)) = (src.split_at(whole * 2), out.split_at_mut(whole));
        for (s, o) in src.chunks_exact(16).zip(out.chunks_exact_mut(8)) {
            let v: __m128i = bytemuck::pod_read_unaligned(s);
            // SAFETY: F16c is named only in `fold_avx2` and the tests' `f16c_conversions`, both
            // unsafe to call without F16C and called only once it was detected; that is the
            // instruction's only requirement (its operand is an owned value, no pointer).
            let w = unsafe { _mm256_cvtph_ps(v) };
            o.copy_from_slice(bytemuck::cast_slice(&[w]));
        }
        if !out_rest.is_empty() {
            <Half<f16> as Storage>::widen(src_rest, out_rest);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32], out: &mut [u8]) {
        use std::arch::x86_64::{__m256, _mm256_cvtps_ph, _MM_FROUND_TO_NEAREST_INT};
        let whole = src.len() / 8 * 8;
        let ((src, src_rest), (out, out_rest)) = (src.split_at(whole), out.split_at_mut(whole * 2));
        for (s, o) in src.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
            let v: __m256 = bytemuck::pod_read_unaligned(bytemuck::cast_slice(s));
            // SAFETY: as in `widen`: only reached after F16C was detected.
            let h = unsafe { _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v) };
            o.copy_from_slice(bytemuck::bytes_of(&h));
        }
        if !src_rest.is_empty() {
            <Half<f16> as Storage>::narrow(src_rest, out_rest);
        }
    }
}

/// `if c { a } else { b }` as masks: written so, bf16 narrowing vectorizes 1.4x better.
#[inline(always)]
fn select(c: bool, a: u32, b: u32) -> u32 {
    let m = 0u32.wrapping_sub(u32::from(c));
    (a & m) | (b & !m)
}

/// bf16 by hand: `half` converts it one element at a time with branches, about 3 GB/s; these
/// loops have no branches and vectorize. Narrowing gives `half`'s results bit for bit (nearest,
/// ties to even; a NaN stays a NaN, quieted), which the tests check.
impl Storage for Half<bf16> {
    #[inline(always)]
    fn widen(src: &[u8], out: &mut [f32]) {
        for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
            // A signaling NaN stays signaling here (`half` quiets it), which makes this loop run
            // 1.3x faster. Narrowing quiets every NaN, so on x86 (whose arithmetic returns the
            // first NaN operand either way) the results are the same; elsewhere only which
            // NaN payload comes out may differ, which Rust leaves unspecified anyway.
            *o = f32::from_bits(u32::from(u16::from_ne_bytes([c[0], c[1]])) << 16);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32], out: &mut [u8]) {
        for (v, c) in src.iter().zip(out.chunks_exact_mut(2)) {
            let x = v.to_bits();
            let nan = x & 0x7fff_ffff > 0x7f80_0000;
            // Nearest, ties to even: the low half carries into the high half when it is over
            // 0x8000, or exactly 0x8000 with the high half odd.
            let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
            let h = select(nan, (x >> 16) | 0x40, rounded) as u16;
            c.copy_from_slice(&h.to_ne_bytes());
        }
    }
}

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

/// Folds the operands, half-type `srcs` with `dst`'s own contents at position `dst_at` if
/// given, block by block, in f32, into `dst`. Every source is at least as long as `dst`, and
/// `dst` holds whole elements (the callers in mod.rs trim).
#[inline(always)]
fn fold<S: Storage>(op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    let es = 2; // bytes per stored element, computed in 4
    let operands = srcs.len() + dst_at.is_some() as usize;
    if operands == 0 {
        return;
    }
    let mut acc = [0f32; BLOCK];
    let mut tmp = [0f32; BLOCK];
    let n = dst.len() / es;
    let mut start = 0;
    while start < n {
        let m = BLOCK.min(n - start);
        let bytes = start * es..(start + m) * es;
        let (acc, tmp) = (&mut acc[..m], &mut tmp[..m]);
        for j in 0..operands {
            let into = if j == 0 { &mut *acc } else { &mut *tmp };
            // dst is read whole before it is written, at the block's end.
            match dst_at {
                Some(k) if j == k => S::widen(&dst[bytes.clone()], into),
                Some(k) if j > k => S::widen(&srcs[j - 1][bytes.clone()], into),
                _ => S::widen(&srcs[j][bytes.clone()], into),
            }
            if j > 0 {
                combine(op, acc, tmp);
            }
        }
        S::narrow(acc, &mut dst[bytes]);
        start += m;
    }
}

/// `dst = a op b` element by element, read and written in place at any alignment.
#[inline(always)]
fn combine_bytes<T: Arith>(op: ReduceOp, dst: &mut [u8], a: Option<&[u8]>, b: &[u8]) {
    let es = std::mem::size_of::<T>();
    #[inline(always)]
    fn each<T: Arith>(dst: &mut [u8], a: Option<&[u8]>, b: &[u8], f: impl Fn(T, T) -> T) {
        let es = std::mem::size_of::<T>();
        let get = |c: &[u8]| bytemuck::pod_read_unaligned::<T>(c);
        let pairs = b.chunks_exact(es);
        match a {
            Some(a) => dst.chunks_exact_mut(es).zip(a.chunks_exact(es)).zip(pairs).for_each(|((d, x), y)| {
                d.copy_from_slice(bytemuck::bytes_of(&f(get(x), get(y))));
            }),
            None => dst.chunks_exact_mut(es).zip(pairs).for_each(|(d, y)| {
                let v = f(get(d), get(y));
                d.copy_from_slice(bytemuck::bytes_of(&v));
            }),
        }
    }
    debug_assert_eq!(dst.len() % es, 0);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => each::<T>(dst, a, b, T::add),
        ReduceOp::Prod => each::<T>(dst, a, b, T::mul),
        ReduceOp::Min => each::<T>(dst, a, b, Arith::min),
        ReduceOp::Max => each::<T>(dst, a, b, Arith::max),
        ReduceOp::BitAnd => each::<T>(dst, a, b, T::band),
        ReduceOp::BitOr => each::<T>(dst, a, b, T::bor),
        ReduceOp::BitXor => each::<T>(dst, a, b, T::bxor),
    }
}

/// `fold` for types stored as they compute: no staging through aligned blocks, since widening
/// is the identity. The same order per element (the operands in order, `dst`'s own contents
/// at `dst_at`), block by block so that `dst`'s block stays in L1 across the sources.
#[inline(always)]
fn fold_plain<T: Arith>(op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    if let Some(k @ 1..) = dst_at {
        return fold_plain_later::<T>(op, dst, k, srcs);
    }
    let block = BLOCK * std::mem::size_of::<T>();
    let mut start = 0;
    while start < dst.len() {
        let bytes = start..dst.len().min(start + block);
        let d = &mut dst[bytes.clone()];
        let rest = match (dst_at, srcs) {
            (Some(_), _) => srcs,
            (None, [only]) => {
                d.copy_from_slice(&only[bytes.clone()]);
                &[]
            }
            (None, [a, b, rest @ ..]) => {
                combine_bytes::<T>(op, d, Some(&a[bytes.clone()]), &b[bytes.clone()]);
                rest
            }
            (None, []) => &[],
        };
        for s in rest {
            combine_bytes::<T>(op, d, None, &s[bytes.clone()]);
        }
        start = bytes.end;
    }
}

/// `fold_plain` with `dst`'s own contents as operand `k > 0`: each block of `dst` is kept
/// aside first, since `dst` fills with the running result from operand 0 on.
#[inline(always)]
fn fold_plain_later<T: Arith>(op: ReduceOp, dst: &mut [u8], k: usize, srcs: &[&[u8]]) {
    let block = BLOCK * std::mem::size_of::<T>();
    let mut saved = [0u8; BLOCK * 8];
    let mut start = 0;
    while start < dst.len() {
        let bytes = start..dst.len().min(start + block);
        let d = &mut dst[bytes.clone()];
        let saved = &mut saved[..d.len()];
        saved.copy_from_slice(d);
        let operand = |j: usize| if j == k { &saved[..] } else { &srcs[j - (j > k) as usize][bytes.clone()] };
        combine_bytes::<T>(op, d, Some(operand(0)), operand(1));
        for j in 2..=srcs.len() {
            combine_bytes::<T>(op, d, None, operand(j));
        }
        start = bytes.end;
    }
}

/// `F16`: how f16 converts; only `fold_avx2` names the F16C one, so only detected CPUs run it.
#[inline(always)]
fn dispatch<F16: Storage>(dtype: DataType, op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    match dtype {
        DataType::F32 => fold_plain::<f32>(op, dst, dst_at, srcs),
        DataType::F64 => fold_plain::<f64>(op, dst, dst_at, srcs),
        DataType::F16 => fold::<F16>(op, dst, dst_at, srcs),
        DataType::BF16 => fold::<Half<bf16>>(op, dst, dst_at, srcs),
        DataType::I8 => fold_plain::<i8>(op, dst, dst_at, srcs),
        DataType::U8 => fold_plain::<u8>(op, dst, dst_at, srcs),
        DataType::I16 => fold_plain::<i16>(op, dst, dst_at, srcs),
        DataType::I32 => fold_plain::<i32>(op, dst, dst_at, srcs),
        DataType::I64 => fold_plain::<i64>(op, dst, dst_at, srcs),
    }
}

pub(super) fn fold_portable(dtype: DataType, op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    dispatch::<Half<f16>>(dtype, op, dst, dst_at, srcs)
}

/// The same code as `fold_portable`, vectorized for AVX2, with f16 converted by F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn fold_avx2(dtype: DataType, op: ReduceOp, dst: &mut [u8], dst_at: Option<usize>, srcs: &[&[u8]]) {
    dispatch::<F16c>(dtype, op, dst, dst_at, srcs)
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

/// A half type's conversions on their own, for the tests: `xs` narrowed to bits and `hs`
/// widened, on whole slices, so that vector loops and their tails both run.
#[cfg(test)]
fn conversions<S: Storage>(xs: &[f32], hs: &[u16]) -> (Vec<u16>, Vec<f32>) {
    let (mut narrow, mut wide) = (vec![0u8; 2 * xs.len()], vec![0f32; hs.len()]);
    for (x, n) in xs.chunks(BLOCK).zip(narrow.chunks_mut(2 * BLOCK)) {
        S::narrow(x, n);
    }
    for (h, w) in bytemuck::cast_slice::<u16, u8>(hs).chunks(2 * BLOCK).zip(wide.chunks_mut(BLOCK)) {
        S::widen(h, w);
    }
    (narrow.chunks_exact(2).map(|c| u16::from_ne_bytes([c[0], c[1]])).collect(), wide)
}

#[cfg(test)]
pub(super) fn bf16_conversions(xs: &[f32], hs: &[u16]) -> (Vec<u16>, Vec<f32>) {
    conversions::<Half<bf16>>(xs, hs)
}

/// # Safety
/// The CPU must support F16C.
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) unsafe fn f16c_conversions(xs: &[f32], hs: &[u16]) -> (Vec<u16>, Vec<f32>) {
    conversions::<F16c>(xs, hs)
}
