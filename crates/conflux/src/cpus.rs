//! The CPUs a process may run on: what the topology counts as a node's cores (bootstrap) and
//! what `conflux run` binds ranks to.

/// The CPUs this process may run on, in order; when that cannot be read, as many as the OS
/// reports.
pub fn allowed() -> Vec<usize> {
    use rustix::thread::{sched_getaffinity, CpuSet};
    match sched_getaffinity(None) {
        Ok(set) if set.count() > 0 => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        _ => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}
