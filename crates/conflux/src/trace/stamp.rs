//! What every record is stamped with: the time, as `CLOCK_MONOTONIC` nanoseconds, and the
//! recording thread's number (its name goes to the meta file).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::record::{Raw, NO_PEER};

/// `CLOCK_MONOTONIC` now, in nanoseconds (what the store's CLOCK request answers with).
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_MONOTONIC` in nanoseconds at `t`. `Instant` reads the same clock on Linux, so
/// instants the library already takes for its deadlines are stamps, with no clock read of
/// their own.
#[inline]
pub fn ns(t: Instant) -> u64 {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    let (base, base_ns) = *BASE.get_or_init(base_pair);
    match t.checked_duration_since(base) {
        Some(d) => base_ns + d.as_nanos() as u64,
        None => base_ns.saturating_sub(base.duration_since(t).as_nanos() as u64),
    }
}

/// An `Instant` and the clock's nanoseconds at the same moment, to within the narrowest of a
/// few brackets (two instants around one clock read). Without the bracket, a thread preempted
/// between the two reads shifted every stamp of the process: a rank on another host measured
/// its clock 13 us off where the offset is zero, beyond the uncertainty it stated.
fn base_pair() -> (Instant, u64) {
    let mut best: Option<(Duration, Instant, u64)> = None;
    for _ in 0..16 {
        let before = Instant::now();
        let clock = monotonic_ns();
        let after = Instant::now();
        let width = after.duration_since(before);
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, before + width / 2, clock));
        }
    }
    let (_, at, clock) = best.expect("bracketed at least once");
    (at, clock)
}

/// The names of the threads that recorded anything, by number, for every meta file.
pub(super) static THREADS: Mutex<Vec<String>> = Mutex::new(Vec::new());
pub(super) static THREAD_COUNT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: std::cell::Cell<u32> = const { std::cell::Cell::new(u32::MAX) };
}

/// This thread's number in traces.
#[inline]
pub fn thread_id() -> u32 {
    THREAD.with(|id| {
        if id.get() == u32::MAX {
            let mut names = THREADS.lock().unwrap_or_else(|p| p.into_inner());
            let cur = std::thread::current();
            let name = cur.name().map_or_else(|| format!("thread {:?}", cur.id()), str::to_owned);
            id.set(names.len() as u32);
            names.push(name);
            THREAD_COUNT.store(names.len(), Ordering::Release);
        }
        id.get()
    })
}

/// A record with nothing in it.
pub fn blank() -> Raw {
    Raw { peer: NO_PEER, ..bytemuck::Zeroable::zeroed() }
}
