//! The reduction kernels on their own, against a plain copy of the same bytes: how far from
//! memory speed a reduction of N sources is. `cargo bench -p conflux --bench reduce`.

use conflux::reduce::{reduce_into, reduce_many};
use conflux::{half, DataType, ReduceOp};
use divan::counter::BytesCount;
use divan::Bencher;

fn main() {
    divan::main();
}

/// Sizes in bytes: one L1-resident message, one in L2, one that spills to memory.
const SIZES: [usize; 3] = [8 << 10, 256 << 10, 16 << 20];

/// `count` buffers of `len` bytes (plus one, so that each can start unaligned), holding ordinary
/// values of `dtype`: no subnormals or infinities, whose arithmetic is slower.
fn buffers(dtype: DataType, len: usize, count: usize) -> Vec<Vec<u8>> {
    let value = |i: usize, k: usize| ((i * 7 + k * 13) % 64) as f64 / 8.0 - 4.0;
    let encode = |v: f64| -> Vec<u8> {
        match dtype {
            DataType::F32 => (v as f32).to_ne_bytes().to_vec(),
            DataType::F64 => v.to_ne_bytes().to_vec(),
            DataType::F16 => half::f16::from_f64(v).to_ne_bytes().to_vec(),
            DataType::BF16 => half::bf16::from_f64(v).to_ne_bytes().to_vec(),
            // Integers: small values, in as many bytes as the type has.
            int => ((v * 8.0) as i64).to_le_bytes()[..int.size()].to_vec(),
        }
    };
    let es = dtype.size();
    (0..count)
        .map(|k| {
            let mut b = vec![0u8];
            b.extend((0..len / es).flat_map(|i| encode(value(i, k))));
            b
        })
        .collect()
}

#[divan::bench(args = SIZES)]
fn copy(b: Bencher, len: usize) {
    let (src, mut dst) = (vec![7u8; len + 1], vec![0u8; len]);
    b.counter(BytesCount::new(len)).bench_local(|| dst.copy_from_slice(divan::black_box(&src[1..])));
}

/// `dst = dst + src`, with `dst` restored before every call so that sums stay ordinary values.
#[divan::bench(args = SIZES, types = [F32, F64, I32, F16, Bf16])]
fn into<D: Dtype>(b: Bencher, len: usize) {
    let mut bufs = buffers(D::DTYPE, len, 2);
    let (dst, src) = (bufs.remove(0), bufs.remove(0));
    b.counter(BytesCount::new(len))
        .with_inputs(|| dst.clone())
        .bench_local_refs(|dst| reduce_into(D::DTYPE, ReduceOp::Sum, &mut dst[1..], divan::black_box(&src[1..])));
}

#[divan::bench(args = SIZES, types = [F32, F16, Bf16])]
fn many_of_4<D: Dtype>(b: Bencher, len: usize) {
    let srcs = buffers(D::DTYPE, len, 4);
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
