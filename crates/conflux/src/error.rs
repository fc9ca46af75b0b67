//! The error a collective returns. Each layer below has its own type and is wrapped here.

use std::sync::Arc;

use crate::auth::AuthError;
use crate::store::StoreError;
use crate::transport::LinkError;

/// What went wrong in a call on a communicator.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An argument is wrong: a length that does not match the count, a root or peer out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation could not complete on the links; names the operation and the peer.
    #[error("{op}: {source}")]
    Link { op: String, source: LinkError },
    /// Ranks made different calls where they must make the same one (e.g. creating a group).
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// The communicator was shut down or aborted; no more operations run on it.
    #[error("communicator is closed: {0}")]
    Closed(String),
    /// The rendezvous store failed during setup.
    #[error("rendezvous failed: {0}")]
    Store(#[from] StoreError),
    /// A TCP data connection between ranks did not authenticate (see [`crate::auth`]).
    #[error("{context}: {source}")]
    Auth { context: String, source: AuthError },
    /// A system call failed while setting the communicator up.
    #[error("{context}: {source}")]
    Setup { context: String, source: Arc<std::io::Error> },
    /// An environment variable or option holds a value we cannot use.
    #[error("configuration: {0}")]
    Config(String),
    /// A caller's wait on a work handle passed its own timeout; the operation itself goes on.
    #[error("{op}: not completed within {secs:.3}s")]
    WaitTimeout { op: String, secs: f64 },
}

impl Error {
    pub(crate) fn setup(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Setup { context: context.into(), source: Arc::new(source) }
    }

    /// The rank this error blames, when it blames one.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Link { source, .. } => source.peer(),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
