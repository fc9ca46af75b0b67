//! `conflux._native.Comm`: a communicator, with every collective taking buffers as
//! (address, count, dtype) triples (see `raw.rs`). Each call blocks, with the GIL released,
//! unless `done` is given: then it returns a `Work` at once and calls `done()` when over.

use std::time::Duration;

use conflux::{with_dtype, Algo, Buffer, CommBuilder, Communicator, Config, Priority, ReduceOp, TraceAs};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::py_err;
use crate::options;
use crate::raw::{Raw, Region, Triple};
use crate::work::Work;

#[pyclass(module = "conflux._native", frozen)]
pub struct Comm {
    inner: Communicator,
}

fn reduce_op(name: &str) -> PyResult<ReduceOp> {
    ReduceOp::parse(name).ok_or_else(|| PyValueError::new_err(format!("unknown reduce op {name:?}")))
}

/// A communicator's identity in the trace when it stands for a group of a larger job:
/// (name, the members' global ranks, the job's size).
type TraceAsArg = Option<(String, Vec<usize>, usize)>;

/// The `CONFLUX_*` settings, with the timeout (seconds) and trace directory given here
/// instead, if they are.
fn config_with(timeout: Option<f64>, trace: Option<String>, trace_as: TraceAsArg) -> PyResult<Config> {
    let mut config = Config::from_env().map_err(py_err)?;
    if let Some(dir) = trace.filter(|d| !d.is_empty()) {
        config.trace = Some(dir.into());
    }
    config.trace_as = trace_as.map(|(name, ranks, world_size)| TraceAs { name, ranks, world_size });
    if let Some(t) = timeout {
        config.timeout = Duration::try_from_secs_f64(t)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| PyValueError::new_err(format!("timeout must be a positive number of seconds, not {t}")))?;
    }
    Ok(config)
}

/// Hands `buf` to `blocking`, run with the GIL released, or to `spawn`, whose Work it returns.
fn issue<B: Send, T: Send + 'static>(
    py: Python<'_>,
    done: Option<Py<PyAny>>,
    buf: B,
    blocking: impl FnOnce(B) -> conflux::Result<()> + Send,
    spawn: impl FnOnce(B) -> conflux::Work<T>,
) -> PyResult<Option<Work>> {
    match done {
        None => py.detach(|| blocking(buf)).map(|_| None).map_err(py_err),
        Some(cb) => Ok(Some(Work::new(py, spawn(buf), Some(cb)))),
    }
}

#[pymethods]
impl Comm {
    /// Joins the job the environment describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    /// CONFLUX_*); `timeout` (seconds) overrides CONFLUX_TIMEOUT_S, `trace` (a directory)
    /// CONFLUX_TRACE.
    #[staticmethod]
    #[pyo3(signature = (timeout=None, trace=None, options=None))]
    fn from_env(
        py: Python<'_>,
        timeout: Option<f64>,
        trace: Option<String>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Comm> {
        let config = options::from_dict(options)?.apply(&config_with(timeout, trace, None)?);
        let inner = py.detach(|| Communicator::from_env_with(config)).map_err(py_err)?;
        Ok(Comm { inner })
    }

    /// Joins a job by explicit rank, size and store ("host:port"; rank 0 serves it).
    #[staticmethod]
    /// `options`: per-communicator settings (see `options::from_dict`), over the environment's.
    #[pyo3(signature = (rank, size, store=None, timeout=None, trace=None, trace_as=None, options=None))]
    #[allow(clippy::too_many_arguments)] // Python keywords, each optional
    fn create(
        py: Python<'_>,
        rank: usize,
        size: usize,
        store: Option<String>,
        timeout: Option<f64>,
        trace: Option<String>,
        trace_as: TraceAsArg,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Comm> {
        let config = config_with(timeout, trace, trace_as)?;
        let mut b = CommBuilder::new(rank, size).config(config).options(&options::from_dict(options)?);
        if let Some(s) = store {
            b = b.store(s);
        }
        let inner = py.detach(|| b.build()).map_err(py_err)?;
        Ok(Comm { inner })
    }

    /// A new handle on this communicator for the C ABI (capi.rs), owned by the caller until
    /// it gives it back with the ABI's `release`.
    fn c_handle(&self) -> usize {
        crate::capi::handle_of(&self.inner)
    }

    /// Marks the start of the next step in this rank's trace; its number, or None untraced.
    fn mark_step(&self) -> Option<u64> {
        self.inner.mark_step()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }
    #[getter]
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    #[getter]
    fn local_size(&self) -> usize {
        self.inner.local_size()
    }
    #[getter]
    fn world_ranks(&self) -> Vec<usize> {
        self.inner.world_ranks().to_vec()
    }
    #[getter]
    fn timeout(&self) -> f64 {
        self.inner.timeout().as_secs_f64()
    }

    /// A handle on this communicator whose operations run on the high-priority lane.
    fn with_priority(&self, high: bool) -> Comm {
        let p = if high { Priority::High } else { Priority::Normal };
        Comm { inner: self.inner.with_priority(p) }
    }

    /// A handle whose collectives use the algorithm named (None: the usual choice).
    #[pyo3(signature = (name=None))]
    fn with_algo(&self, name: Option<&str>) -> PyResult<Comm> {
        let algo = match name {
            None => None,
            Some(n) => Some(Algo::parse(n).ok_or_else(|| {
                let names: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
                py_err(conflux::Error::InvalidArgument(format!(
                    "unknown algorithm {n:?} (one of {})",
                    names.join(", ")
                )))
            })?),
        };
        Ok(Comm { inner: self.inner.with_algo(algo) })
    }

    /// Collective over this communicator: `ranks[i]` becomes rank i; None for non-members.
    /// `options` (the same on every rank) set the group's link, algorithm, timeout, traffic class.
    #[pyo3(signature = (ranks, options=None))]
    fn new_group(
        &self,
        py: Python<'_>,
        ranks: Vec<usize>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Comm>> {
        let o = options::from_dict(options)?;
        let g = py.detach(|| self.inner.new_group_with(&ranks, &o)).map_err(py_err)?;
        Ok(g.map(|inner| Comm { inner }))
    }

    /// MPI_Comm_split: ranks with the same color form a group, ordered by (key, rank).
    #[pyo3(signature = (color, key=0, options=None))]
    fn split(
        &self,
        py: Python<'_>,
        color: Option<u32>,
        key: i64,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Comm>> {
        let o = options::from_dict(options)?;
        let g = py.detach(|| self.inner.split_with(color, key, &o)).map_err(py_err)?;
        Ok(g.map(|inner| Comm { inner }))
    }

    /// Measures every pair's link (collective; see `Communicator::link_health`): a dict of
    /// matrices, kinds, slow pairs and references (`options::health_dict`).
    #[pyo3(signature = (bytes=4 << 20, iters=10, threshold=0.5))]
    fn check_link_health<'py>(
        &self,
        py: Python<'py>,
        bytes: usize,
        iters: usize,
        threshold: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let o = conflux::HealthOptions { bytes, iters, threshold };
        let h = py.detach(|| self.inner.link_health(&o)).map_err(py_err)?;
        options::health_dict(py, &h)
    }

    #[pyo3(signature = (buf, op, done=None))]
    fn all_reduce(&self, py: Python<'_>, buf: Triple, op: &str, done: Option<Py<PyAny>>) -> PyResult<Option<Work>> {
        let (r, op, c) = (Region::parse(&buf)?, reduce_op(op)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |mut b| c.all_reduce(b.as_mut_slice(), op), |b| c.all_reduce_async(b, op))
        })
    }

    /// Reduces every buffer of `bufs` (one dtype) in place, as one message.
    #[pyo3(signature = (bufs, op, done=None))]
    fn all_reduce_coalesced(
        &self,
        py: Python<'_>,
        bufs: Vec<Triple>,
        op: &str,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<Work>> {
        let regions: Vec<Region> = bufs.iter().map(Region::parse).collect::<PyResult<_>>()?;
        let (op, c) = (reduce_op(op)?, &self.inner);
        let Some(first) = regions.first() else { return Ok(None) };
        with_dtype!(first.dtype(), T => {
            let raws: Vec<Raw<T>> = regions.iter().map(|r| Raw::<T>::new(*r)).collect::<PyResult<_>>()?;
            issue(
                py,
                done,
                raws,
                |mut raws| {
                    let mut slices: Vec<&mut [T]> = raws.iter_mut().map(|r| r.as_mut_slice()).collect();
                    c.all_reduce_coalesced(&mut slices, op)
                },
                |raws| c.all_reduce_coalesced_async(raws, op),
            )
        })
    }

    /// Every rank's status from this rank's view, without waiting for any (see
    /// `Communicator::status`): dicts of "rank", "world_rank", "alive", "last_call", "links".
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let all = py.detach(|| self.inner.status());
        all.iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("rank", s.rank)?;
                d.set_item("world_rank", s.world_rank)?;
                d.set_item("alive", s.alive)?;
                d.set_item("last_call", &s.last_call)?;
                d.set_item("links", s.link)?;
                Ok(d)
            })
            .collect()
    }

    /// The survivors' communicator, without `exclude` as well (collective over the ranks
    /// still alive and not excluded; see `Communicator::shrink_without`).
    #[pyo3(signature = (exclude=Vec::new()))]
    fn shrink(&self, py: Python<'_>, exclude: Vec<usize>) -> PyResult<Comm> {
        let inner = py.detach(|| self.inner.shrink_without(&exclude)).map_err(py_err)?;
        Ok(Comm { inner })
    }

    /// Why this communicator can no longer be used ("aborted", "aborted by rank 2", "shut
    /// down", ...), or None while it can.
    #[getter]
    fn closed(&self) -> Option<String> {
        self.inner.closed_reason()
    }

    /// Bytes a gradient bucket holds (`CONFLUX_BUCKET_MB`).
    #[getter]
    fn bucket_bytes(&self) -> usize {
        self.inner.config().bucket_bytes
    }

    #[pyo3(signature = (buf, root, done=None))]
    fn broadcast(&self, py: Python<'_>, buf: Triple, root: usize, done: Option<Py<PyAny>>) -> PyResult<Option<Work>> {
        let (r, c) = (Region::parse(&buf)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |mut b| c.broadcast(b.as_mut_slice(), root), |b| c.broadcast_async(b, root))
        })
    }

    /// In place: the root's buffer gets the reduction; other ranks' buffers are unchanged.
    #[pyo3(signature = (buf, op, root, done=None))]
    fn reduce(
        &self,
        py: Python<'_>,
        buf: Triple,
        op: &str,
        root: usize,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<Work>> {
        let (r, op, c) = (Region::parse(&buf)?, reduce_op(op)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |mut b| c.reduce(b.as_mut_slice(), op, root), |b| c.reduce_async(b, op, root))
        })
    }

    /// In place: `buf` holds size blocks, this rank's already in place.
    #[pyo3(signature = (buf, done=None))]
    fn all_gather(&self, py: Python<'_>, buf: Triple, done: Option<Py<PyAny>>) -> PyResult<Option<Work>> {
        let (r, c) = (Region::parse(&buf)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |mut b| c.all_gather_in_place(b.as_mut_slice()), |b| c.all_gather_async(b))
        })
    }

    /// In place: afterwards block `rank` of `buf` holds this rank's reduced block.
    #[pyo3(signature = (buf, op, done=None))]
    fn reduce_scatter(&self, py: Python<'_>, buf: Triple, op: &str, done: Option<Py<PyAny>>) -> PyResult<Option<Work>> {
        let (r, op, c) = (Region::parse(&buf)?, reduce_op(op)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |mut b| c.reduce_scatter_in_place(b.as_mut_slice(), op), |b| c.reduce_scatter_async(b, op))
        })
    }

    /// Uneven all_to_all: rank p gets `send_counts[p]` elements, `recv_counts[p]` come from it.
    #[pyo3(signature = (send, send_counts, recv, recv_counts, done=None))]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        send: Triple,
        send_counts: Vec<usize>,
        recv: Triple,
        recv_counts: Vec<usize>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<Work>> {
        let (s, r, c) = (Region::parse(&send)?, Region::parse(&recv)?, &self.inner);
        with_dtype!(s.dtype(), T => {
            issue(
                py,
                done,
                (Raw::<T>::new(s)?, Raw::<T>::new(r)?),
                |(sb, mut rb)| c.all_to_all_v(sb.as_slice(), &send_counts, rb.as_mut_slice(), &recv_counts),
                |(sb, rb)| c.all_to_all_v_async(sb, &send_counts, rb, &recv_counts),
            )
        })
    }

    #[pyo3(signature = (buf, peer, tag=0, done=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: Triple,
        peer: usize,
        tag: u32,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<Work>> {
        let (r, c) = (Region::parse(&buf)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |b| c.send(b.as_slice(), peer, tag), |b| c.send_async(b, peer, tag))
        })
    }

    #[pyo3(signature = (buf, peer, tag=0, done=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: Triple,
        peer: usize,
        tag: u32,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<Work>> {
        let (r, c) = (Region::parse(&buf)?, &self.inner);
        with_dtype!(r.dtype(), T => {
            issue(py, done, Raw::<T>::new(r)?, |mut b| c.recv(b.as_mut_slice(), peer, tag), |b| c.recv_async(b, peer, tag))
        })
    }

    /// Receives the next message with `tag` from whichever rank sends one first; always
    /// asynchronous: the Work's `source` is that rank once it completes.
    #[pyo3(signature = (buf, tag=0, done=None))]
    fn recv_any(&self, py: Python<'_>, buf: Triple, tag: u32, done: Option<Py<PyAny>>) -> PyResult<Work> {
        let r = Region::parse(&buf)?;
        with_dtype!(r.dtype(), T => Ok(Work::with_source(py, self.inner.recv_any_async(Raw::<T>::new(r)?, tag), done)))
    }

    #[pyo3(signature = (done=None))]
    fn barrier(&self, py: Python<'_>, done: Option<Py<PyAny>>) -> PyResult<Option<Work>> {
        let c = &self.inner;
        issue(py, done, (), |()| c.barrier(), |()| c.barrier_async())
    }

    /// Stops every pending and future operation on this rank; never blocks.
    fn abort(&self) {
        self.inner.abort();
    }

    /// Finishes what was issued, says goodbye and closes the links.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.shutdown()).map_err(py_err)
    }

    fn __repr__(&self) -> String {
        format!("<conflux Comm rank {} of {}>", self.inner.rank(), self.inner.size())
    }
}
