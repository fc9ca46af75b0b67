//! What every communicator of one process shares: the job's store (and, on rank 0, its
//! server), and the process's own monitor line, channel 0, whose goodbye tells the job this
//! rank left cleanly.
//!
//! Sub-groups and priority lanes each open their own monitor channel and links, but they
//! rendezvous through this store; none starts a new one. The session lives as long as any
//! communicator made from it, and the goodbye waits for the last of them to shut down.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::bootstrap::resolve;
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::store::{Monitor, StoreClient, StoreServer};

pub(crate) struct Session {
    pub world_size: usize,
    /// The store and its address; `None` for a job of one rank.
    pub store: Option<(StoreClient, SocketAddr)>,
    line: Mutex<Option<Monitor>>,
    server: Option<StoreServer>,
    next_channel: AtomicU64,
    timeout: Duration,
    /// Communicators made from this session and not yet shut down.
    open: AtomicUsize,
}

impl Session {
    /// Joins (on rank 0, serves) the store at `store`; with `token`, every connection to it
    /// is authenticated.
    pub fn open(
        rank: usize,
        size: usize,
        store: Option<String>,
        timeout: Duration,
        token: Option<&Token>,
    ) -> Result<Session> {
        let mut s = Session {
            world_size: size,
            store: None,
            line: Mutex::new(None),
            server: None,
            next_channel: AtomicU64::new(1),
            timeout,
            open: AtomicUsize::new(0),
        };
        if size > 1 {
            let addr_s = store.ok_or_else(|| Error::Config("a store address is needed when size > 1".into()))?;
            let addr = resolve(&addr_s)?;
            s.server = if rank == 0 { Some(StoreServer::bind(addr, token.cloned())?) } else { None };
            let client = StoreClient::connect(&addr_s, timeout, token.cloned())?;
            *s.line.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(client.monitor(rank, 0, timeout)?);
            s.store = Some((client, addr));
        }
        Ok(s)
    }

    /// Counts a communicator made from this session as open.
    pub fn opened(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts one as shut down (once per communicator); true when it was the last open one.
    pub fn closed_one(&self) -> bool {
        self.open.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// A monitor channel number no other communicator of this process uses.
    pub fn channel(&self) -> u64 {
        self.next_channel.fetch_add(1, Ordering::Relaxed)
    }

    /// Tells every rank, through the store, that this rank (global `rank`) fails because of
    /// `culprit`. Never blocks for long: the line is held only to write one frame.
    pub fn report(&self, culprit: usize, reason: &str) {
        if let Some(line) = self.line.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            line.report_failure(culprit, reason);
        }
    }

    /// Says this rank leaves cleanly; on rank 0, keeps serving the store until every rank has
    /// said so (or died), so none sees it vanish while shutting down. Idempotent.
    pub fn goodbye(&self) {
        let Some(mut line) = self.line.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        line.goodbye();
        if let Some(server) = &self.server {
            server.wait_goodbyes(self.world_size, self.timeout);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.goodbye();
    }
}
