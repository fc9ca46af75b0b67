//! Proving, as a connection opens, that both ends hold the job's token (`CONFLUX_JOB_TOKEN`).
//!
//! A mutual HMAC-SHA256 challenge–response, run on every store connection and every TCP data
//! connection before either side acts on anything the other sends:
//!
//! ```text
//! acceptor  -> connector   MAGIC (8) | nonce_a (32)
//! connector -> acceptor    nonce_c (32) | HMAC(token, ctx | "connector" | nonce_a | nonce_c)
//! acceptor  -> connector   HMAC(token, ctx | "acceptor"  | nonce_a | nonce_c)
//! ```
//!
//! `ctx` names what the connection is for (store or data), so that a proof made for one kind
//! of connection is never valid for the other; each side's fresh nonce is in both proofs, so
//! no proof can be replayed or reflected. The token never crosses the wire. Nothing after the
//! handshake is authenticated or encrypted: this keeps strangers out of a job, it does not
//! protect against someone who can watch or rewrite the job's traffic.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// First bytes the accepting side sends. Its first four, read as a store frame's length,
/// are far above the largest frame, so a store client without a token recognises them.
pub const MAGIC: [u8; 8] = *b"CFXAUTH1";
const NONCE: usize = 32;
const TAG: usize = 32;
/// How long one handshake may take: the peers are ranks answering at once, so this only
/// bounds how long a silent stranger can hold a connection open.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The job's shared secret. Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A token from its text as the user gave it (every byte is key material).
    pub fn new(secret: impl Into<String>) -> Token {
        Token(secret.into())
    }

    /// A fresh random token, 32 bytes from the system's generator, as 64 hex digits.
    pub fn generate() -> Result<Token, AuthError> {
        let raw = random::<32>()?;
        Ok(Token(raw.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// The secret's text, to hand to the processes of the same job.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn mac(&self, purpose: Purpose, side: &[u8], nonce_a: &[u8], nonce_c: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.0.as_bytes()).expect("HMAC takes keys of any length");
        for part in [b"conflux-auth-v1\0".as_slice(), purpose.label(), b"\0", side, nonce_a, nonce_c] {
            mac.update(part);
        }
        mac
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<secret>)")
    }
}

/// What a connection is for; part of every proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A connection to the job's store.
    Store,
    /// A TCP data connection between two ranks.
    Data,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Store => b"store",
            Purpose::Data => b"data",
        }
    }
}

/// Why a handshake failed. Every message starts with "authentication failed".
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AuthError {
    /// The other side's proof does not match this side's token: it holds another one.
    #[error("authentication failed: the {0} does not hold this job's token (CONFLUX_JOB_TOKEN differs)")]
    WrongProof(&'static str),
    /// The other side closed during the handshake, which is how an acceptor rejects a proof.
    #[error("authentication failed: the {0} closed the connection during the handshake (a different CONFLUX_JOB_TOKEN, or none, on its side?)")]
    Closed(&'static str),
    /// The other side sent something that is not this handshake.
    #[error(
        "authentication failed: the {0} does not speak conflux's handshake (is CONFLUX_JOB_TOKEN set on both sides?)"
    )]
    NotAHandshake(&'static str),
    /// The other side did not answer in time.
    #[error("authentication failed: no answer from the {0} within {1:.1}s (is CONFLUX_JOB_TOKEN set on both sides?)")]
    Timeout(&'static str, f64),
    /// The other side demands a token and this side has none.
    #[error("authentication failed: the {0} requires the job's token, and CONFLUX_JOB_TOKEN is not set here")]
    Required(&'static str),
    /// The socket failed.
    #[error("authentication failed: {0}")]
    Io(String),
    /// The system's random generator failed.
    #[error("authentication failed: no system randomness: {0}")]
    Random(String),
}

/// Runs the accepting side on a freshly accepted `stream`: challenges the connector, checks
/// its proof (in constant time), then proves itself. On error the caller must close the
/// stream without acting on anything read from it. Leaves the stream's timeouts as it found them.
pub fn accept(stream: &TcpStream, token: &Token, purpose: Purpose, timeout: Duration) -> Result<(), AuthError> {
    const PEER: &str = "connecting side";
    with_timeouts(stream, timeout, |mut s| {
        let nonce_a = random::<NONCE>()?;
        let mut hello = [0u8; MAGIC.len() + NONCE];
        hello[..MAGIC.len()].copy_from_slice(&MAGIC);
        hello[MAGIC.len()..].copy_from_slice(&nonce_a);
        s.write_all(&hello).map_err(|e| io(e, PEER, timeout))?;
        let mut answer = [0u8; NONCE + TAG];
        s.read_exact(&mut answer).map_err(|e| io(e, PEER, timeout))?;
        let (nonce_c, tag_c) = answer.split_at(NONCE);
        token
            .mac(purpose, b"connector", &nonce_a, nonce_c)
            .verify_slice(tag_c)
            .map_err(|_| AuthError::WrongProof(PEER))?;
        let tag_a = token.mac(purpose, b"acceptor", &nonce_a, nonce_c).finalize().into_bytes();
        s.write_all(&tag_a).map_err(|e| io(e, PEER, timeout))
    })
}

/// Runs the connecting side on a freshly connected `stream`: answers the acceptor's challenge
/// and checks the acceptor's proof of its own challenge, so that a rank talks to no impostor.
/// Leaves the stream's timeouts as it found them.
pub fn connect(stream: &TcpStream, token: &Token, purpose: Purpose, timeout: Duration) -> Result<(), AuthError> {
    const PEER: &str = "accepting side";
    with_timeouts(stream, timeout, |mut s| {
        let mut hello = [0u8; MAGIC.len() + NONCE];
        s.read_exact(&mut hello).map_err(|e| io(e, PEER, timeout))?;
        let (magic, nonce_a) = hello.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(AuthError::NotAHandshake(PEER));
        }
        let nonce_c = random::<NONCE>()?;
        let tag_c = token.mac(purpose, b"connector", nonce_a, &nonce_c).finalize().into_bytes();
        let mut answer = [0u8; NONCE + TAG];
        answer[..NONCE].copy_from_slice(&nonce_c);
        answer[NONCE..].copy_from_slice(&tag_c);
        s.write_all(&answer).map_err(|e| io(e, PEER, timeout))?;
        let mut tag_a = [0u8; TAG];
        s.read_exact(&mut tag_a).map_err(|e| io(e, PEER, timeout))?;
        token.mac(purpose, b"acceptor", nonce_a, &nonce_c).verify_slice(&tag_a).map_err(|_| AuthError::WrongProof(PEER))
    })
}

/// Runs `f` with `timeout` on both directions of `stream`, then restores what was set before.
fn with_timeouts(
    stream: &TcpStream,
    timeout: Duration,
    f: impl FnOnce(&TcpStream) -> Result<(), AuthError>,
) -> Result<(), AuthError> {
    let sys = |e: std::io::Error| AuthError::Io(e.to_string());
    let (read, write) = (stream.read_timeout().map_err(sys)?, stream.write_timeout().map_err(sys)?);
    let timeout = timeout.max(Duration::from_millis(1));
    stream.set_read_timeout(Some(timeout)).map_err(sys)?;
    stream.set_write_timeout(Some(timeout)).map_err(sys)?;
    let r = f(stream);
    stream.set_read_timeout(read).map_err(sys)?;
    stream.set_write_timeout(write).map_err(sys)?;
    r
}

fn io(e: std::io::Error, peer: &'static str, timeout: Duration) -> AuthError {
    match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => AuthError::Closed(peer),
        ErrorKind::WouldBlock | ErrorKind::TimedOut => AuthError::Timeout(peer, timeout.as_secs_f64()),
        _ => AuthError::Io(e.to_string()),
    }
}

fn random<const N: usize>() -> Result<[u8; N], AuthError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(b)
}

#[cfg(test)]
mod tests;
