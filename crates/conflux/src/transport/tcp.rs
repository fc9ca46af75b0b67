//! A TCP link to one peer: a non-blocking stream carrying framed messages both ways.
//!
//! Large messages flow in pieces of at most `chunk` bytes per system call, so that the
//! receiver reduces one piece while the next is on the wire. At most `inflight` such pieces
//! are written and not yet read by the peer (`window.rs`); the socket buffers are sized to hold
//! them (CONFLUX_TCP_CHUNK, CONFLUX_TCP_INFLIGHT, CONFLUX_SOCKET_BUF).

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;

use super::frame::{encode_header, ByteSource, CRC_BIT, HEADER};
use super::ring::SendProgress;
use super::wait::SocketInterest;
use super::window::Window;
use super::{Advance, LinkError};
use crate::call::Fingerprint;

pub(crate) struct TcpLink {
    stream: TcpStream,
    peer: usize,
    chunk: usize,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    /// Set at end of stream to the bytes then buffered: they are handed out once more, and if
    /// nobody takes any, the stream can never deliver what its reader waits for.
    eof_with: Option<usize>,
    /// Follow every payload with its CRC32C (`CONFLUX_CHECKSUM`).
    checksum: bool,
    /// Bounds what this rank has in flight to the peer, and credits what it read from it.
    window: Window,
}

impl TcpLink {
    pub fn new(
        stream: TcpStream,
        window: Window,
        peer: usize,
        chunk: usize,
        checksum: bool,
    ) -> std::io::Result<TcpLink> {
        stream.set_nonblocking(true)?;
        let rx = vec![0; chunk.max(4096)];
        Ok(TcpLink { stream, peer, chunk, rx, rx_start: 0, rx_end: 0, eof_with: None, checksum, window })
    }

    /// What a waiter watches for a transfer on this link: the data socket, or for a send the
    /// window holds back, the control stream that brings credits.
    pub fn interest(&self, send: bool, peer: usize) -> SocketInterest<'_> {
        match self.window.waits_on() {
            Some(ctl) if send => SocketInterest { fd: ctl, read: true, write: false, peer },
            _ => SocketInterest { fd: self.stream.as_fd(), read: !send, write: send, peer },
        }
    }

    /// Ends this side's streams: the peer reads every byte sent so far, then the end.
    pub fn finish(&self) {
        // An error means the connection is gone already, which the peer sees as well.
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        self.window.finish();
    }

    fn io_err(&self, e: std::io::Error) -> LinkError {
        match e.kind() {
            ErrorKind::BrokenPipe
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof => {
                LinkError::PeerGone { peer: self.peer, detail: format!("its TCP connection broke ({e})") }
            }
            _ => LinkError::Io { peer: self.peer, detail: e.to_string() },
        }
    }

    /// Writes as much of the message as the socket takes now.
    pub fn send(
        &mut self,
        (tag, call): (u64, Fingerprint),
        data: &[u8],
        st: &mut SendProgress,
    ) -> Result<Advance, LinkError> {
        let header = encode_header(if self.checksum { tag | CRC_BIT } else { tag }, data.len(), call);
        let mut progressed = false;
        loop {
            // `done` counts header bytes first, then payload bytes.
            let hdr_left = if st.header_done { 0 } else { HEADER - st.done };
            let pay_at = if st.header_done { st.done } else { 0 };
            if hdr_left == 0 && pay_at == data.len() {
                if !self.checksum {
                    return Ok(Advance { moved: progressed, done: true });
                }
                // Computed once the payload is out, in one pass: the kernel has copied it.
                let crc = st.crc.get_or_insert_with(|| crc32c::crc32c(data)).to_le_bytes();
                let room = self.window.room(crc.len() - st.crc_done, self.peer)?;
                if room == 0 {
                    return Ok(Advance { moved: progressed, done: false });
                }
                match self.stream.write(&crc[st.crc_done..][..room.min(crc.len() - st.crc_done)]) {
                    Ok(n) => {
                        self.window.wrote(n);
                        progressed |= n > 0;
                        st.crc_done += n;
                        if st.crc_done == crc.len() {
                            return Ok(Advance { moved: progressed, done: true });
                        }
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        return Ok(Advance { moved: progressed, done: false })
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(self.io_err(e)),
                }
            }
            let pay = &data[pay_at..(pay_at + self.chunk).min(data.len())];
            let room = self.window.room(hdr_left + pay.len(), self.peer)?;
            if room == 0 {
                return Ok(Advance { moved: progressed, done: false });
            }
            let hdr = &header[HEADER - hdr_left..][..hdr_left.min(room)];
            let pay = &pay[..pay.len().min(room - hdr.len())];
            let bufs = [IoSlice::new(hdr), IoSlice::new(pay)];
            match self.stream.write_vectored(&bufs) {
                Ok(0) => return Err(self.io_err(ErrorKind::WriteZero.into())),
                Ok(mut n) => {
                    self.window.wrote(n);
                    progressed = true;
                    if !st.header_done {
                        let h = n.min(hdr_left);
                        st.done += h;
                        n -= h;
                        if st.done == HEADER {
                            st.header_done = true;
                            st.done = 0;
                        }
                    }
                    st.done += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Advance { moved: progressed, done: false }),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
    }
}

impl ByteSource for TcpLink {
    fn available(&mut self) -> Result<&[u8], LinkError> {
        // Read only when we hold less than a header's worth of small records: callers always
        // take all they can, so what stays behind is a partial header or a partial element.
        if self.window.owes() {
            self.window.flush();
        }
        if self.rx_end - self.rx_start < 64 {
            if self.rx_start > 0 {
                self.rx.copy_within(self.rx_start..self.rx_end, 0);
                self.rx_end -= self.rx_start;
                self.rx_start = 0;
            }
            match self.stream.read(&mut self.rx[self.rx_end..]) {
                Ok(0) => {
                    let held = self.rx_end - self.rx_start;
                    if held == 0 || self.eof_with == Some(held) {
                        return Err(LinkError::PeerGone {
                            peer: self.peer,
                            detail: "it closed its TCP connection".into(),
                        });
                    }
                    self.eof_with = Some(held);
                }
                Ok(n) => {
                    self.rx_end += n;
                    self.window.took(n);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        Ok(&self.rx[self.rx_start..self.rx_end])
    }

    fn consume(&mut self, n: usize) {
        self.rx_start += n;
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        }
    }
}
