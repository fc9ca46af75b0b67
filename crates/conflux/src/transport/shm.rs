//! The shared segment of one host's ranks: one memfd, mapped by every local rank.
//!
//! # Why a memfd
//! A memfd has no name in /dev/shm, so nothing can leak: the memory is freed when the last
//! rank holding it exits, however it exits (SIGKILL included). The leader creates it and
//! publishes `(pid, fd)` in the store; the others open `/proc/<pid>/fd/<fd>`, which reopens the
//! same file (it needs ptrace-read permission on the leader, i.e. the same user).
//!
//! # Layout (offsets in bytes; LINE = 128, two cache lines, so that adjacent-line prefetch never
//! makes two writers share one)
//! ```text
//! 0                 header: magic u64, version u64, ranks u64, ring_cap u64, chunk u64, ring key u64
//! rank_ctl(i)       per local rank, 12 lines: doorbell u32 | sleeping u32 | posted u64 | reduced u64 | desc [u64; 2] board [[u64; 3]; 2] | cpu u32 | inline(p) for p in {0,1}, 3 lines: gen u64, desc u64, then INLINE_DATA data bytes
//! ring_ctl(i,j)     per ordered pair i->j, 2 lines: tail u64 (written by i) | head u64 (written by j)
//! ring_data(i,j)    ring_cap bytes per ordered pair (the diagonal is never touched, so never paid for)
//! slot(i,p)         direct algorithm: chunk bytes per rank and parity p in {0,1}
//! result(p)         direct algorithm: chunk bytes per parity
//! ```
//! Who writes what, and the orderings that make it safe, is written where each protocol is:
//! `ring.rs` for the point-to-point rings, `algo/direct/` for the direct algorithm, and
//! `wait.rs` for doorbells.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};

pub(crate) const LINE: usize = 128;
const MAGIC: u64 = 0x636f_6e66_6c75_7831; // "conflux1"
const VERSION: u64 = 6;
/// Where the header keeps the rings' stamp key (`ring.rs`, Stamps).
const RING_KEY: usize = 5 * 8;
const PAGE: usize = 4096;
/// LINEs in one rank's inline block of one parity: six 64-byte cache lines, the round number
/// and the descriptor in the first 16 bytes, the data in the rest, in one piece.
const INLINE_BLOCK: usize = 3;
/// Data bytes an inline block carries.
pub(crate) const INLINE_DATA: usize = INLINE_BLOCK * LINE - 16;
/// Of those, the bytes in the block's first 64-byte line, beside the round number.
pub(crate) const INLINE_HEAD: usize = 64 - 16;
const RANK_CTL_LINES: usize = 6 + 2 * INLINE_BLOCK;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Layout {
    pub ranks: usize,
    pub ring_cap: usize,
    pub chunk: usize,
    rank_ctl: usize,
    ring_ctl: usize,
    ring_data: usize,
    direct: usize,
    pub total: usize,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl Layout {
    pub fn new(ranks: usize, ring_cap: usize, chunk: usize) -> Layout {
        let ring_cap = round_up(ring_cap, PAGE);
        // At least 64 bytes a rank, so that a rank's share of a chunk (the direct algorithms
        // split one N ways) holds whole elements of any type.
        let chunk = round_up(chunk.max(ranks * 64), PAGE);
        let rank_ctl = PAGE;
        let ring_ctl = round_up(rank_ctl + ranks * RANK_CTL_LINES * LINE, PAGE);
        let ring_data = round_up(ring_ctl + ranks * ranks * 2 * LINE, PAGE);
        let direct = ring_data + ranks * ranks * ring_cap;
        let total = direct + (2 * ranks + 2) * chunk;
        Layout { ranks, ring_cap, chunk, rank_ctl, ring_ctl, ring_data, direct, total }
    }
    pub fn doorbell(&self, i: usize) -> usize {
        self.rank_ctl + i * RANK_CTL_LINES * LINE
    }
    pub fn sleeping(&self, i: usize) -> usize {
        self.doorbell(i) + LINE
    }
    pub fn posted(&self, i: usize) -> usize {
        self.doorbell(i) + 2 * LINE
    }
    pub fn reduced(&self, i: usize) -> usize {
        self.doorbell(i) + 3 * LINE
    }
    /// What rank i's current direct call is, one word per parity (see algo/direct/mod.rs).
    pub fn desc(&self, i: usize, parity: usize) -> usize {
        self.doorbell(i) + 4 * LINE + 8 * parity
    }
    /// Rank i's call board, two entries of three words after the descriptors (see board.rs).
    /// In their cache line on purpose: a direct all_reduce writes both, and the peers read
    /// the descriptors, so the line moves once per call; a line of its own, prefetched along
    /// with the descriptors' into the peers' caches, would move too (8% of an 8-byte call).
    pub fn board(&self, i: usize, parity: usize) -> usize {
        self.doorbell(i) + 4 * LINE + 16 + 24 * parity
    }
    /// The CPU rank i's waiting thread last ran on, plus one (0: not yet known); see
    /// `wait.rs`, YIELD_AFTER. A line of its own: it is written when that CPU changes and read
    /// only by a peer that has spun for a while, so it never moves with an exchange's lines.
    pub fn cpu(&self, i: usize) -> usize {
        self.doorbell(i) + 5 * LINE
    }
    /// The block in which rank i's part of a direct round of at most `INLINE_DATA` bytes, of parity
    /// p, travels whole (see transport/rounds.rs, Inline). Its first word is the round number.
    pub fn inline(&self, i: usize, parity: usize) -> usize {
        self.doorbell(i) + (6 + parity * INLINE_BLOCK) * LINE
    }
    /// The descriptor word of that block, beside the round number.
    pub fn inline_desc(&self, i: usize, parity: usize) -> usize {
        self.inline(i, parity) + 8
    }
    /// Where that block's `INLINE_DATA` data bytes start, after the two words.
    pub fn inline_data(&self, i: usize, parity: usize) -> usize {
        self.inline(i, parity) + 16
    }
    pub fn tail(&self, from: usize, to: usize) -> usize {
        self.ring_ctl + (from * self.ranks + to) * 2 * LINE
    }
    pub fn head(&self, from: usize, to: usize) -> usize {
        self.tail(from, to) + LINE
    }
    pub fn ring_data(&self, from: usize, to: usize) -> usize {
        self.ring_data + (from * self.ranks + to) * self.ring_cap
    }
    pub fn slot(&self, i: usize, parity: usize) -> usize {
        self.direct + (2 * i + parity) * self.chunk
    }
    pub fn result(&self, parity: usize) -> usize {
        self.direct + (2 * self.ranks + parity) * self.chunk
    }
}

/// One host's shared segment, mapped into this process.
pub(crate) struct Segment {
    map: MmapRaw,
    pub layout: Layout,
    file: File,
}

/// At most this many bytes of rings on one host are mapped in at setup (`Segment::prefault`):
/// up to 8 local ranks at the default 1 MiB a ring (56 MiB, which took a communicator's setup
/// at 8 ranks on this 2-core machine from ~160 to ~260 ms). Beyond, a ring is paid for when
/// first used, and the pairs that never talk (most of them, for the ring and tree algorithms
/// on a large host) are never paid for at all.
const PREFAULT_RINGS_UP_TO: usize = 64 << 20;

impl Segment {
    /// Creates and maps a fresh segment (the leader's part).
    pub fn create(layout: Layout) -> std::io::Result<Segment> {
        let fd = rustix::fs::memfd_create("conflux", rustix::fs::MemfdFlags::CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(layout.total as u64)?;
        let seg = Segment::map(file, layout)?;
        for (i, v) in
            [MAGIC, VERSION, layout.ranks as u64, layout.ring_cap as u64, layout.chunk as u64].into_iter().enumerate()
        {
            seg.u64_at(i * 8).store(v, std::sync::atomic::Ordering::Release);
        }
        // Random per segment (std seeds its hasher keys from the OS), so that a payload word
        // equals a stamp only by chance: no data a program sends is built from this key.
        let key = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), layout.total);
        seg.u64_at(RING_KEY).store(key, std::sync::atomic::Ordering::Release);
        Ok(seg)
    }

    /// Opens the leader's segment through /proc and checks it is the one we expect.
    pub fn open(leader_pid: u32, leader_fd: i32, layout: Layout) -> std::io::Result<Segment> {
        let path = format!("/proc/{leader_pid}/fd/{leader_fd}");
        let file = File::options().read(true).write(true).open(&path)?;
        if file.metadata()?.len() != layout.total as u64 {
            return Err(std::io::Error::other(format!("{path} has the wrong size")));
        }
        let seg = Segment::map(file, layout)?;
        let expect = [MAGIC, VERSION, layout.ranks as u64, layout.ring_cap as u64, layout.chunk as u64];
        for (i, v) in expect.into_iter().enumerate() {
            if seg.u64_at(i * 8).load(std::sync::atomic::Ordering::Acquire) != v {
                return Err(std::io::Error::other(format!("{path} is not this job's segment")));
            }
        }
        Ok(seg)
    }

    fn map(file: File, layout: Layout) -> std::io::Result<Segment> {
        let map = MmapOptions::new().len(layout.total).map_raw(&file)?;
        Ok(Segment { map, layout, file })
    }

    /// Maps in now, for local rank `me`, the pages its calls will touch: the control lines, the
    /// direct algorithm's slots, and the rings to and from every local peer while the host's
    /// rings stay within `PREFAULT_RINGS_UP_TO`. Left to its first use, a ring's first lap
    /// took a page fault every 4 KiB on both sides: 8-byte broadcasts at 2 ranks, the first
    /// to use a ring, took 1.3-1.5x their later time over their first 20,000 calls (a 1 MiB
    /// ring holds 16,384 of them). A kernel without `MADV_POPULATE_WRITE` (before 5.14)
    /// leaves the pages to their first use, as before.
    pub fn prefault(&self, me: usize) {
        let l = &self.layout;
        let mut spans = vec![(0, l.ring_data), (l.direct, l.total - l.direct)];
        if l.ranks * (l.ranks - 1) * l.ring_cap <= PREFAULT_RINGS_UP_TO {
            for j in (0..l.ranks).filter(|&j| j != me) {
                spans.extend([(l.ring_data(me, j), l.ring_cap), (l.ring_data(j, me), l.ring_cap)]);
            }
        }
        for (off, len) in spans {
            // Every region starts on a page (`Layout::new` rounds the ring and chunk sizes up to
            // whole pages), as madvise needs.
            self.check(off, len, PAGE);
            // SAFETY: the span lies in this mapping (checked). POPULATE_WRITE faults its pages
            // in as a write would, without writing: it changes no byte, so a peer using them
            // meanwhile sees nothing. Its failure (an old kernel) leaves them to their first use.
            let _ = unsafe {
                let at = self.map.as_mut_ptr().add(off).cast();
                rustix::mm::madvise(at, len, rustix::mm::Advice::LinuxPopulateWrite)
            };
        }
    }

    /// The key every ring of this segment mixes into its stamps (`ring.rs`, Stamps).
    pub fn ring_key(&self) -> u64 {
        self.u64_at(RING_KEY).load(std::sync::atomic::Ordering::Acquire)
    }

    /// The descriptor other local ranks open through /proc.
    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    fn check(&self, off: usize, len: usize, align: usize) {
        // A violation is a bug in this crate's offset arithmetic, never a user input.
        assert!(off.is_multiple_of(align) && off.checked_add(len).is_some_and(|e| e <= self.layout.total));
    }

    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: in bounds and aligned (checked); the mapping lives as long as &self; atomics
        // are the only way any process touches control words, so no non-atomic access aliases.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: as in u32_at.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    /// Bytes `off..off+len` of the segment, for reading.
    ///
    /// # Safety
    /// No process may write these bytes while the slice lives: the caller holds them under the
    /// protocol of the area (a ring's filled part, a slot whose `posted` it has observed).
    pub unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds (checked); exclusivity of writers is the caller's contract above.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) }
    }

    /// Bytes `off..off+len` of the segment, for writing.
    ///
    /// # Safety
    /// No other process or thread may read or write these bytes while the slice lives: the
    /// caller owns them under the protocol of the area (a ring's free part, its own slot).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds (checked); exclusive ownership is the caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(off), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::{Layout, Segment, INLINE_BLOCK, INLINE_DATA, LINE, RANK_CTL_LINES};

    /// Mapping pages in changes nothing a rank wrote, wherever it wrote it.
    #[test]
    fn prefaulting_keeps_every_byte() {
        let l = Layout::new(3, 8192, 4096);
        let seg = Segment::create(l).unwrap();
        let marks = [l.doorbell(1) + 64, l.ring_data(0, 1) + 100, l.ring_data(2, 0) + 8000, l.slot(2, 1) + 5];
        for (k, &at) in marks.iter().enumerate() {
            // SAFETY: a fresh segment nobody else maps.
            unsafe { seg.bytes_mut(at, 1)[0] = k as u8 + 1 };
        }
        for me in 0..3 {
            seg.prefault(me);
        }
        for (k, &at) in marks.iter().enumerate() {
            // SAFETY: as above.
            assert_eq!(unsafe { seg.bytes(at, 1)[0] }, k as u8 + 1, "byte {at}");
        }
    }

    #[test]
    fn a_chunk_holds_an_element_of_any_type_for_every_rank() {
        for ranks in [1, 2, 64, 65, 200, 1000] {
            let l = Layout::new(ranks, 4096, 4096);
            assert!(l.chunk / ranks >= 8 && l.chunk.is_multiple_of(4096), "{ranks} ranks: chunk {}", l.chunk);
        }
    }

    #[test]
    fn every_control_word_has_its_own_line_and_the_areas_do_not_overlap() {
        for ranks in 1..=9 {
            let l = Layout::new(ranks, 4096, 4096);
            let mut lines = Vec::new();
            for i in 0..ranks {
                // desc and board share a line on purpose (see `board`); the rest do not.
                let words = [l.doorbell(i), l.sleeping(i), l.posted(i), l.reduced(i), l.desc(i, 0), l.cpu(i)];
                lines.extend(words.iter().map(|w| w / LINE));
                // Each inline block: its own LINEs, the two words and the data inside them, and
                // the block inside the rank's.
                for p in 0..2 {
                    let block = (l.inline(i, p)..l.inline(i, p) + INLINE_BLOCK * LINE).step_by(LINE);
                    lines.extend(block.map(|at| at / LINE));
                    assert!(l.inline(i, p).is_multiple_of(LINE) && l.inline_desc(i, p) + 8 <= l.inline_data(i, p));
                    assert_eq!(l.inline_data(i, p) + INLINE_DATA, l.inline(i, p) + INLINE_BLOCK * LINE);
                    assert!(l.inline(i, p) + INLINE_BLOCK * LINE <= l.doorbell(i) + RANK_CTL_LINES * LINE);
                }
                assert_eq!(l.desc(i, 1) / LINE, l.desc(i, 0) / LINE);
                assert_eq!((l.board(i, 1) + 23) / LINE, l.desc(i, 0) / LINE);
            }
            let all = lines.len();
            lines.sort_unstable();
            lines.dedup();
            assert_eq!(lines.len(), all, "{ranks} ranks: two control words share a line");
            assert!(
                l.inline(ranks - 1, 1) + INLINE_BLOCK * LINE <= l.tail(0, 0),
                "{ranks} ranks: rank_ctl runs into ring_ctl"
            );
            assert!(l.head(ranks - 1, ranks - 1) + LINE <= l.ring_data(0, 0));
            assert!(l.ring_data(ranks - 1, ranks - 1) + l.ring_cap <= l.slot(0, 0));
            assert_eq!(l.result(1) + l.chunk, l.total);
        }
    }
}
