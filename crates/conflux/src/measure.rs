//! Timing primitives shared by everything that measures links: `Communicator::link_health`
//! and `conflux tune`. One copy, so that both report the same thing by the same name.

use std::time::Instant;

use crate::comm::Communicator;
use crate::error::Result;

/// The median of `v` (sorted in place); NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        l if l % 2 == 1 => v[l / 2],
        l => (v[l / 2 - 1] + v[l / 2]) / 2.0,
    }
}

/// Median µs of `f` over `n` runs after `warm` of warm-up; the first error stops it.
pub fn median_us<E>(warm: usize, n: usize, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    let mut t = Vec::with_capacity(n);
    for i in 0..warm + n {
        let s = Instant::now();
        f()?;
        if i >= warm {
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(&mut t))
}

/// One round trip of `buf` between this rank and `peer` over their real link: the lower rank
/// sends and receives the echo, the higher one receives and sends it back. Both must call it.
pub fn echo(comm: &Communicator, peer: usize, buf: &mut [u8], tag: u32) -> Result<()> {
    if comm.rank() < peer {
        comm.send(buf, peer, tag)?;
        comm.recv(buf, peer, tag)
    } else {
        comm.recv(buf, peer, tag)?;
        comm.send(buf, peer, tag)
    }
}

/// The median round trip (µs) of `buf` with `peer`, `n` timed after `warm` untimed; both
/// ranks call it with the same arguments, and both get their own measurement.
pub fn round_trip_us(comm: &Communicator, peer: usize, buf: &mut [u8], warm: usize, n: usize, tag: u32) -> Result<f64> {
    median_us(warm, n, || echo(comm, peer, buf, tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn median_us_stops_at_the_first_error() {
        let mut calls = 0;
        let r: Result<f64, &str> = median_us(1, 5, || {
            calls += 1;
            if calls == 3 {
                Err("third")
            } else {
                Ok(())
            }
        });
        assert_eq!((r, calls), (Err("third"), 3));
        assert!(median_us::<()>(0, 3, || Ok(())).unwrap() >= 0.0);
    }
}
