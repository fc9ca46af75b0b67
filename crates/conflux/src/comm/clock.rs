//! The time a call starts, read cheaply: every call takes one (its deadline, the flight
//! recorder's "started at"), and a precise `Instant::now()` was 16-18% of an untraced 8-byte
//! call's own CPU time here (perf, 1 rank). Reading this clock instead took an 8-byte
//! broadcast at 1 rank from 87-93 to 69-83 ns of CPU per call (task-clock over 2 M calls,
//! three alternating pairs). The kernel's coarse monotonic clock is the same clock as
//! `Instant`'s, read at the last tick (1-4 ms), without the counter read and scaling. A
//! deadline is then up to a tick early, against timeouts of seconds; a traced call, whose
//! times are compared in microseconds, reads the precise clock.

use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};

/// A coarse clock that answers in `Instant`s: an `Instant` taken once beside a precise read
/// of the same clock, and where the coarse clock stands against that read.
pub(crate) struct CoarseClock {
    base: Instant,
    /// The monotonic clock's value at `base` (read just before it).
    fine_base: Duration,
}

impl CoarseClock {
    pub fn new() -> CoarseClock {
        let fine_base = read(ClockId::Monotonic);
        CoarseClock { base: Instant::now(), fine_base }
    }

    /// Now, to the last clock tick: at most a tick earlier than `Instant::now()`, and later
    /// only by the nanoseconds between the two reads in `new`.
    #[inline]
    pub fn now(&self) -> Instant {
        let c = read(ClockId::MonotonicCoarse);
        match c.checked_sub(self.fine_base) {
            Some(ahead) => self.base + ahead,
            None => self.base.checked_sub(self.fine_base - c).unwrap_or(self.base),
        }
    }
}

#[inline]
fn read(clock: ClockId) -> Duration {
    let t = clock_gettime(clock);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_a_tick_behind_the_precise_clock() {
        let clock = CoarseClock::new();
        for _ in 0..50 {
            let before = Instant::now();
            let coarse = clock.now();
            let after = Instant::now();
            // Behind by at most a tick (4 ms at HZ=250); allow 50 ms for a loaded machine.
            assert!(coarse <= after + Duration::from_micros(100), "{coarse:?} runs ahead of {after:?}");
            assert!(before.saturating_duration_since(coarse) < Duration::from_millis(50));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
