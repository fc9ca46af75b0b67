//! Trees: O(log N) steps, for small messages.
//!
//! - broadcast and reduce: the binomial tree rooted at the root (rank distance 1, 2, 4...).
//! - all_reduce: NCCL's double binary tree. Two binary trees over the ranks, each carrying half
//!   of the message: reduce up to the root, broadcast back down, both pipelined in chunks. In
//!   the first tree the leaves are the odd ranks; the second is the first shifted by one rank
//!   (even N) or mirrored (odd N), so nearly every rank that is a leaf in one tree is interior
//!   in the other, and both halves keep every rank's links busy.
//!
//! The trees are pure data (`binary`, `double`), tested without sockets below.

use std::ops::Range;

use smallvec::SmallVec;

use super::{carve, split2, Step};
use crate::dtype::{DataType, ReduceOp};
use crate::reduce;
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// One rank's place in a tree.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Node {
    pub parent: Option<usize>,
    pub children: Vec<usize>,
}

/// The in-order binary tree over ranks 0..n that NCCL builds: rank 0 is the root with one
/// child, a rank's lowest set bit b gives its parent (at distance b, upwards) and its children
/// (at distance b/2, or the nearest smaller distance that stays below n).
pub(crate) fn binary(n: usize, rank: usize) -> Node {
    let mut bit = 1;
    while bit < n && rank & bit == 0 {
        bit <<= 1;
    }
    if rank == 0 {
        let children = if n > 1 { vec![bit >> 1] } else { Vec::new() };
        return Node { parent: None, children };
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let mut children = Vec::new();
    let mut low = bit >> 1;
    if low > 0 {
        children.push(rank - low);
        while low > 0 && rank + low >= n {
            low >>= 1;
        }
        if low > 0 {
            children.push(rank + low);
        }
    }
    Node { parent: Some(up), children }
}

/// This rank's place in the two trees of the double binary tree.
pub(crate) fn double(n: usize, rank: usize) -> [Node; 2] {
    let first = binary(n, rank);
    // Into the first tree's numbering (shift back by one, or mirror) and out of it.
    let even = n.is_multiple_of(2);
    let to = |r: usize| if even { (r + n - 1) % n } else { n - 1 - r };
    let from = |r: usize| if even { (r + 1) % n } else { n - 1 - r };
    let t = binary(n, to(rank));
    let second = Node { parent: t.parent.map(&from), children: t.children.into_iter().map(&from).collect() };
    [first, second]
}

/// Binomial broadcast: this rank receives once from its parent, then sends to its children,
/// farthest first, so the subtrees fill in parallel.
pub(crate) fn broadcast(t: &mut Transport, s: &Step, buf: &mut [u8], root: usize) -> Result<(), LinkError> {
    let n = s.size;
    let vr = (s.rank + n - root) % n;
    let real = |v: usize| (v + root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let peer = real(vr - mask);
            t.exchange(&mut [Xfer::Recv { peer, tag: s.tag, sink: Sink::Copy(buf) }], s.deadline)?;
            break;
        }
        mask <<= 1;
    }
    let mut sends: SmallVec<[Xfer<'_>; 8]> = SmallVec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            sends.push(Xfer::Send { peer: real(vr + mask), tag: s.tag, data: buf });
        }
        mask >>= 1;
    }
    // A leaf is done: an exchange of nothing would still make a progress pass.
    if sends.is_empty() {
        return Ok(());
    }
    t.exchange(&mut sends, s.deadline)
}

/// Binomial reduce to `root`: each rank reduces its children's partial results, nearest first,
/// and sends its own to its parent. This rank's data is `src`, or `buf` itself when `src` is
/// None; `buf` is where the partial result builds up (the first child's data is combined with
/// `src` straight into it, no copy first). A leaf sends `src` as it is. Non-root ranks' `buf`
/// ends as scratch.
pub(crate) fn reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    mut src: Option<&[u8]>,
    root: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let n = s.size;
    let vr = (s.rank + n - root) % n;
    let real = |v: usize| (v + root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let peer = real(vr - mask);
            let data = src.unwrap_or(buf);
            return t.exchange(&mut [Xfer::Send { peer, tag: s.tag, data }], s.deadline);
        }
        if vr + mask < n {
            let peer = real(vr + mask);
            let sink = Sink::reduce(&mut *buf, src.take(), dtype, op);
            t.exchange(&mut [Xfer::Recv { peer, tag: s.tag, sink }], s.deadline)?;
        }
        mask <<= 1;
    }
    Ok(())
}

/// Chunk of the tree pipelines: small messages go in one, large ones fill the tree's depth.
const CHUNK: usize = 64 << 10;

/// Height (longest path down to a leaf) and depth (path up to the root) of `rank` in the
/// tree whose nodes `tree` gives.
fn height_depth(tree: &dyn Fn(usize) -> Node, rank: usize) -> (usize, usize) {
    fn height(tree: &dyn Fn(usize) -> Node, r: usize) -> usize {
        tree(r).children.iter().map(|&c| 1 + height(tree, c)).max().unwrap_or(0)
    }
    let (mut at, mut depth) = (rank, 0);
    while let Some(p) = tree(at).parent {
        at = p;
        depth += 1;
    }
    (height(tree, rank), depth)
}

/// all_reduce over the double binary tree: half `h` of the message goes over tree `h`.
///
/// Schedule. Up, a rank of height h sends chunk k - h to its parent at step k and takes
/// chunk k - h + 1 from its children; down, a rank of depth d takes chunk k - d + 1 from its
/// parent and sends chunk k - d to its children. So a step's sends hold only data that
/// earlier steps completed, and a step's receives match sends of the same or earlier steps
/// of other ranks: the two trees can share steps without waiting on each other in a cycle.
/// The lag between a send and its receive is at most the tree's height in chunks, which the
/// links buffer.
pub(crate) fn all_reduce(
    t: &mut Transport,
    s: &Step,
    buf: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), LinkError> {
    let (n, es) = (s.size, dtype.size());
    let trees = double(n, s.rank);
    let place = |which: usize| height_depth(&move |r| double(n, r)[which].clone(), s.rank);
    let places = [place(0), place(1)];
    let half = buf.len() / es / 2 * es;
    let (a, b) = buf.split_at_mut(half);
    let mut halves = [a, b];
    let chunk = (CHUNK / es).max(1) * es;
    let chunks = |h: &[u8]| h.len().div_ceil(chunk);
    let most = halves.iter().map(|h| chunks(h)).max().unwrap_or(0);
    let range = |h: &[u8], j: isize| {
        let j = j as usize;
        (j * chunk).min(h.len())..((j + 1) * chunk).min(h.len())
    };
    let within = |h: &[u8], j: isize| j >= 0 && (j as usize) < chunks(h);
    let mut extra: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let up_steps = most + places.iter().map(|p| p.0).max().unwrap_or(0) + 1;
    for k in 0..up_steps as isize {
        let mut xfers = Vec::new();
        let [h0, h1] = &mut halves;
        let [e0, e1] = &mut extra;
        for ((tr, &(height, _)), (h, scratch)) in trees.iter().zip(&places).zip([(h0, e0), (h1, e1)]) {
            let (sj, rj) = (k - height as isize, k - height as isize + 1);
            let send = (tr.parent.is_some() && within(h, sj)).then(|| range(h, sj));
            let recv = (!tr.children.is_empty() && within(h, rj)).then(|| range(h, rj));
            let empty = 0..0;
            let (out, into) = split2(h, send.as_ref().unwrap_or(&empty), recv.as_ref().unwrap_or(&empty));
            if let (Some(p), Some(_)) = (tr.parent, &send) {
                xfers.push(Xfer::Send { peer: p, tag: s.tag, data: out });
            }
            if recv.is_some() {
                // The first child reduces in place; the second lands in scratch, reduced after.
                let len = into.len();
                scratch.resize(len * (tr.children.len() - 1), 0);
                xfers.push(Xfer::Recv {
                    peer: tr.children[0],
                    tag: s.tag,
                    sink: Sink::Reduce { buf: into, dtype, op },
                });
                let each: Vec<Range<usize>> = (0..tr.children.len() - 1).map(|k| k * len..(k + 1) * len).collect();
                for (&c, mine) in tr.children[1..].iter().zip(carve(scratch, &each)) {
                    xfers.push(Xfer::Recv { peer: c, tag: s.tag, sink: Sink::Copy(mine) });
                }
            }
        }
        if xfers.is_empty() {
            continue;
        }
        t.exchange(&mut xfers, s.deadline)?;
        drop(xfers);
        for ((tr, &(height, _)), (h, scratch)) in trees.iter().zip(&places).zip(halves.iter_mut().zip(&extra)) {
            let rj = k - height as isize + 1;
            if tr.children.len() > 1 && within(h, rj) {
                let r = range(h, rj);
                for piece in scratch.chunks(r.len().max(1)) {
                    reduce::reduce_into(dtype, op, &mut h[r.clone()], piece);
                }
            }
        }
    }
    let down_steps = most + places.iter().map(|p| p.1).max().unwrap_or(0) + 1;
    for k in 0..down_steps as isize {
        let mut xfers = Vec::new();
        for ((tr, &(_, depth)), h) in trees.iter().zip(&places).zip(halves.iter_mut()) {
            let (rj, sj) = (k - depth as isize + 1, k - depth as isize);
            let recv = (tr.parent.is_some() && within(h, rj)).then(|| range(h, rj));
            let send = (!tr.children.is_empty() && within(h, sj)).then(|| range(h, sj));
            let empty = 0..0;
            let (out, into) = split2(h, send.as_ref().unwrap_or(&empty), recv.as_ref().unwrap_or(&empty));
            if send.is_some() {
                for &c in &tr.children {
                    xfers.push(Xfer::Send { peer: c, tag: s.tag, data: out });
                }
            }
            if let (Some(p), Some(_)) = (tr.parent, &recv) {
                xfers.push(Xfer::Recv { peer: p, tag: s.tag, sink: Sink::Copy(into) });
            }
        }
        if !xfers.is_empty() {
            t.exchange(&mut xfers, s.deadline)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank but one root has a parent that lists it as a child, and following parents
    /// from any rank reaches the root.
    fn assert_spanning(nodes: &[Node]) {
        let n = nodes.len();
        let roots: Vec<usize> = (0..n).filter(|&r| nodes[r].parent.is_none()).collect();
        assert_eq!(roots.len(), 1, "{nodes:?}");
        for r in 0..n {
            for &c in &nodes[r].children {
                assert_eq!(nodes[c].parent, Some(r), "child {c} of {r} in {nodes:?}");
            }
            if let Some(p) = nodes[r].parent {
                assert!(nodes[p].children.contains(&r), "{r}'s parent {p} in {nodes:?}");
            }
            let (mut at, mut hops) = (r, 0);
            while let Some(p) = nodes[at].parent {
                at = p;
                hops += 1;
                assert!(hops <= n, "cycle from {r}");
            }
            assert!(nodes[r].children.len() <= 2);
        }
    }

    #[test]
    fn both_trees_span_every_world_size() {
        for n in 1..=40 {
            let first: Vec<Node> = (0..n).map(|r| binary(n, r)).collect();
            assert_spanning(&first);
            let both: Vec<[Node; 2]> = (0..n).map(|r| double(n, r)).collect();
            assert_spanning(&both.iter().map(|b| b[0].clone()).collect::<Vec<_>>());
            assert_spanning(&both.iter().map(|b| b[1].clone()).collect::<Vec<_>>());
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // ranks and indices are the schedule's own terms
    fn the_trees_are_shallow_and_their_leaves_differ() {
        for n in [4usize, 7, 8, 9, 16, 31, 64] {
            let both: Vec<[Node; 2]> = (0..n).map(|r| double(n, r)).collect();
            let leaf = |t: usize, r: usize| both[r][t].children.is_empty();
            let leaves_of_both = (0..n).filter(|&r| leaf(0, r) && leaf(1, r)).count();
            // Shifting (even n) leaves at most one rank a leaf twice; mirroring (odd n) a few.
            let most = if n % 2 == 0 { 1 } else { n / 2 };
            assert!(leaves_of_both <= most, "n={n}: {leaves_of_both} ranks are leaves of both trees");
            for t in 0..2 {
                let depth = (0..n)
                    .map(|r| {
                        let (mut at, mut d) = (r, 0);
                        while let Some(p) = both[at][t].parent {
                            at = p;
                            d += 1;
                        }
                        d
                    })
                    .max()
                    .unwrap();
                assert!(depth <= 1 + 2 * (usize::BITS - n.leading_zeros()) as usize, "n={n} depth {depth}");
            }
        }
        assert_eq!(binary(8, 0), Node { parent: None, children: vec![4] });
        assert_eq!(binary(8, 4), Node { parent: Some(0), children: vec![2, 6] });
        assert_eq!(binary(8, 6), Node { parent: Some(4), children: vec![5, 7] });
        assert_eq!(binary(8, 7), Node { parent: Some(6), children: vec![] });
    }
}
