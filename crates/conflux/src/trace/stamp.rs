//! What every record is stamped with: the time, as `CLOCK_MONOTONIC` nanoseconds, and the
//! recording thread's number (its name goes to the meta file).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::record::{Raw, NO_PEER};

/// `CLOCK_MONOTONIC` in nanoseconds at `t`. `Instant` reads the same clock on Linux, so
/// instants the library already takes for its deadlines are stamps, with no clock read of
/// their own.
#[inline]
pub fn ns(t: Instant) -> u64 {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    let (base, base_ns) = *BASE.get_or_init(|| {
        let now = Instant::now();
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        (now, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    });
    match t.checked_duration_since(base) {
        Some(d) => base_ns + d.as_nanos() as u64,
        None => base_ns.saturating_sub(base.duration_since(t).as_nanos() as u64),
    }
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
