//! conflux's errors as Python exceptions. The classes live in `conflux/errors.py`, where they
//! can also derive from the built-in ones (ValueError, TimeoutError) that callers catch.

use conflux::{Error, LinkError};
use pyo3::prelude::*;

/// The Python class for `e` and the rank it blames.
pub(crate) fn classify(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_) | Error::Config(_) => "InvalidArgument",
        Error::WaitTimeout { .. } => "CommTimeout",
        Error::Mismatch(_) => "MismatchError",
        Error::Closed(_) => "ClosedError",
        Error::Link { source, .. } => match source {
            LinkError::Timeout { .. } => "CommTimeout",
            LinkError::Mismatch { .. } => "MismatchError",
            LinkError::Aborted => "ClosedError",
            _ => "PeerError",
        },
        Error::Store(_) | Error::Setup { .. } | Error::Auth { .. } => "ConfluxError",
    }
}

/// The Python exception for a conflux error, carrying its message and the blamed rank.
pub fn py_err(e: Error) -> PyErr {
    Python::attach(|py| {
        let class = py.import("conflux.errors").and_then(|m| m.getattr(classify(&e)));
        match class.and_then(|c| c.call1((e.to_string(), e.peer()))) {
            Ok(exc) => PyErr::from_value(exc),
            Err(failed) => failed,
        }
    })
}
