//! Sub-communicators: `new_group` (a list of ranks, as torch's new_group and MPI_Group_incl)
//! and `split` (MPI_Comm_split). Both are collective over the parent: every rank of the parent
//! calls, members and non-members alike, in the same order as its other group calls.
//!
//! Agreement goes through the store the parent already has: each rank publishes what it asked
//! for under the parent's prefix and the group's sequence number, then reads everyone's. A
//! rank that asked for something else makes every rank fail with the same message, naming both
//! calls; a rank that never calls makes the others time out naming it. Members then build the
//! group's own lanes (a fresh shared segment and TCP links among members), because each
//! communicator runs its own engines and issue order; nothing else is set up again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::core::Core;
use super::Communicator;
use crate::config::Options;
use crate::error::{Error, Result};
use crate::store::StoreError;
use crate::transport::LinkError;

impl Communicator {
    /// A communicator of the given ranks of this one, numbered in the order given (rank
    /// `ranks[i]` becomes rank i). Every rank of this communicator must call it with the same
    /// list; those not in it get `Ok(None)`.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<Communicator>> {
        self.new_group_with(ranks, &Options::default())
    }

    /// `new_group` whose communicator gets `options` over this one's settings (its link kind,
    /// algorithms, timeout, traffic class). Every rank must pass the same options.
    pub fn new_group_with(&self, ranks: &[usize], options: &Options) -> Result<Option<Communicator>> {
        options.validate()?;
        let n = self.size();
        let mut seen = vec![false; n];
        let mut problem = ranks.is_empty().then(|| "the list is empty".to_string());
        for &r in ranks {
            if r >= n || std::mem::replace(&mut seen[r], true) {
                let why = if r >= n { "is out of range" } else { "appears twice" };
                problem.get_or_insert(format!("rank {r} {why} (this communicator has {n} ranks)"));
            }
        }
        let ask = format!("new_group({ranks:?}{})", options.describe());
        let (id, _) = self.agree(&ask)?;
        if let Some(p) = problem {
            return Err(Error::InvalidArgument(format!("{ask}: {p}")));
        }
        match ranks.iter().position(|&r| r == self.rank()) {
            None => Ok(None),
            Some(me) => self.child(format!("{}/g{id}", self.core.prefix), ranks, me, options).map(Some),
        }
    }

    /// Splits this communicator by `color`: ranks passing the same color form one new
    /// communicator, ordered by `key`, then by their rank here. `None` (MPI_UNDEFINED) joins
    /// none and gets `Ok(None)`. Every rank of this communicator must call it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.split_with(color, key, &Options::default())
    }

    /// `split` whose communicators get `options` (see `new_group_with`); every rank, whatever
    /// its color, must pass the same options.
    pub fn split_with(&self, color: Option<u32>, key: i64, options: &Options) -> Result<Option<Communicator>> {
        options.validate()?;
        let color_s = color.map_or("none".to_string(), |c| c.to_string());
        let ask = format!("split(color={color_s}, key={key}){}", options.describe());
        let (id, calls) = self.agree(&ask)?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> = Vec::new();
        for (r, call) in calls.iter().enumerate() {
            let bad = || Error::Mismatch(format!("group call #{id}: rank {} sent {call:?}", self.core.world[r]));
            let (theirs, key) = parse_split(call).ok_or_else(bad)?;
            if theirs == Some(color) {
                members.push((key, r));
            }
        }
        members.sort();
        let ranks: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        let me = ranks.iter().position(|&r| r == self.rank()).expect("this rank has this color");
        self.child(format!("{}/g{id}/c{color}", self.core.prefix), &ranks, me, options).map(Some)
    }

    /// Publishes this rank's call `ask` as group call number `id` and reads every rank's.
    /// Every rank must have made the same call (for a split: a split, colors may differ); if
    /// not, each fails naming the same two ranks: the first and the first that differs from it.
    fn agree(&self, ask: &str) -> Result<(u64, Vec<String>)> {
        let id = self.core.groups.fetch_add(1, Ordering::SeqCst);
        let Some((store, _)) = &self.core.session.store else { return Ok((id, vec![ask.to_string()])) };
        store.set(&self.ask_key(id, self.rank()), ask.as_bytes())?;
        let calls: Vec<String> = (0..self.size())
            .map(|r| if r == self.rank() { Ok(ask.to_string()) } else { self.asked(id, r) })
            .collect::<Result<_>>()?;
        // Splits may differ in color and key, not in anything else (their options).
        fn kind(c: &str) -> &str {
            match c.strip_prefix("split(") {
                Some(rest) => rest.split_once(')').map_or(c, |(_, options)| options),
                None => c,
            }
        }
        if let Some(r) = (1..calls.len()).find(|&r| kind(&calls[r]) != kind(&calls[0])) {
            let w = &self.core.world;
            return Err(Error::Mismatch(format!(
                "group call #{id}: rank {} called {}, rank {} called {}",
                w[0], calls[0], w[r], calls[r]
            )));
        }
        Ok((id, calls))
    }

    fn ask_key(&self, id: u64, rank: usize) -> String {
        format!("{}/g{id}/ask/{rank}", self.core.prefix)
    }

    /// What rank `r` asked for in group call `id`, waiting for it until the deadline.
    fn asked(&self, id: u64, r: usize) -> Result<String> {
        let (store, _) = self.core.session.store.as_ref().expect("only multi-rank communicators ask");
        let start = Instant::now();
        match store.get(&self.ask_key(id, r), self.timeout()) {
            Ok(v) => Ok(String::from_utf8_lossy(&v).into_owned()),
            Err(StoreError::Timeout { .. }) => Err(Error::Link {
                op: format!("group call #{id}"),
                source: LinkError::Timeout { peers: vec![self.core.world[r]], secs: start.elapsed().as_secs_f64() },
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The communicator of `ranks` (ranks of this one), where this rank is number `me`.
    pub(super) fn child(&self, prefix: String, ranks: &[usize], me: usize, options: &Options) -> Result<Communicator> {
        let world: Arc<[usize]> = ranks.iter().map(|&r| self.core.world[r]).collect();
        let (session, config) = (self.core.session.clone(), options.apply(&self.core.config));
        let core =
            Core::new(session, prefix, world, me, config, false, Some((self.core.model, self.core.model_source)))?;
        Ok(Communicator { core: Arc::new(core), lane: 0, algo: None, timeout: None })
    }
}

/// `split(color=C, key=K)` back into (color, key).
fn parse_split(s: &str) -> Option<(Option<u32>, i64)> {
    let rest = s.strip_prefix("split(color=")?.split_once(')')?.0;
    let (c, k) = rest.split_once(", key=")?;
    let color = if c == "none" { None } else { Some(c.parse().ok()?) };
    Some((color, k.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::parse_split;

    #[test]
    fn split_calls_parse_back() {
        assert_eq!(parse_split("split(color=3, key=-2)"), Some((Some(3), -2)));
        assert_eq!(parse_split("split(color=none, key=0)"), Some((None, 0)));
        assert_eq!(parse_split("split(color=1, key=0), transport=tcp"), Some((Some(1), 0)));
        assert_eq!(parse_split("new_group([0, 1])"), None);
    }
}
