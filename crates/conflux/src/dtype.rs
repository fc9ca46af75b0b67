//! Element types a collective can carry, and the reduce operations over them.

use half::{bf16, f16};
use std::fmt;

/// The element type of a buffer, as carried in fingerprints and used to pick a reduction kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    U8,
    I16,
    I32,
    I64,
}

impl DataType {
    pub const ALL: [DataType; 9] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::U8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::BF16 | DataType::I16 => 2,
            DataType::F32 | DataType::I32 => 4,
            DataType::F64 | DataType::I64 => 8,
        }
    }

    /// nccl-tests' spelling ("float", "half", ...), used in bench tables.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I16 => "int16",
            DataType::I32 => "int32",
            DataType::I64 => "int64",
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16)
    }

    /// f16 or bf16: stored in 16 bits, reduced in f32.
    pub const fn is_half(self) -> bool {
        matches!(self, DataType::F16 | DataType::BF16)
    }

    /// Parses the names `name()` prints and the short Rust names (f32, bf16, i8, ...).
    pub fn parse(s: &str) -> Option<DataType> {
        let s = s.to_ascii_lowercase();
        Some(match s.as_str() {
            "f32" | "float" | "float32" => DataType::F32,
            "f64" | "double" | "float64" => DataType::F64,
            "f16" | "half" | "float16" => DataType::F16,
            "bf16" | "bfloat16" => DataType::BF16,
            "i8" | "int8" => DataType::I8,
            "u8" | "uint8" => DataType::U8,
            "i16" | "int16" | "short" => DataType::I16,
            "i32" | "int32" | "int" => DataType::I32,
            "i64" | "int64" => DataType::I64,
            _ => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that collectives accept; sealed so that every element has a kernel.
pub trait Element: bytemuck::Pod + Send + Sync + 'static + sealed::Sealed {
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DataType = DataType::$d; }
    )*};
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, u8 => U8, i16 => I16, i32 => I32, i64 => I64);

/// How a reduction combines elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    /// Sum, then divide by the number of ranks (integers: truncating division, as NCCL does).
    Avg,
    /// Bitwise and (integers only).
    BitAnd,
    /// Bitwise or (integers only).
    BitOr,
    /// Bitwise exclusive or (integers only).
    BitXor,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    /// True for the bitwise ops, which floating-point types do not have.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor)
    }

    /// Whether this op is defined on `dtype`: everything but bitwise ops on floats.
    pub const fn accepts(self, dtype: DataType) -> bool {
        !(self.is_bitwise() && dtype.is_float())
    }

    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    pub fn parse(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|op| op.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Calls `$body` with `$T` bound to the Rust type of a runtime `DataType`.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DataType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DataType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DataType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DataType::BF16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DataType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DataType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DataType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DataType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DataType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}
