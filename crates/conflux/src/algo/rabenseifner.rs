//! Rabenseifner's all_reduce: a recursive-halving reduce-scatter, then a recursive-doubling
//! all-gather, over the p = 2^k active ranks of `fold.rs`. 2 log2 p steps and the ring's
//! 2(p-1)/p bytes per rank: between recursive doubling (few steps, whole buffer each) and the
//! ring (few bytes, many steps), for medium messages. A world that is not a power of two pays
//! one whole-buffer step before and after, for the folded pairs.

use super::rd::{doubling, folded_all_reduce, halving};
use super::{even_blocks, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::transport::{LinkError, Transport};

pub(crate) fn all_reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    folded_all_reduce(t, s, buf, dtype, op, |t, buf, v, f| {
        let vb = even_blocks(buf.len() / dtype.size(), f.p, dtype.size());
        halving(t, s, buf, &vb, v, |v| f.rank_of(v), (dtype, op))?;
        doubling(t, s, buf, &vb, v, |v| f.rank_of(v))
    })
}
