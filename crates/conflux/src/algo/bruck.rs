//! Bruck's algorithms: ceil(log2 N) steps for any N, each rank sending to rank - d and
//! receiving from rank + d (d = 1, 2, 4...), for small messages where steps are the cost.
//!
//! - all_gather: after step k a rank holds the 2^(k+1) blocks that follow its own, in a
//!   buffer rotated to start at its own block; a final copy puts them in rank order.
//! - all_to_all (equal blocks): rotate the blocks so block i goes to rank + i; at step k send
//!   every block whose index has bit k set to rank + 2^k; rotate back. Each block travels
//!   popcount(i) hops, against the pairwise exchange's one, so it wins only when step
//!   latency dominates.
//!
//! The block schedule is pure data (`gather_steps`), tested without sockets below.

use std::ops::Range;

use super::{Ctx, Step};
use crate::transport::{LinkError, Sink, Transport, Xfer};

/// The all-gather steps for n ranks: (distance d, blocks sent = blocks after d received).
pub(crate) fn gather_steps(n: usize) -> Vec<(usize, usize)> {
    let mut steps = Vec::new();
    let mut d = 1;
    while d < n {
        steps.push((d, d.min(n - d)));
        d *= 2;
    }
    steps
}

/// `buf` holds one block per rank (`blocks`), this rank's in place; afterwards all of them.
pub(crate) fn all_gather(cx: &mut Ctx<'_>, buf: &mut [u8], blocks: &[Range<usize>]) -> Result<(), LinkError> {
    let (t, s) = (&mut *cx.t, &cx.s);
    let (n, me) = (s.size, s.rank);
    let own = blocks[me].start;
    // Rotated: tmp starts with block `me`, then me+1, ..., wrapping around.
    let tmp = &mut *cx.staging;
    tmp.clear();
    tmp.extend_from_slice(&buf[own..]);
    tmp.extend_from_slice(&buf[..own]);
    let len_of = |i: usize| blocks[(me + i) % n].len();
    let upto = |c: usize| (0..c).map(len_of).sum::<usize>();
    let mut r = Ok(());
    for (d, c) in gather_steps(n) {
        let (have, want) = (upto(d), upto(d + c));
        let (out, into) = tmp.split_at_mut(have);
        let into = &mut into[..want - have];
        let (to, from) = ((me + n - d) % n, (me + d) % n);
        r = t.exchange(
            &mut [
                Xfer::Send { peer: to, tag: s.tag, data: &out[..upto(c)] },
                Xfer::Recv { peer: from, tag: s.tag, sink: Sink::Copy(into) },
            ],
            s.deadline,
        );
        if r.is_err() {
            break;
        }
    }
    if r.is_ok() {
        let tail = buf.len() - own;
        buf[own..].copy_from_slice(&tmp[..tail]);
        buf[..own].copy_from_slice(&tmp[tail..]);
    }
    r
}

/// all_to_all with every block `b` bytes: `send` block p goes to rank p, `recv` block p comes
/// from rank p.
pub(crate) fn all_to_all(t: &mut Transport, s: &Step, send: &[u8], recv: &mut [u8], b: usize) -> Result<(), LinkError> {
    let (n, me) = (s.size, s.rank);
    // tmp block i: the data bound for rank me + i (then, after the steps, from rank me - i).
    let mut tmp = Vec::with_capacity(n * b);
    for i in 0..n {
        let p = (me + i) % n;
        tmp.extend_from_slice(&send[p * b..(p + 1) * b]);
    }
    let mut out = Vec::new();
    let mut inbox = Vec::new();
    let mut d = 1;
    while d < n {
        let picked: Vec<usize> = (0..n).filter(|i| i & d != 0).collect();
        out.clear();
        for &i in &picked {
            out.extend_from_slice(&tmp[i * b..(i + 1) * b]);
        }
        inbox.resize(out.len(), 0);
        let (to, from) = ((me + d) % n, (me + n - d) % n);
        t.exchange(
            &mut [
                Xfer::Send { peer: to, tag: s.tag, data: &out },
                Xfer::Recv { peer: from, tag: s.tag, sink: Sink::Copy(&mut inbox) },
            ],
            s.deadline,
        )?;
        for (k, &i) in picked.iter().enumerate() {
            tmp[i * b..(i + 1) * b].copy_from_slice(&inbox[k * b..(k + 1) * b]);
        }
        d *= 2;
    }
    for i in 0..n {
        let p = (me + n - i) % n;
        recv[p * b..(p + 1) * b].copy_from_slice(&tmp[i * b..(i + 1) * b]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_steps_collect_every_block_exactly_once() {
        for n in 1..=40 {
            let mut have = 1;
            for (d, c) in gather_steps(n) {
                assert_eq!(have, d);
                have += c;
            }
            assert_eq!(have, n);
        }
    }

    /// Simulates the all_to_all's block movement (no sockets): every block must end where it
    /// belongs.
    #[test]
    #[allow(clippy::needless_range_loop)] // ranks and indices are the schedule's own terms
    fn all_to_all_schedule_delivers_every_block() {
        for n in 1..=13 {
            // tmp[r][i] = (origin, destination) of the block rank r holds at index i.
            let mut tmp: Vec<Vec<(usize, usize)>> =
                (0..n).map(|r| (0..n).map(|i| (r, (r + i) % n)).collect()).collect();
            let mut d = 1;
            while d < n {
                let sent: Vec<Vec<(usize, usize)>> =
                    (0..n).map(|r| (0..n).filter(|i| i & d != 0).map(|i| tmp[r][i]).collect()).collect();
                for (r, row) in tmp.iter_mut().enumerate() {
                    let from = (r + n - d) % n;
                    for (k, i) in (0..n).filter(|i| i & d != 0).enumerate() {
                        row[i] = sent[from][k];
                    }
                }
                d *= 2;
            }
            for r in 0..n {
                for i in 0..n {
                    assert_eq!(tmp[r][i], ((r + n - i) % n, r), "n={n} rank {r} index {i}");
                }
            }
        }
    }
}
