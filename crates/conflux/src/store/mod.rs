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
use std::time::Duration;
pub struct StoreServer;
impl StoreServer { pub fn bind(_a: std::net::SocketAddr) -> Result<StoreServer, StoreError> { todo!() } pub fn local_addr(&self) -> std::net::SocketAddr { todo!() } }
pub struct StoreClient;
impl StoreClient {
 pub fn connect(_a: &str, _t: Duration) -> Result<StoreClient, StoreError> { todo!() }
 pub fn set(&self, _k: &str, _v: &[u8]) -> Result<(), StoreError> { todo!() }
 pub fn get(&self, _k: &str, _t: Duration) -> Result<Vec<u8>, StoreError> { todo!() }
 pub fn wait(&self, _k: &[&str], _t: Duration) -> Result<(), StoreError> { todo!() }
 pub fn add(&self, _k: &str, _d: i64) -> Result<i64, StoreError> { todo!() }
 pub fn monitor(&self, _r: usize) -> Result<Monitor, StoreError> { todo!() }
 pub fn local_addr(&self) -> std::net::SocketAddr { todo!() }
}
#[derive(Debug, Clone, PartialEq)]
pub enum Event { RankDied { rank: usize }, Failure { culprit: usize, reporter: usize, reason: String }, StoreLost }
pub struct Monitor;
impl std::os::fd::AsFd for Monitor { fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> { todo!() } }
impl Monitor {
 pub fn try_event(&mut self) -> Option<Event> { todo!() }
 pub fn report_failure(&mut self, _c: usize, _r: &str) {}
 pub fn goodbye(&mut self) {}
 pub fn wait_all_goodbye(&mut self, _n: usize, _t: Duration) -> usize { 0 }
}
