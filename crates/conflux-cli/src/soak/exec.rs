//! Making one drawn call on a communicator and checking its result against `verify`'s exact
//! reference, computed from the inputs alone.
//!
//! Receive buffers start as POISON, a value no input or reduction of inputs takes, so a
//! buffer the call never wrote is caught; inputs shift with the iteration, so data left over
//! from the previous call (a stale slot, a stale message) is caught too.

use conflux::algo::select::{self, Call};
use conflux::{with_dtype, Communicator, Error};

use super::draw::{uneven_counts, Draw, Kind, Rng};
use crate::verify::{self, Num};

/// What recv buffers hold before the call: outside every result's range for the world sizes
/// soak runs (|sum| <= 5 x ranks, products are powers of two), and exact in every dtype.
const POISON: f64 = 111.0;

/// How one call went on this rank.
#[derive(Debug)]
pub enum Outcome {
    /// The result matched the reference; `elems` elements were checked.
    Right { elems: usize },
    /// `wrong` elements (or the call's behaviour, when 0) differ from the reference.
    Wrong { wrong: usize, detail: String },
    /// The forced algorithm cannot serve the call, as predicted, and the library said so.
    Refused,
    /// Nothing to do on a communicator of this size (send/recv on one rank).
    Skipped,
}

/// Runs `d` on `comm`. `iter` shifts the inputs; `corrupt`, when set, makes this call damage
/// one element of its result before checking (and is then cleared): how the tests prove that
/// the checker can fail. Errors other than a predicted refusal are returned as they are.
pub fn run(comm: &Communicator, d: &Draw, iter: u64, corrupt: &mut bool) -> conflux::Result<Outcome> {
    // 5 x 3 = 15 = 4 (mod 11): consecutive iterations differ in every element (verify's
    // inputs repeat every 11 elements).
    let base = (iter % 11) as usize * 5;
    with_dtype!(d.dtype, T => run_typed::<T>(comm, d, base, corrupt))
}

/// A result and the reference it must match, element by element.
type Checked<'a, T> = (Vec<T>, Box<dyn Fn(usize) -> f64 + 'a>);

fn run_typed<T: Num>(comm: &Communicator, d: &Draw, base: usize, corrupt: &mut bool) -> conflux::Result<Outcome> {
    let h = comm.with_algo(d.algo);
    let (n, r) = (comm.size(), comm.rank());
    let count = d.bytes / T::DTYPE.size();
    let block = count / n;
    let mut sub = Rng::new(d.detail);
    let root = sub.below(n);
    let redop = d.redop;
    let dt = T::DTYPE;
    let counts = (d.kind == Kind::AllToAllV).then(|| uneven_counts(&mut sub, n, block));
    let refusal = expected_refusal(comm, d, count);
    // Element `i` of rank `rank`'s input; the same function is the reference below.
    let input = move |rank: usize, i: usize| verify::input(dt, redop, rank, base + i);
    let filled = |rank: usize, len: usize| -> Vec<T> {
        let mut v = vec![T::zeroed(); len];
        verify::fill(&mut v, redop, rank, base);
        v
    };
    let poison = |len: usize| vec![T::from_f64(POISON); len];
    let reduced = move |i: usize| verify::reduced(dt, redop, n, base + i);

    let result: conflux::Result<Option<Checked<T>>> = (|| {
        let checked: Checked<T> = match d.kind {
            Kind::AllReduce => {
                let got = if d.nonblocking {
                    h.all_reduce_async(filled(r, count), redop).wait()?
                } else if d.in_place {
                    let mut buf = filled(r, count);
                    h.all_reduce(&mut buf, redop)?;
                    buf
                } else {
                    let mut recv = poison(count);
                    h.all_reduce_into(&filled(r, count), &mut recv, redop)?;
                    recv
                };
                (got, Box::new(reduced))
            }
            Kind::Broadcast => {
                let buf = if r == root { filled(r, count) } else { poison(count) };
                let got = if d.nonblocking {
                    h.broadcast_async(buf, root).wait()?
                } else {
                    let mut buf = buf;
                    h.broadcast(&mut buf, root)?;
                    buf
                };
                (got, Box::new(move |i| input(root, i)))
            }
            Kind::Reduce => {
                let out_of_place = !d.in_place && !d.nonblocking;
                let got = if d.nonblocking {
                    h.reduce_async(filled(r, count), redop, root).wait()?
                } else if d.in_place {
                    let mut buf = filled(r, count);
                    h.reduce(&mut buf, redop, root)?;
                    buf
                } else {
                    let mut recv = poison(count);
                    h.reduce_into(&filled(r, count), &mut recv, redop, root)?;
                    recv
                };
                // Elsewhere than the root the buffer stays as it was: the input, or untouched.
                let want: Box<dyn Fn(usize) -> f64> = match (r == root, out_of_place) {
                    (true, _) => Box::new(reduced),
                    (false, true) => Box::new(|_| POISON),
                    (false, false) => Box::new(move |i| input(r, i)),
                };
                (got, want)
            }
            Kind::AllGather => {
                let got = if d.in_place || d.nonblocking {
                    let mut buf = poison(block * n);
                    buf[r * block..(r + 1) * block].copy_from_slice(&filled(r, block));
                    if d.nonblocking {
                        h.all_gather_async(buf).wait()?
                    } else {
                        h.all_gather_in_place(&mut buf)?;
                        buf
                    }
                } else {
                    let mut recv = poison(block * n);
                    h.all_gather(&filled(r, block), &mut recv)?;
                    recv
                };
                let b = block.max(1);
                (got, Box::new(move |i| input(i / b, i % b)))
            }
            Kind::ReduceScatter => {
                let got = if d.in_place || d.nonblocking {
                    let buf = filled(r, block * n);
                    let buf = if d.nonblocking {
                        h.reduce_scatter_async(buf, redop).wait()?
                    } else {
                        let mut buf = buf;
                        h.reduce_scatter_in_place(&mut buf, redop)?;
                        buf
                    };
                    // Only this rank's block is defined afterwards.
                    buf[r * block..(r + 1) * block].to_vec()
                } else {
                    let mut recv = poison(block);
                    h.reduce_scatter(&filled(r, block * n), &mut recv, redop)?;
                    recv
                };
                (got, Box::new(move |i| reduced(r * block + i)))
            }
            Kind::AllToAll => {
                let send = filled(r, block * n);
                let got = if d.nonblocking {
                    let even = vec![block; n];
                    h.all_to_all_v_async(send, &even, poison(block * n), &even).wait()?.1
                } else {
                    let mut recv = poison(block * n);
                    h.all_to_all(&send, &mut recv)?;
                    recv
                };
                let b = block.max(1);
                // Block s of mine is block r of rank s's send buffer.
                (got, Box::new(move |i| input(i / b, r * block + i % b)))
            }
            Kind::AllToAllV => {
                let c = counts.clone().expect("drawn for all_to_all_v");
                let send_counts = c[r].clone();
                let recv_counts: Vec<usize> = (0..n).map(|s| c[s][r]).collect();
                let send = filled(r, send_counts.iter().sum());
                let recv = poison(recv_counts.iter().sum());
                let got = if d.nonblocking {
                    h.all_to_all_v_async(send, &send_counts, recv, &recv_counts).wait()?.1
                } else {
                    let mut recv = recv;
                    h.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
                    recv
                };
                (got, Box::new(move |i| a2av_expected(&c, r, i, &input)))
            }
            Kind::Barrier => {
                if d.nonblocking {
                    h.barrier_async().wait()?;
                } else {
                    h.barrier()?;
                }
                return Ok(None);
            }
            Kind::SendRecv => {
                if n < 2 {
                    return Ok(None);
                }
                let shift = 1 + (d.detail as usize >> 8) % (n - 1);
                let (to, from) = ((r + shift) % n, (r + n - shift) % n);
                let tag = (d.detail & 0xffff) as u32;
                let sent = h.send_async(filled(r, count), to, tag);
                let got = if d.nonblocking {
                    h.recv_async(poison(count), from, tag).wait()?
                } else {
                    let mut buf = poison(count);
                    h.recv(&mut buf, from, tag)?;
                    buf
                };
                sent.wait()?;
                (got, Box::new(move |i| input(from, i)))
            }
        };
        Ok(Some(checked))
    })();

    let checked = match (result, refusal) {
        (Err(Error::InvalidArgument(_)), Some(_)) => return Ok(Outcome::Refused),
        (Err(e), _) => return Err(e),
        (Ok(_), Some(why)) => {
            return Ok(Outcome::Wrong { wrong: 0, detail: format!("ran, though it should be refused: {why}") })
        }
        (Ok(None), None) => {
            return Ok(if d.kind == Kind::SendRecv { Outcome::Skipped } else { Outcome::Right { elems: 0 } })
        }
        (Ok(Some(c)), None) => c,
    };
    let (mut got, want) = checked;
    if *corrupt && !got.is_empty() {
        damage(&mut got, &want);
        *corrupt = false;
    }
    let wrong = verify::count_wrong(&got, &want);
    if wrong == 0 {
        return Ok(Outcome::Right { elems: got.len() });
    }
    let (at, g, w) = verify::first_wrong(&got, &want).expect("some element is wrong");
    Ok(Outcome::Wrong {
        wrong,
        detail: format!("{wrong} of {} elements wrong, first at {at}: got {g}, want {w}", got.len()),
    })
}

/// Where rank `r`'s element `i` of an all_to_all_v comes from, and so its value: the block of
/// rank s sits after the blocks of ranks below s; rank s cut it from its own send buffer
/// after the blocks it sent to ranks below r.
fn a2av_expected(c: &[Vec<usize>], r: usize, i: usize, input: &dyn Fn(usize, usize) -> f64) -> f64 {
    let mut start = 0;
    for (s, row) in c.iter().enumerate() {
        let len = row[r];
        if i < start + len {
            let offset: usize = row[..r].iter().sum();
            return input(s, offset + i - start);
        }
        start += len;
    }
    f64::NAN
}

/// Why the library must refuse `d` (a forced algorithm that cannot serve it here), as the
/// algorithm selection's own rules say; None when it must run.
fn expected_refusal(comm: &Communicator, d: &Draw, count: usize) -> Option<String> {
    let (algo, op) = (d.algo?, d.kind.op_kind()?);
    // Only all_to_all itself has equal blocks as the library sees them: all_to_all_v (the
    // non-blocking all_to_all's way too) never does, whatever the counts, so that every rank
    // judges alike.
    let even = d.kind == Kind::AllToAll && !d.nonblocking;
    let call = Call { op, bytes: count * d.dtype.size(), even, pieces: false, half: d.dtype.is_half() };
    select::serves(algo, &call, comm.topology()).err()
}

/// Changes the middle element of `got` to a value its reference rejects.
fn damage<T: Num>(got: &mut [T], want: &dyn Fn(usize) -> f64) {
    let k = got.len() / 2;
    let w = want(k);
    let bad = [POISON, w + 1.0, w - 1.0, -w - 7.0, 0.0]
        .into_iter()
        .map(T::from_f64)
        .find(|v| !verify::matches(T::DTYPE, v.to_f64(), w));
    if let Some(v) = bad {
        got[k] = v;
    }
}

/// A reduce op's name for reports, or "-" for calls that do not reduce.
pub fn redop_label(d: &Draw) -> &'static str {
    match d.kind {
        Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter => d.redop.name(),
        _ => "-",
    }
}
