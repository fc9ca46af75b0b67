//! Links between ranks: shared memory within a host, TCP across hosts.

/// Why a transfer on a link failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkError {
    /// The peer's process exited or its connection closed.
    #[error("peer rank {peer} is gone: {detail}")]
    PeerGone { peer: usize, detail: String },
    /// The deadline passed while these ranks had not delivered or accepted their part.
    #[error("timed out after {secs:.1}s waiting for rank(s) {peers:?}")]
    Timeout { peers: Vec<usize>, secs: f64 },
    /// The peer sent something that does not match what this rank expected (length, tag).
    #[error("rank {peer} does not match this rank's call: {detail}")]
    Mismatch { peer: usize, detail: String },
    /// Another rank saw a failure and told everyone.
    #[error("rank {culprit} failed (reported by rank {reporter}): {reason}")]
    Remote { culprit: usize, reporter: usize, reason: String },
    /// This rank's communicator was aborted.
    #[error("aborted on this rank")]
    Aborted,
    /// A system call on the link failed.
    #[error("I/O error on the link to rank {peer}: {detail}")]
    Io { peer: usize, detail: String },
}

impl LinkError {
    /// The rank this error blames.
    pub fn peer(&self) -> Option<usize> {
        match self {
            LinkError::PeerGone { peer, .. } | LinkError::Mismatch { peer, .. } | LinkError::Io { peer, .. } => Some(*peer),
            LinkError::Remote { culprit, .. } => Some(*culprit),
            LinkError::Timeout { peers, .. } => peers.first().copied(),
            LinkError::Aborted => None,
        }
    }
}
