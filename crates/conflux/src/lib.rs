//! conflux: collective communication for CPU processes over shared memory and TCP.

pub mod dtype;
pub mod error;
pub mod reduce;
pub mod store;
pub mod transport;

pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub mod config;
mod algo;
mod comm;
pub use comm::{CommBuilder, Communicator, Work};
pub use config::{AlgoChoice, Config, TransportKind};
pub use transport::LinkError;
pub use store::StoreError;
