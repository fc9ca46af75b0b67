//! Rendezvous: a TCP key-value store served by rank 0 (the role torch's TCPStore plays).

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or its connection broke.
    #[error("store at {addr}: {detail}")]
    Connection { addr: String, detail: String },
    /// A key did not appear before the deadline.
    #[error("timed out after {secs:.1}s waiting for key(s) {keys:?}")]
    Timeout { keys: Vec<String>, secs: f64 },
    /// The peer spoke something that is not the store protocol, or a frame was too large.
    #[error("store protocol violation: {0}")]
    Protocol(String),
}
