//! The reduction kernels on their own, against a plain copy of the same bytes: how far from
//! memory speed a reduction of N sources is. `cargo bench -p conflux --bench reduce`.

use conflux::reduce::{reduce_into, reduce_many};
use conflux::{DataType, ReduceOp};
use divan::counter::BytesCount;
use divan::Bencher;

fn main() {
    divan::main();
}

/// Sizes in bytes: one L1-resident message, one in L2, one that spills to memory.
const SIZES: [usize; 3] = [8 << 10, 256 << 10, 16 << 20];

fn buffers(len: usize, count: usize) -> Vec<Vec<u8>> {
    // Offsets of one byte from the allocation keep the kernels honest about alignment.
    (0..count).map(|k| (0..len + 1).map(|i| (i * 7 + k * 13) as u8 & 0x3f).collect()).collect()
}

#[divan::bench(args = SIZES)]
fn copy(b: Bencher, len: usize) {
    let (src, mut dst) = (buffers(len, 1).remove(0), vec![0u8; len]);
    b.counter(BytesCount::new(len)).bench_local(|| dst.copy_from_slice(divan::black_box(&src[1..])));
}

#[divan::bench(args = SIZES, types = [F32, F64, I32, F16, Bf16])]
fn into<D: Dtype>(b: Bencher, len: usize) {
    let (src, mut dst) = (buffers(len, 1).remove(0), buffers(len, 1).remove(0));
    b.counter(BytesCount::new(len))
        .bench_local(|| reduce_into(D::DTYPE, ReduceOp::Sum, &mut dst[1..], divan::black_box(&src[1..])));
}

#[divan::bench(args = SIZES, types = [F32, F16, Bf16])]
fn many_of_4<D: Dtype>(b: Bencher, len: usize) {
    let srcs = buffers(len, 4);
    let srcs: Vec<&[u8]> = srcs.iter().map(|s| &s[1..]).collect();
    let mut dst = vec![0u8; len];
    b.counter(BytesCount::new(len))
        .bench_local(|| reduce_many(D::DTYPE, ReduceOp::Sum, &mut dst, divan::black_box(&srcs)));
}

trait Dtype {
    const DTYPE: DataType;
}
macro_rules! dtypes {
    ($($name:ident = $d:ident),*) => {$(
        struct $name;
        impl Dtype for $name {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}
dtypes!(F32 = F32, F64 = F64, I32 = I32, F16 = F16, Bf16 = BF16);
