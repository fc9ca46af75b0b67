//! Frame encoding shared by the store's client and server.

use super::StoreError;
use std::io::{self, Read, Write};

/// Largest frame either side accepts: values carry addresses and handles, not tensors.
pub const MAX_FRAME: usize = 16 << 20;
/// Longest key accepted.
pub const MAX_KEY: usize = 4096;

pub mod kind {
    pub const SET: u8 = 1;
    pub const GET: u8 = 2;
    pub const WAIT: u8 = 3;
    pub const ADD: u8 = 4;
    pub const MONITOR: u8 = 5;
    pub const FAILURE: u8 = 6;
    pub const GOODBYE: u8 = 7;
    pub const GONE: u8 = 8;
    /// The server's CLOCK_MONOTONIC, for traces to put every rank on one clock.
    pub const CLOCK: u8 = 9;
    // Replies and events.
    pub const OK: u8 = 64;
    pub const VALUE: u8 = 65;
    pub const TIMEOUT: u8 = 66;
    pub const INT: u8 = 67;
    pub const EV_DIED: u8 = 80;
    pub const EV_FAILURE: u8 = 81;
    pub const EV_LEFT: u8 = 82;
}

/// Builds one frame.
pub struct Enc(Vec<u8>);

impl Enc {
    pub fn new(kind: u8) -> Enc {
        Enc(vec![0, 0, 0, 0, kind])
    }
    pub fn bytes(mut self, b: &[u8]) -> Enc {
        self.0.extend((b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
    pub fn u64(mut self, v: u64) -> Enc {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn finish(mut self) -> Vec<u8> {
        let body = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&body.to_le_bytes());
        self.0
    }
}

/// Reads the fields of one frame body; every read is bounds-checked.
pub struct Dec<'a> {
    pub kind: u8,
    rest: &'a [u8],
}

impl<'a> Dec<'a> {
    pub fn new(body: &'a [u8]) -> Result<Dec<'a>, StoreError> {
        let (&kind, rest) = body.split_first().ok_or_else(|| bad("empty frame"))?;
        Ok(Dec { kind, rest })
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        if n > self.rest.len() {
            return Err(bad("field longer than its frame"));
        }
        let (b, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(b)
    }
    pub fn str(&mut self) -> Result<&'a str, StoreError> {
        let b = self.bytes()?;
        if b.len() > MAX_KEY {
            return Err(bad("key too long"));
        }
        std::str::from_utf8(b).map_err(|_| bad("key is not UTF-8"))
    }
    pub fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_le_bytes(self.take::<8>()?))
    }
    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_le_bytes(self.take::<4>()?))
    }
    fn take<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        if self.rest.len() < N {
            return Err(bad("frame ends inside a field"));
        }
        let (b, rest) = self.rest.split_at(N);
        self.rest = rest;
        Ok(b.try_into().expect("split_at(N) gives N bytes"))
    }
}

pub fn bad(what: &str) -> StoreError {
    StoreError::Protocol(what.to_string())
}

/// Reads one frame body, blocking; `Ok(None)` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    if len == crate::auth::MAGIC[..4] {
        // An authentication challenge where a reply was due: the peer holds a token, we none.
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "the peer demands authentication"));
    }
    let n = u32::from_le_bytes(len) as usize;
    if n == 0 || n > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {n} bytes")));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Takes one complete frame body off the front of `buf`, if it holds one.
pub fn split_frame(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let n = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if n == 0 || n > MAX_FRAME {
        return Err(bad("frame length out of range"));
    }
    if buf.len() < 4 + n {
        return Ok(None);
    }
    let body = buf[4..4 + n].to_vec();
    buf.drain(..4 + n);
    Ok(Some(body))
}

pub fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame)
}
