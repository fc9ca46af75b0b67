//! Two-level all_reduce for jobs that span nodes: reduce-scatter among the ranks of each node
//! (shared memory), all_reduce of each local rank's slice among the ranks with the same local
//! index on every node (TCP), then all-gather within each node. Each node's network link then
//! carries 2(M-1)/M of the message once, for M nodes, where a flat ring over all ranks sends
//! it in as many pieces as there are ranks and crosses nodes on the slowest links.
//!
//! Large messages go in segments, pipelined: at step t segment j runs its own step t - j, so
//! one segment's all-gather inside the node overlaps the next one's transfer across nodes
//! and the network link stays busy. The schedule is data (`plan`: per segment, a list of
//! ring moves), checked without sockets below, and run by `run`, which merges each step's
//! moves of every segment into one exchange.
//!
//! Needs the same number of ranks on every node (`Topo::uniform`).

use std::ops::Range;

use super::moves::{run_step, Move};
use super::{even_blocks, ring, Blocks, Circle, Ctx};
use crate::dtype::{DataType, ReduceOp};
use crate::transport::LinkError;

/// Segments from this size up; fewer, larger ones below.
const SEGMENT: usize = 4 << 20;

/// Every segment's moves for `rank`, in the order they run, for a message of `len` bytes of
/// `esize`-byte elements.
pub(crate) fn plan(nodes: &[Vec<usize>], rank: usize, len: usize, esize: usize) -> Vec<Vec<Move>> {
    let node = nodes.iter().position(|nd| nd.contains(&rank)).expect("every rank is on a node");
    let locals = &nodes[node];
    let local = locals.iter().position(|&r| r == rank).expect("on its node");
    let cross: Vec<usize> = nodes.iter().map(|nd| nd[local]).collect();
    let (within, across) = (Circle::among(locals, rank), Circle::among(&cross, rank));
    let segments = (len / SEGMENT).clamp(1, 16);
    let shifted =
        |b: Blocks, by: usize| -> Vec<Range<usize>> { b.into_iter().map(|r| r.start + by..r.end + by).collect() };
    even_blocks(len / esize, segments, esize)
        .into_iter()
        .map(|seg| {
            let blocks = shifted(even_blocks(seg.len() / esize, locals.len(), esize), seg.start);
            let mine = blocks[local].clone();
            let parts = shifted(even_blocks(mine.len() / esize, cross.len(), esize), mine.start);
            let mut moves: Vec<Move> = ring::moves(&within, &blocks, -1, true).collect();
            moves.extend(ring::moves(&across, &parts, 0, true));
            moves.extend(ring::moves(&across, &parts, 1, false));
            moves.extend(ring::moves(&within, &blocks, 0, false));
            moves
        })
        .collect()
}

pub(crate) fn all_reduce(cx: &mut Ctx<'_>, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), LinkError> {
    let (t, s) = (&mut *cx.t, &cx.s);
    let segments = plan(&cx.topo.nodes, s.rank, buf.len(), dtype.size());
    let steps = segments.iter().enumerate().map(|(j, m)| j + m.len()).max().unwrap_or(0);
    for step in 0..steps {
        let moves: Vec<&Move> =
            segments.iter().enumerate().filter_map(|(j, m)| step.checked_sub(j).and_then(|u| m.get(u))).collect();
        if moves.is_empty() {
            continue;
        }
        run_step(t, s, buf, &moves, Some((dtype, op)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every rank's plan on byte vectors (sum mod 256), step by step as `all_reduce` does:
    /// every rank must end with the sum of all inputs.
    #[allow(clippy::needless_range_loop)] // ranks index several tables at once
    fn simulate(nodes: &[Vec<usize>], len: usize) {
        let n: usize = nodes.iter().map(|nd| nd.len()).sum();
        let plans: Vec<Vec<Vec<Move>>> = (0..n).map(|r| plan(nodes, r, len, 1)).collect();
        let mut data: Vec<Vec<u8>> = (0..n).map(|r| (0..len).map(|i| (r * 31 + i * 7) as u8).collect()).collect();
        let want: Vec<u8> = (0..len).map(|i| (0..n).fold(0u8, |a, r| a.wrapping_add((r * 31 + i * 7) as u8))).collect();
        let steps = plans[0].iter().enumerate().map(|(j, m)| j + m.len()).max().unwrap_or(0);
        for step in 0..steps {
            let at = |r: usize| -> Vec<Move> {
                plans[r]
                    .iter()
                    .enumerate()
                    .filter_map(|(j, m)| step.checked_sub(j).and_then(|u| m.get(u).cloned()))
                    .collect()
            };
            // Messages from each sender to each receiver, in order.
            let mut sent: Vec<Vec<(usize, Vec<u8>)>> = vec![Vec::new(); n];
            for r in 0..n {
                for m in at(r) {
                    sent[m.to].push((r, data[r][m.send.clone()].to_vec()));
                }
            }
            for r in 0..n {
                for m in at(r) {
                    let k = sent[r].iter().position(|(from, _)| *from == m.from).expect("a message from that rank");
                    let (_, msg) = sent[r].remove(k);
                    assert_eq!(msg.len(), m.recv.len(), "step {step} rank {r}");
                    for (d, x) in data[r][m.recv.clone()].iter_mut().zip(msg) {
                        *d = if m.reduce { d.wrapping_add(x) } else { x };
                    }
                }
            }
        }
        for (r, d) in data.iter().enumerate() {
            assert_eq!(d, &want, "rank {r} of {nodes:?}, {len} bytes");
        }
    }

    #[test]
    fn the_pipelined_plan_reduces_everything_on_every_layout() {
        let layouts: Vec<Vec<Vec<usize>>> = vec![
            vec![vec![0, 1], vec![2, 3]],
            vec![vec![0], vec![1], vec![2], vec![3]],
            vec![vec![0, 1, 2], vec![3, 4, 5]],
            vec![vec![0, 2], vec![1, 3], vec![4, 5]],
            vec![vec![0, 1], vec![2, 3], vec![4, 5]],
        ];
        for nodes in &layouts {
            for len in [0, 1, 7, 1000, 3 * SEGMENT + 5] {
                simulate(nodes, len);
            }
        }
    }
}
