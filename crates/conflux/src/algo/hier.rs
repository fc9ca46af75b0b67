//! Two-level all_reduce for jobs that span nodes: reduce-scatter among the ranks of each node
//! (shared memory), all_reduce of each local rank's slice among the ranks with the same local
//! index on every node (TCP), then all-gather within each node. Each node's network link then
//! carries 2(M-1)/M of the message once, for M nodes, where a flat ring over all ranks sends
//! it in as many pieces as there are ranks and crosses nodes on the slowest links.
//!
//! Needs the same number of ranks on every node (`Topo::uniform`).

use super::{even_blocks, ring, Circle, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::transport::{LinkError, Transport};

pub(crate) fn all_reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let nodes = t.topo.nodes.clone();
    let node = nodes.iter().position(|nd| nd.contains(&s.rank)).expect("every rank is on a node");
    let locals = &nodes[node];
    let local = locals.iter().position(|&r| r == s.rank).expect("on its node");
    let cross: Vec<usize> = nodes.iter().map(|nd| nd[local]).collect();
    let es = dtype.size();
    let blocks = even_blocks(buf.len() / es, locals.len(), es);
    let within = Circle::among(locals, s.rank);
    if locals.len() > 1 {
        ring::reduce_scatter(t, s, &within, buf, &blocks, -1, dtype, op)?;
    }
    let part = &mut buf[blocks[local].clone()];
    let across = Circle::among(&cross, s.rank);
    let cb = even_blocks(part.len() / es, cross.len(), es);
    ring::all_reduce(t, s, &across, part, &cb, dtype, op)?;
    if locals.len() > 1 {
        ring::all_gather(t, s, &within, buf, &blocks, 0)?;
    }
    Ok(())
}
