//! Which algorithm serves each call of one lane: the cost model and the topology it prices
//! (the same on every rank, so every rank picks alike), and the choices made so far.

use std::collections::{HashMap, HashSet};

use super::ops::Plan;
use crate::algo::select::{self, Call, Model, Topo};
use crate::algo::table::{self, Row};
use crate::algo::{Algo, OpKind};

pub(crate) struct Planner {
    pub topo: Topo,
    pub model: Model,
    /// (operation, log2 size class) pairs whose choice was logged already.
    logged: HashSet<(OpKind, u32)>,
    /// Choices made so far, by call and forced algorithm, with their rows: ranking every
    /// algorithm costs more than a small all_reduce on shared memory.
    chosen: HashMap<(Call, Option<Algo>), &'static Row>,
    /// The last choice, looked at before `chosen`: a loop repeats one call shape, and
    /// comparing it costs less than hashing it (a small all_reduce on shared memory spent
    /// 2% of its time in SipHash).
    last: Option<((Call, Option<Algo>), &'static Row)>,
}

impl Planner {
    pub fn new(topo: Topo, model: Model) -> Planner {
        Planner { topo, model, logged: HashSet::new(), chosen: HashMap::new(), last: None }
    }

    /// The table's row for the forced algorithm (`forced`) or the cost model's choice,
    /// cached per call shape; logged once per operation and size class at
    /// CONFLUX_DEBUG=info.
    #[inline]
    pub fn pick(&mut self, plan: &Plan, call: &Call) -> Result<&'static Row, String> {
        let key = (*call, forced(plan, call));
        if let Some((_, row)) = self.last.filter(|(k, _)| *k == key) {
            return Ok(row);
        }
        if let Some(&row) = self.chosen.get(&key) {
            self.last = Some((key, row));
            return Ok(row);
        }
        let forced = key.1;
        let algo = select::choose(&self.model, call, &self.topo, forced)?;
        // `choose` only returns algorithms that serve the call, which the table says.
        let row = table::find(algo, call.op).ok_or_else(|| format!("{algo} has no schedule for {}", call.op))?;
        if self.chosen.len() >= 4096 {
            self.chosen.clear();
        }
        self.chosen.insert(key, row);
        self.last = Some((key, row));
        let class = usize::BITS - call.bytes.leading_zeros();
        if tracing::enabled!(tracing::Level::INFO) && self.logged.insert((call.op, class)) {
            let ranked = select::ranked(&self.model, call, &self.topo);
            let predicted: Vec<String> = ranked.iter().map(|(a, us)| format!("{a} {us:.1}us")).collect();
            tracing::info!(
                op = call.op.name(),
                bytes = call.bytes,
                chosen = algo.name(),
                forced = forced.is_some(),
                predicted = predicted.join(", "),
                "algorithm"
            );
        }
        Ok(row)
    }
}

/// The algorithm forced for `call`: this handle's, then the operation's, then the one for
/// all if it has a schedule for this form of call (`select::implements_call`: CONFLUX_ALGO=
/// direct leaves all_to_all_v to the model, as it leaves broadcast).
pub(crate) fn forced(plan: &Plan, call: &Call) -> Option<Algo> {
    match (plan.call_algo, plan.algo.forced(call.op)) {
        (Some(a), _) | (None, Some((a, true))) => Some(a),
        (None, Some((a, false))) if select::implements_call(a, call) => Some(a),
        _ => None,
    }
}
