//! The `conflux` command line tools as a library, so that the rank programs of the tests and
//! the benchmark share one launcher and one checker.

pub mod verify;
