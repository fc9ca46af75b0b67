//! What this rank can tell of every rank of a communicator without asking any of them, as
//! HCCL's get_device_status tells of each card: whether its process is still in the job (the
//! store's list of ranks gone), the last collective it entered (for ranks on this host, their
//! call boards in the shared segment; they publish every call there), and the link that leads
//! to it. Reading it never waits for a rank: it is meant for when ranks are stuck.

use super::Communicator;

/// One rank, as [`Communicator::status`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStatus {
    /// Its rank in this communicator.
    pub rank: usize,
    /// Its rank in the job.
    pub world_rank: usize,
    /// Whether its process is still in the job; None when the store cannot say (its host, rank
    /// 0's, is gone or unreachable). This rank itself is alive.
    pub alive: Option<bool>,
    /// The last collective it entered, as `#12 all_reduce(float x 1024, sum)` (the same number
    /// on every rank), when this rank can see it: ranks sharing its host's segment, itself
    /// included. None for the others, or before its first collective.
    pub last_call: Option<String>,
    /// The link this rank uses to reach it: "self", "shm" or "tcp".
    pub link: &'static str,
}

impl Communicator {
    /// Every rank's status, from this rank's view (see the module's comment). Not collective;
    /// never waits for another rank.
    pub fn status(&self) -> Vec<RankStatus> {
        let core = &self.core;
        let gone = core.session.store.as_ref().map(|(store, _)| store.gone());
        let topo = self.topology();
        let node_of = |r: usize| topo.nodes.iter().position(|v| v.contains(&r));
        (0..self.size())
            .map(|rank| {
                let world_rank = core.world[rank];
                let alive = if rank == self.rank() {
                    Some(true)
                } else {
                    match &gone {
                        None => Some(true), // a one-rank job
                        Some(Ok(gone)) => Some(!gone.contains(&world_rank)),
                        Some(Err(_)) => None,
                    }
                };
                let last_call =
                    core.board.as_ref().and_then(|b| b.latest(rank)).map(|(seq, fp)| format!("#{seq} {fp}"));
                let link = if rank == self.rank() {
                    "self"
                } else if !topo.local_tcp && node_of(rank) == node_of(self.rank()) {
                    "shm"
                } else {
                    "tcp"
                };
                RankStatus { rank, world_rank, alive, last_call, link }
            })
            .collect()
    }
}
