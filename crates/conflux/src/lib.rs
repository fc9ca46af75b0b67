//! conflux: collective communication for CPU processes over shared memory and TCP.

pub mod auth;
mod bytes;
mod call;
pub mod dtype;
mod sockopt;
/// Re-exported for `with_dtype!`, whose expansions name the half types.
pub use half;
pub mod error;
pub mod measure;
pub mod reduce;
pub mod store;
pub mod trace;
pub mod transport;

pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub mod algo;
mod comm;
pub mod config;
pub mod cpus;
pub use algo::{Algo, OpKind};
pub use comm::{
    Bucketer, Buffer, CommBuilder, Communicator, HealthOptions, Helper, KindReference, LinkHealth, LinkKind, Priority,
    RankStatus, WaitTracker, Work,
};
pub use config::{AlgoSpec, Config, Options, TraceAs, TransportKind};
pub use store::StoreError;
pub use transport::LinkError;
