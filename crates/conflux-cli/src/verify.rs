//! Inputs every rank can compute for any rank, and the expected result of each collective
//! computed independently of conflux (exactly, in i128 or f64), so that `conflux bench --check`
//! and the test programs count wrong elements the same way.
//!
//! Inputs are small integers, exact in every dtype (bf16 included), so a sum over up to 64
//! ranks is exact and only Avg's final division rounds.

use conflux::{DataType, Element, ReduceOp};
use half::{bf16, f16};

/// Conversions between an element type and f64 for inputs and checking.
pub trait Num: Element + Copy {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
num_float!(f32, f64, i8, u8, i16, i32, i64);

impl Num for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}
impl Num for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

/// Element `i` of rank `rank`'s input for a reduction with `op` (or any other collective).
pub fn input(dtype: DataType, op: ReduceOp, rank: usize, i: usize) -> f64 {
    let unsigned = dtype == DataType::U8;
    if op == ReduceOp::Prod {
        // |product| <= 2^ranks stays exact in floats; integers wrap, as the reference does.
        let v: f64 = [1.0, 2.0, -1.0][(rank + i) % 3];
        return if unsigned { v.abs() } else { v };
    }
    let v = ((rank * 7 + i * 3) % 11) as f64;
    if unsigned {
        v
    } else {
        v - 5.0
    }
}

/// Wraps an exact integer result into `dtype`'s range, as wrapping arithmetic would.
fn wrap(dtype: DataType, v: i128) -> f64 {
    match dtype {
        DataType::I8 => v as i8 as f64,
        DataType::U8 => v as u8 as f64,
        DataType::I16 => v as i16 as f64,
        DataType::I32 => v as i32 as f64,
        DataType::I64 => v as i64 as f64,
        _ => v as f64,
    }
}

/// The reduction of element `i` over `ranks` ranks, computed exactly.
pub fn reduced(dtype: DataType, op: ReduceOp, ranks: usize, i: usize) -> f64 {
    let vals = (0..ranks).map(|r| input(dtype, op, r, i));
    if dtype.is_float() {
        return match op {
            ReduceOp::Sum => vals.sum(),
            ReduceOp::Avg => vals.sum::<f64>() / ranks as f64,
            ReduceOp::Prod => vals.product(),
            ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
            // Not defined on floats; the communicator rejects the call.
            ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => f64::NAN,
        };
    }
    let ints = vals.map(|v| v as i128);
    match op {
        ReduceOp::Sum => wrap(dtype, ints.sum()),
        // Integer Avg: the wrapped sum divided by the rank count, truncating.
        ReduceOp::Avg => {
            let s = wrap(dtype, ints.sum()) as i128;
            (s / ranks as i128) as f64
        }
        ReduceOp::Prod => wrap(dtype, ints.fold(1i128, |a, b| wrap(dtype, a * b) as i128)),
        ReduceOp::Min => ints.min().unwrap_or(0) as f64,
        ReduceOp::Max => ints.max().unwrap_or(0) as f64,
        ReduceOp::BitAnd => wrap(dtype, ints.fold(-1i128, |a, b| a & b)),
        ReduceOp::BitOr => wrap(dtype, ints.fold(0i128, |a, b| a | b)),
        ReduceOp::BitXor => wrap(dtype, ints.fold(0i128, |a, b| a ^ b)),
    }
}

/// How far a result may be from the exact value: relative for floats, zero for integers.
pub fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => 1e-6,
        DataType::F64 => 1e-12,
        DataType::F16 => 2e-3,
        DataType::BF16 => 1e-2,
        _ => 0.0,
    }
}

pub fn matches(dtype: DataType, got: f64, want: f64) -> bool {
    let tol = tolerance(dtype);
    if tol == 0.0 {
        got == want
    } else {
        (got - want).abs() <= tol * want.abs().max(1.0)
    }
}

/// Counts the elements of `got` that differ from `want(i)` (i = index within `got`).
pub fn count_wrong<T: Num>(got: &[T], want: impl Fn(usize) -> f64) -> usize {
    got.iter().enumerate().filter(|(i, g)| !matches(T::DTYPE, g.to_f64(), want(*i))).count()
}

/// The first wrong element, for a message: (index, got, want).
pub fn first_wrong<T: Num>(got: &[T], want: impl Fn(usize) -> f64) -> Option<(usize, f64, f64)> {
    got.iter()
        .enumerate()
        .find(|(i, g)| !matches(T::DTYPE, g.to_f64(), want(*i)))
        .map(|(i, g)| (i, g.to_f64(), want(i)))
}

/// Fills `buf` with rank `rank`'s input, element i being `input(.., base + i)`.
pub fn fill<T: Num>(buf: &mut [T], op: ReduceOp, rank: usize, base: usize) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = T::from_f64(input(T::DTYPE, op, rank, base + i));
    }
}
