//! How a sender copies a piece into a shared-memory ring: with ordinary stores, or with
//! non-temporal ones that go to memory instead of into this core's cache.
//!
//! Ordinary stores are the fast way while the sender and receiver share a cache: the receiver
//! then reads the piece out of it. When their cores do not share one (a VM's vCPUs placed on
//! far cores, ranks on two sockets or two CCXs), every ring line crosses between the caches
//! twice a lap: the receiver fetches it dirty from the sender's cache, and the sender must
//! take it back before it writes the next lap. Measured at 2 ranks, a 1 MiB ring all_gather:
//! ordinary copies into the ring ran at 30-45 GB/s with the vCPUs near and at 1-2 GB/s with
//! them far (ping-pong of one line 0.035 against 0.2 us a round), and the call took 45 against
//! 280-1000 us. Non-temporal stores write around both caches, and took 64-66 us either way.
//!
//! The placement is not known in advance and changes under a running job (the hypervisor
//! moves vCPUs within seconds), so the sender measures it: it copies a piece's first
//! `PROBE` bytes with ordinary stores and times them. Slower than `SLOW_GBPS`, the lines are
//! crossing far, and the rest of the piece, and the next `PROBE_EVERY` pieces, are streamed;
//! then it probes again. It changes its mind only on two probes in a row (`probed`). The
//! receiver cannot tell the difference: `stream_copy` ends with a store fence, so the ring's
//! Release stores (a header record's stamp, `tail`) still publish every byte. With more ranks
//! than cores the probe times who ran more than where the caches are, so there the
//! communicator never streams unless asked to (`comm/bootstrap.rs`).

use std::time::Instant;

/// Pieces shorter than this are copied with ordinary stores: a few lines cost their latency,
/// whichever way they go.
const STREAM_FROM: usize = 2 << 10;
/// Pieces of at least this many bytes are each probed while the lines are near; shorter ones
/// every `PROBE_EVERY`-th, so that the timing costs them under 1%.
const PROBE_EACH_FROM: usize = 16 << 10;
/// The bytes of a piece copied and timed to tell near from far (all of a shorter piece).
const PROBE: usize = 4 << 10;
/// Below this rate (bytes per nanosecond) the probe's lines were crossing far. Probes at 2
/// ranks measured 1-3 far (a quarter of them 4-10), and near 25-45 after ordinary copies
/// and 5-10 after streamed ones (the lines then come from the shared L3).
const SLOW_GBPS: f64 = 4.5;
/// Pieces between two probes, but for near pieces of `PROBE_EACH_FROM` bytes or more: a probe
/// costs a far copy of `PROBE` bytes (2-4 us), against a 128 KiB piece's 10-15 us streamed.
const PROBE_EVERY: u32 = 8;

/// Whether a sender may stream (`CONFLUX_SHM_STREAM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Streaming {
    /// Measure, and stream where ordinary stores run slow (the default).
    #[default]
    Auto,
    /// Stream every piece of `STREAM_FROM` bytes or more.
    Always,
    /// Never stream.
    Never,
}

impl Streaming {
    pub fn parse(v: &str) -> Option<Streaming> {
        match v {
            "auto" => Some(Streaming::Auto),
            "1" | "true" | "on" | "always" => Some(Streaming::Always),
            "0" | "false" | "off" | "never" => Some(Streaming::Never),
            _ => None,
        }
    }
}

/// One sender's copier: its policy and what its last probe found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copier {
    policy: Streaming,
    /// The last probe found the lines crossing far.
    far: bool,
    /// Pieces of `STREAM_FROM` bytes or more copied since that probe.
    since_probe: u32,
    /// The last probe disagreed with `far`: one more that does changes it.
    doubt: bool,
}

/// How the rest of a piece is copied, as `Copier::plan` decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// All of it with ordinary stores.
    Plain,
    /// All of it streamed.
    Stream,
    /// Its first `PROBE` bytes (or all of it) with ordinary stores, timed, then as the probe
    /// says.
    Probe,
}

impl Copier {
    pub fn new(policy: Streaming) -> Copier {
        Copier { policy, far: false, since_probe: 0, doubt: false }
    }

    /// Copies `src` into `dst` (ring space of the same length).
    pub fn copy(&mut self, dst: &mut [u8], src: &[u8]) {
        match self.plan(src.len()) {
            Plan::Plain => crate::bytes::copy(dst, src),
            Plan::Stream => stream_copy(dst, src),
            Plan::Probe => {
                let probe = src.len().min(PROBE);
                let (head, rest) = dst.split_at_mut(probe);
                let start = Instant::now();
                head.copy_from_slice(&src[..probe]);
                self.probed(probe, start.elapsed().as_nanos() as u64);
                if self.far {
                    stream_copy(rest, &src[probe..]);
                } else {
                    rest.copy_from_slice(&src[probe..]);
                }
            }
        }
    }

    fn plan(&mut self, len: usize) -> Plan {
        if len < STREAM_FROM || self.policy == Streaming::Never {
            return Plan::Plain;
        }
        if self.policy == Streaming::Always {
            return Plan::Stream;
        }
        if self.since_probe >= PROBE_EVERY || (!self.far && len >= PROBE_EACH_FROM) {
            return Plan::Probe;
        }
        self.since_probe += 1;
        if self.far {
            Plan::Stream
        } else {
            Plan::Plain
        }
    }

    /// Takes a probe's result: `bytes` copied in `ns` nanoseconds. The copier changes its mind
    /// on two probes in a row: a near probe can run slow (a page fault, a preemption, lines
    /// evicted meanwhile), and streaming near costs mid-sized pieces 1.3-1.5 times their time
    /// (ring all_gather of 4-64 KiB at 2 ranks, forced on against off). A probe that disagrees
    /// with the state has the next piece probed.
    fn probed(&mut self, bytes: usize, ns: u64) {
        let slow = (bytes as f64) < SLOW_GBPS * ns as f64;
        if slow != self.far && !self.doubt {
            self.doubt = true;
            self.since_probe = PROBE_EVERY;
            return;
        }
        self.far = slow;
        self.doubt = false;
        self.since_probe = 0;
    }
}

/// Copies `src` into `dst` with non-temporal stores where the target has them, then fences
/// them, so that a later Release store orders after every byte.
fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Up to the first 16-byte boundary of dst, and the tail after the last whole one,
        // with ordinary stores; ring pieces start on a 64-byte record, so this is rare.
        let lead = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..lead].copy_from_slice(&src[..lead]);
        let body = (dst.len() - lead) / 16 * 16;
        let (d, s) = (dst[lead..].as_mut_ptr(), src[lead..].as_ptr());
        let mut i = 0;
        while i < body {
            // SAFETY: i + 16 <= body <= dst.len() - lead, so both 16-byte accesses are in
            // bounds of their slices; d + i is 16-byte aligned (lead aligned d, i is a
            // multiple of 16) as `_mm_stream_si128` needs; the load is unaligned. SSE2, which
            // both intrinsics need, is part of x86_64.
            unsafe {
                let v = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                _mm_stream_si128(d.add(i).cast::<__m128i>(), v);
            }
            i += 16;
        }
        let end = lead + body;
        dst[end..].copy_from_slice(&src[end..]);
        // SAFETY: a fence has no memory operands; SSE is part of x86_64. It orders the
        // streaming stores above before any later store, which ordinary Release does not.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_bytes_equal_the_source_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 131 % 251) as u8).collect();
        let mut dst = vec![0u8; 70_100];
        for (off, len) in [(0, 0), (0, 15), (1, 16), (3, 17), (0, 64), (7, 4097), (16, 65_536), (5, 69_990)] {
            dst.fill(0xEE);
            stream_copy(&mut dst[off..off + len], &src[..len]);
            assert_eq!(&dst[off..off + len], &src[..len], "offset {off}, length {len}");
            assert!(dst[..off].iter().chain(&dst[off + len..]).all(|&b| b == 0xEE), "wrote outside");
        }
    }

    #[test]
    fn two_probes_in_a_row_change_its_mind_and_one_has_the_next_piece_probed() {
        let (slow, fast) = ((PROBE, 2_000), (PROBE, 100)); // 2 and 40 GB/s
        let mut c = Copier::new(Streaming::Auto);
        assert_eq!(c.plan(STREAM_FROM - 1), Plan::Plain, "short pieces are never streamed");
        assert_eq!(c.plan(PROBE_EACH_FROM), Plan::Probe, "near at first: every large piece is probed");
        c.probed(fast.0, fast.1);
        for _ in 0..PROBE_EVERY {
            assert_eq!(c.plan(STREAM_FROM), Plan::Plain);
        }
        assert_eq!(c.plan(STREAM_FROM), Plan::Probe, "and shorter ones every PROBE_EVERY-th");
        c.probed(slow.0, slow.1);
        assert_eq!(c.plan(STREAM_FROM), Plan::Probe, "one slow probe: the next piece is probed");
        c.probed(fast.0, fast.1);
        assert_eq!(c.plan(STREAM_FROM), Plan::Plain, "a slow probe alone changes nothing");
        assert_eq!(c.plan(PROBE_EACH_FROM), Plan::Probe);
        c.probed(slow.0, slow.1);
        c.probed(slow.0, slow.1);
        // Far: everything from STREAM_FROM streamed, a probe every PROBE_EVERY pieces.
        let streamed_then_probed = |c: &mut Copier| {
            for k in 0..PROBE_EVERY {
                let len = if k % 2 == 0 { 128 << 10 } else { STREAM_FROM };
                assert_eq!(c.plan(len), Plan::Stream);
            }
            assert_eq!(c.plan(STREAM_FROM - 1), Plan::Plain);
            assert_eq!(c.plan(128 << 10), Plan::Probe);
        };
        streamed_then_probed(&mut c);
        c.probed(fast.0, fast.1);
        assert_eq!(c.plan(128 << 10), Plan::Probe, "one fast probe: the next piece is probed");
        c.probed(slow.0, slow.1);
        streamed_then_probed(&mut c);
        c.probed(fast.0, fast.1);
        c.probed(fast.0, fast.1);
        assert_eq!(c.plan(STREAM_FROM), Plan::Plain, "two fast probes in a row: near again");
    }

    #[test]
    fn forced_policies_never_probe() {
        assert_eq!(Copier::new(Streaming::Always).plan(STREAM_FROM), Plan::Stream);
        assert_eq!(Copier::new(Streaming::Never).plan(1 << 20), Plan::Plain);
        assert_eq!(Streaming::parse("auto"), Some(Streaming::Auto));
        assert_eq!(Streaming::parse("on"), Some(Streaming::Always));
        assert_eq!(Streaming::parse("off"), Some(Streaming::Never));
        assert_eq!(Streaming::parse("sometimes"), None);
    }
}
