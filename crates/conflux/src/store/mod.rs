//! Rendezvous: a TCP key-value store served by rank 0 (the role torch's TCPStore plays).
//!
//! Ranks exchange their addresses and shared-memory handles through it, and each keeps
//! *monitor* connections open: channel 0 for the process's life, and one per communicator
//! (sub-groups and priority lanes included), so that each progress engine hears every event on
//! its own socket. The server knows a rank is gone when one of its monitor channels closes
//! without a goodbye, and tells every other monitor once; a rank that fails because of a peer
//! reports it the same way. So a failure reaches every rank and every communicator, also the
//! ones that were not talking to the dead one.
//!
//! Wire format (both directions): frames of `u32 LE body length` + body, body = `u8 kind` +
//! fields; byte strings are `u32 LE length` + bytes, integers are 8 bytes LE. Lengths are
//! checked against [`wire::MAX_FRAME`] before anything is allocated.
//!
//! With a job token, each connection first runs [`crate::auth`]'s handshake; the server reads
//! no request from a connection that failed it.

use crate::auth::AuthError;

mod client;
mod server;
mod wire;

pub use client::{Monitor, StoreClient};
pub use server::StoreServer;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or its connection broke.
    #[error("store at {addr}: {detail}")]
    Connection { addr: String, detail: String },
    /// A key did not appear before the deadline.
    #[error("timed out after {secs:.1}s waiting for key(s) {keys:?}")]
    Timeout { keys: Vec<String>, secs: f64 },
    /// The connection did not authenticate (see [`crate::auth`]): the two ends hold
    /// different job tokens, or only one holds one.
    #[error("store at {addr}: {source}")]
    Auth { addr: String, source: AuthError },
    /// The peer spoke something that is not the store protocol, or a frame was too large.
    #[error("store protocol violation: {0}")]
    Protocol(String),
}

/// What a monitor connection learns about the job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The rank's monitor connection closed without a goodbye.
    RankDied { rank: usize },
    /// `reporter` failed an operation because of `culprit`.
    Failure { culprit: usize, reporter: usize, reason: String },
    /// The rank's process said goodbye: it shut down cleanly and will take part in nothing
    /// more, so a peer still waiting for it waits in vain.
    RankLeft { rank: usize },
    /// The store itself went away.
    StoreLost,
}

#[cfg(test)]
mod tests;
