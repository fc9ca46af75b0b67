//! The in-flight window of a TCP link (`CONFLUX_TCP_INFLIGHT`): a sender may have at most
//! `inflight x chunk` bytes of its stream written and not yet read by the peer's process,
//! the way an RDMA queue pair bounds the work requests it has outstanding.
//!
//! Credits travel on a second connection per pair, the control stream, as cumulative counts
//! of the data stream's bytes read (u64 LE, one record per `step` bytes). They cannot share the
//! data stream's reverse direction: two ranks each sending the other a large message would
//! each hold its credits behind its own message, which waits for the other's credits.
//!
//! No stall: the reader credits at least every `step = limit / 2` bytes, so once it has read
//! everything, the sender's room is at least `limit - step > 0`. Half the window, not less:
//! a credit is a small TCP send on its own, and at a quarter, all_to_all of 256 KiB-1 MiB at
//! 2 ranks over loopback took 10-20% longer (9 alternating runs against the build before).
//!
//! Unread credit records stay few: the sender reads them whenever its room falls below a
//! chunk, at least once per `limit - chunk` bytes written, so a few records (64 bytes) ever
//! wait in the control socket, far below its buffer, and a credit write never finds it full
//! in practice. If one did, the rest of the record goes out on this rank's next look for data
//! from that peer.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};

use super::LinkError;

/// Bytes of one credit record.
const RECORD: usize = 8;

pub(crate) struct Window {
    ctl: TcpStream,
    /// Most stream bytes written and not yet read by the peer.
    limit: u64,
    /// Data-stream bytes this rank wrote, and the peer's latest count of them read.
    written: u64,
    granted: u64,
    /// A credit record read in part.
    partial: [u8; RECORD],
    partial_len: usize,
    /// Data-stream bytes this rank read, and the count last sent whole to the peer.
    read: u64,
    credited: u64,
    /// The credit record being written, and how much of it is out (`RECORD`: none pending).
    out: [u8; RECORD],
    out_at: usize,
    /// Read bytes that make a credit worth sending.
    step: u64,
    /// The last `room` found none: the sender waits for the control stream, not the socket.
    starved: bool,
}

impl Window {
    pub fn new(ctl: TcpStream, limit: usize) -> std::io::Result<Window> {
        ctl.set_nonblocking(true)?;
        ctl.set_nodelay(true)?;
        let limit = limit.max(RECORD) as u64;
        let step = (limit / 2).max(1);
        Ok(Window {
            ctl,
            limit,
            written: 0,
            granted: 0,
            partial: [0; RECORD],
            partial_len: 0,
            read: 0,
            credited: 0,
            out: [0; RECORD],
            out_at: RECORD,
            step,
            starved: false,
        })
    }

    /// How many more stream bytes this rank may write now. Reads the peer's credits when the
    /// room left is less than `want`; 0 means wait for the control stream (`waits_on`).
    pub fn room(&mut self, want: usize, peer: usize) -> Result<usize, LinkError> {
        if self.free() < want as u64 {
            self.take_credits(peer)?;
        }
        let room = self.free();
        self.starved = room == 0;
        Ok(room.min(usize::MAX as u64) as usize)
    }

    fn free(&self) -> u64 {
        (self.granted + self.limit).saturating_sub(self.written)
    }

    pub fn wrote(&mut self, n: usize) {
        self.written += n as u64;
    }

    /// Counts `n` data-stream bytes read, and credits the peer once they make a step.
    pub fn took(&mut self, n: usize) {
        self.read += n as u64;
        if self.read - self.credited >= self.step {
            self.flush();
        }
    }

    /// Sends the peer the count of bytes read, if it has not had it. A full control socket
    /// leaves the rest of the record for the next call (`TcpLink::available` makes one on every
    /// look for data); a broken one is the data stream's to report.
    pub fn flush(&mut self) {
        loop {
            if self.out_at == RECORD {
                if self.read == self.credited {
                    return;
                }
                self.out = self.read.to_le_bytes();
                self.out_at = 0;
            }
            match self.ctl.write(&self.out[self.out_at..]) {
                Ok(0) => return,
                Ok(n) => {
                    self.out_at += n;
                    if self.out_at == RECORD {
                        self.credited = u64::from_le_bytes(self.out);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Whether a credit is owed and not out: a record written in part, or a step's credit a
    /// full control socket refused.
    pub fn owes(&self) -> bool {
        self.out_at < RECORD || self.read - self.credited >= self.step
    }

    /// Reads every credit record waiting on the control stream; keeps the latest count.
    fn take_credits(&mut self, peer: usize) -> Result<(), LinkError> {
        let mut buf = [0u8; 64 * RECORD];
        loop {
            buf[..self.partial_len].copy_from_slice(&self.partial[..self.partial_len]);
            match self.ctl.read(&mut buf[self.partial_len..]) {
                // The peer ended its control stream: fatal only if the credits read so far
                // leave no room (else the data stream reports the end when it matters).
                Ok(0) if self.free() > 0 => return Ok(()),
                Ok(0) => {
                    return Err(LinkError::PeerGone {
                        peer,
                        detail: "it closed its TCP control stream while this rank still had data for it".into(),
                    })
                }
                Ok(n) => {
                    let have = self.partial_len + n;
                    let whole = have - have % RECORD;
                    if let Some(last) = buf[..whole].chunks_exact(RECORD).last() {
                        let count = u64::from_le_bytes(last.try_into().expect("a record"));
                        self.granted = self.granted.max(count);
                    }
                    self.partial_len = have - whole;
                    self.partial[..self.partial_len].copy_from_slice(&buf[whole..have]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(LinkError::Io { peer, detail: format!("control stream: {e}") }),
            }
        }
    }

    /// The socket a blocked sender should wait on to read: the control stream when the
    /// window is what blocks it.
    pub fn waits_on(&self) -> Option<BorrowedFd<'_>> {
        self.starved.then(|| self.ctl.as_fd())
    }

    /// Ends this side's control stream, with the data stream (`TcpLink::finish`).
    pub fn finish(&self) {
        let _ = self.ctl.shutdown(std::net::Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(limit: usize) -> (Window, Window) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (Window::new(a, limit).unwrap(), Window::new(b, limit).unwrap())
    }

    fn settle(sender: &mut Window, want: usize) -> usize {
        // Credits cross a loopback socket: give them a moment to arrive.
        for _ in 0..1000 {
            let r = sender.room(want, 1).unwrap();
            if r >= want {
                return r;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        sender.room(want, 1).unwrap()
    }

    #[test]
    fn a_sender_stops_at_the_limit_and_resumes_as_the_reader_credits() {
        let (mut s, mut r) = pair(4096);
        assert_eq!(s.room(4096, 1).unwrap(), 4096);
        s.wrote(4096);
        assert_eq!(s.room(1, 1).unwrap(), 0);
        assert!(s.waits_on().is_some());
        // Less than a step (half the window) read: no credit yet.
        r.took(2000);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(s.room(1, 1).unwrap(), 0);
        r.took(100);
        assert_eq!(settle(&mut s, 2100), 2100);
        assert!(s.waits_on().is_none());
        // Everything read, the last 1996 bytes not yet credited (less than a step): the room
        // is still more than half the window.
        r.took(1996);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(s.room(4096, 1).unwrap(), 2100);
    }

    #[test]
    fn once_everything_is_read_the_sender_always_has_room() {
        let (mut s, mut r) = pair(4 * 4096);
        let mut written = 0u64;
        for i in 0..500usize {
            let want = 1 + (i * 7919) % 9000;
            let room = settle(&mut s, 1);
            let n = want.min(room);
            s.wrote(n);
            r.took(n);
            written += n as u64;
            assert!(room > 0, "no room at write {i} after {written} bytes");
        }
    }

    #[test]
    fn a_closed_control_stream_names_the_peer() {
        let (mut s, r) = pair(4096);
        s.wrote(4096);
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(matches!(s.room(1, 7), Err(LinkError::PeerGone { peer: 7, .. })));
    }
}
