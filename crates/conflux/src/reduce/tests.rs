//! Kernels against a scalar reference written independently of them, on both code paths and
//! at every alignment.

use super::kernel;
use crate::dtype::{DataType, ReduceOp};
use half::{bf16, f16};
use proptest::prelude::*;

/// One element, reduced the plain way: decode, combine in the computing type, encode.
fn reference(dtype: DataType, op: ReduceOp, srcs: &[&[u8]]) -> Vec<u8> {
    let es = dtype.size();
    let n = srcs[0].len() / es;
    let mut out = Vec::with_capacity(n * es);
    for i in 0..n {
        let at = |s: &[u8]| s[i * es..(i + 1) * es].to_vec();
        let elems: Vec<Vec<u8>> = srcs.iter().map(|s| at(s)).collect();
        out.extend(one(dtype, op, &elems));
    }
    out
}

fn one(dtype: DataType, op: ReduceOp, e: &[Vec<u8>]) -> Vec<u8> {
    fn f<T: Copy>(e: &[Vec<u8>], dec: impl Fn(&[u8]) -> T, c: impl Fn(T, T) -> T) -> T {
        e[1..].iter().fold(dec(&e[0]), |a, b| c(a, dec(b)))
    }
    macro_rules! float {
        ($t:ty, $dec:expr, $enc:expr) => {{
            let v = f(e, $dec, |a: $t, b: $t| match op {
                ReduceOp::Sum | ReduceOp::Avg => a + b,
                ReduceOp::Prod => a * b,
                ReduceOp::Min => {
                    if b < a {
                        b
                    } else {
                        a
                    }
                }
                ReduceOp::Max => {
                    if b > a {
                        b
                    } else {
                        a
                    }
                }
                bitwise => unreachable!("{bitwise} is not asked of floats"),
            });
            $enc(v)
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let v = f(
                e,
                |b| <$t>::from_le_bytes(b.try_into().unwrap()),
                |a: $t, b: $t| match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                },
            );
            v.to_le_bytes().to_vec()
        }};
    }
    match dtype {
        DataType::F32 => {
            float!(f32, |b: &[u8]| f32::from_le_bytes(b.try_into().unwrap()), |v: f32| v.to_le_bytes().to_vec())
        }
        DataType::F64 => {
            float!(f64, |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap()), |v: f64| v.to_le_bytes().to_vec())
        }
        DataType::F16 => {
            float!(f32, |b: &[u8]| f16::from_le_bytes(b.try_into().unwrap()).to_f32(), |v: f32| f16::from_f32(v)
                .to_le_bytes()
                .to_vec())
        }
        DataType::BF16 => {
            float!(f32, |b: &[u8]| bf16::from_le_bytes(b.try_into().unwrap()).to_f32(), |v: f32| bf16::from_f32(v)
                .to_le_bytes()
                .to_vec())
        }
        DataType::I8 => int!(i8),
        DataType::U8 => int!(u8),
        DataType::I16 => int!(i16),
        DataType::I32 => int!(i32),
        DataType::I64 => int!(i64),
    }
}

/// Bytes that decode to ordinary finite values of `dtype` (NaN compares unequal to itself).
fn values(dtype: DataType, seed: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in seed {
        let v = (x % 2001) as f64 / 8.0 - 125.0;
        match dtype {
            DataType::F32 => out.extend((v as f32).to_le_bytes()),
            DataType::F64 => out.extend((v * 1.000001).to_le_bytes()),
            DataType::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            DataType::I8 => out.extend((x as i8).to_le_bytes()),
            DataType::U8 => out.extend((x as u8).to_le_bytes()),
            DataType::I16 => out.extend((x as i16).to_le_bytes()),
            DataType::I32 => out.extend((x as i32).to_le_bytes()),
            DataType::I64 => out.extend(((x as i64) << 20).wrapping_mul(x as i64).to_le_bytes()),
        }
    }
    out
}

/// Copies `v` to an offset of `shift` bytes, so kernels see unaligned data.
fn shifted(v: &[u8], shift: usize) -> Vec<u8> {
    let mut b = vec![0xAA; shift];
    b.extend_from_slice(v);
    b
}

fn check_all_paths(dtype: DataType, op: ReduceOp, srcs: &[Vec<u8>], shift: usize) {
    let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
    let want = reference(dtype, op, &refs);
    let bufs: Vec<Vec<u8>> = srcs.iter().map(|s| shifted(s, shift)).collect();
    let srcs: Vec<&[u8]> = bufs.iter().map(|b| &b[shift..]).collect();
    type Fold = fn(DataType, ReduceOp, &mut [u8], Option<usize>, &[&[u8]]);
    let mut paths: Vec<(&str, Fold)> = vec![("portable", kernel::fold_portable)];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        fn avx2(d: DataType, o: ReduceOp, dst: &mut [u8], w: Option<usize>, s: &[&[u8]]) {
            // SAFETY: only registered after the run-time check above found AVX2 and F16C.
            unsafe { kernel::fold_avx2(d, o, dst, w, s) }
        }
        paths.push(("avx2", avx2));
    }
    for (name, path) in paths {
        let mut dst = shifted(&vec![0x55; want.len()], shift);
        path(dtype, op, &mut dst[shift..], None, &srcs);
        assert_eq!(&dst[shift..], &want[..], "{name} many {dtype} {op}");
        // The same fold with any one source already in dst, at its place in the order.
        for k in 0..srcs.len() {
            let mut dst = shifted(srcs[k], shift);
            let others: Vec<&[u8]> = (0..srcs.len()).filter(|&j| j != k).map(|j| srcs[j]).collect();
            path(dtype, op, &mut dst[shift..], Some(k), &others);
            assert_eq!(&dst[shift..], &want[..], "{name} many with dst at {k} {dtype} {op}");
        }
        let mut acc = shifted(srcs[0], shift);
        for s in &srcs[1..] {
            path(dtype, op, &mut acc[shift..], Some(0), &[s]);
        }
        // Pairwise folding rounds half types at every step; compare with that reference.
        let mut pairwise = srcs[0].to_vec();
        for s in &srcs[1..] {
            pairwise = reference(dtype, op, &[&pairwise, s]);
        }
        assert_eq!(&acc[shift..], &pairwise[..], "{name} into {dtype} {op}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn kernels_match_reference(
        seeds in prop::collection::vec(prop::collection::vec(any::<u32>(), 0..1300), 1..5),
        shift in 0usize..8,
    ) {
        let len = seeds.iter().map(|s| s.len()).min().unwrap();
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|op| op.accepts(dtype)) {
                let srcs: Vec<Vec<u8>> = seeds.iter().map(|s| values(dtype, &s[..len])).collect();
                check_all_paths(dtype, op, &srcs, shift);
            }
        }
    }
}

#[test]
fn half_types_accumulate_in_f32_across_sources() {
    // 2048 + 1 + 1 in f16 rounds to 2048 pairwise but to 2050 when accumulated in f32.
    let srcs: Vec<Vec<u8>> = [2048.0f32, 1.0, 1.0].iter().map(|&v| f16::from_f32(v).to_le_bytes().to_vec()).collect();
    let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
    let mut dst = [0u8; 2];
    super::reduce_many(DataType::F16, ReduceOp::Sum, &mut dst, &refs);
    assert_eq!(f16::from_le_bytes(dst).to_f32(), 2050.0);
}

#[test]
fn divide_truncates_integers_and_divides_floats() {
    let mut i: Vec<u8> = [-7i32, 7, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    super::divide(DataType::I32, &mut i, 2);
    let got: Vec<i32> = i.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, [-3, 3, 4]);
    let mut f = 3.0f64.to_le_bytes();
    super::divide(DataType::F64, &mut f, 4);
    assert_eq!(f64::from_le_bytes(f), 0.75);
    let mut u = [255u8, 10];
    super::divide(DataType::U8, &mut u, 300);
    assert_eq!(u, [0, 0]);
}

#[test]
fn trailing_partial_elements_are_left_alone() {
    let src = [1u8, 0, 0, 0, 9];
    let mut dst = [2u8, 0, 0, 0, 7];
    super::reduce_into(DataType::I32, ReduceOp::Sum, &mut dst, &src);
    assert_eq!(dst, [3, 0, 0, 0, 7]);
}

/// f32 bit patterns where rounding to a half type turns: every high half (±0, subnormals,
/// normals, ±inf, NaNs of both signs) with low halves below, at and above the bf16 tie, and
/// the f16 ties and their neighbours (13 dropped bits), and the extremes.
fn rounding_cases() -> impl Iterator<Item = f32> {
    (0..=u16::MAX as u32).flat_map(|hi| {
        [0, 1, 0x0fff, 0x1000, 0x1001, 0x2fff, 0x3000, 0x7fff, 0x8000, 0x8001, 0xefff, 0xf000, 0xffff]
            .map(|lo| f32::from_bits(hi << 16 | lo))
    })
}

/// Checks one path's conversions (`convert`: narrowing `xs`, widening `hs`) against `half`'s
/// scalar ones, bit for bit, over every 16-bit pattern and the f32 rounding cases.
fn check_conversions(
    convert: impl Fn(&[f32], &[u16]) -> (Vec<u16>, Vec<f32>),
    narrow_ref: impl Fn(f32) -> u16,
    widen_ref: impl Fn(u16) -> f32,
    same_widening: impl Fn(f32, f32) -> bool,
) {
    // Odd lengths, so that the tails after the vector loops run too.
    let xs: Vec<f32> = rounding_cases().chain([1.5]).collect();
    let hs: Vec<u16> = (0..=u16::MAX).chain([0x3c00]).collect();
    let (narrow, wide) = convert(&xs, &hs);
    for (x, got) in xs.iter().zip(narrow) {
        assert_eq!(got, narrow_ref(*x), "narrowing {:#010x}", x.to_bits());
    }
    for (h, got) in hs.iter().zip(wide) {
        assert!(same_widening(got, widen_ref(*h)), "widening {h:#06x}: {:#010x}", got.to_bits());
    }
}

#[test]
fn bf16_conversions_are_halfs_bit_for_bit() {
    // Widening may leave a signaling NaN signaling (narrowing quiets it): compare quieted.
    let quiet = |v: f32| if v.is_nan() { v.to_bits() | 0x0040_0000 } else { v.to_bits() };
    check_conversions(
        kernel::bf16_conversions,
        |x| bf16::from_f32(x).to_bits(),
        |h| bf16::from_bits(h).to_f32(),
        |a, b| quiet(a) == quiet(b),
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn f16c_conversions_are_halfs_bit_for_bit() {
    if !std::arch::is_x86_feature_detected!("f16c") {
        return;
    }
    check_conversions(
        // SAFETY: F16C was detected just above.
        |xs, hs| unsafe { kernel::f16c_conversions(xs, hs) },
        |x| f16::from_f32(x).to_bits(),
        |h| f16::from_bits(h).to_f32(),
        |a, b| a.to_bits() == b.to_bits(),
    );
}
