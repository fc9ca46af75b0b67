//! The pieces of the `conflux` command, shared with the rank programs and the tests.

pub mod bench;
pub mod doctor;
pub mod launch;
pub mod run;
pub mod soak;
pub mod trace;
pub mod tune;
pub mod verify;

/// Logs to stderr at the level `CONFLUX_DEBUG` names (error, warn, info, debug, trace; the
/// default is warn), as NCCL_DEBUG does.
pub fn init_logging() {
    let level = std::env::var("CONFLUX_DEBUG").unwrap_or_else(|_| "warn".into()).to_ascii_lowercase();
    let filter =
        tracing_subscriber::EnvFilter::try_new(&level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
