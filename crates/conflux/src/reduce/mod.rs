//! Reduction kernels: AVX2 when the CPU has it, portable code otherwise.
use crate::dtype::{DataType, ReduceOp};
pub fn reduce_into(_d: DataType, _o: ReduceOp, _dst: &mut [u8], _src: &[u8]) { todo!() }
pub fn reduce_many(_d: DataType, _o: ReduceOp, _dst: &mut [u8], _srcs: &[&[u8]]) { todo!() }
pub fn divide(_d: DataType, _dst: &mut [u8], _n: usize) { todo!() }
pub fn kernel_name() -> &'static str { "x" }
