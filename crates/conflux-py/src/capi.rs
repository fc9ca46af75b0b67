//! The C ABI of this module, for the C++ torch backend (`csrc/backend.cpp`): one table of
//! functions (`csrc/conflux_c.h` declares it; keep the two in step) handed over as a PyCapsule,
//! and communicator handles taken from Python `Comm` objects. One runtime serves both fronts,
//! so a traced job's Python marks and the C++ backend's operations land in one trace.

use std::ffi::{c_char, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use conflux::{with_dtype, Buffer, Communicator, DataType, Error, ReduceOp, WaitTracker};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::errors::classify;
use crate::raw::{Raw, Region};

const VERSION: u32 = 3;

const ALL_REDUCE: u32 = 0;
const BROADCAST: u32 = 1;
const REDUCE: u32 = 2;
const ALL_GATHER: u32 = 3;
const REDUCE_SCATTER: u32 = 4;
const ALL_TO_ALL_V: u32 = 5;
const SEND: u32 = 6;
const RECV: u32 = 7;
const RECV_ANY: u32 = 8;
const BARRIER: u32 = 9;
const ALL_REDUCE_COALESCED: u32 = 10;

#[repr(C)]
pub struct CfxBuf {
    ptr: *mut c_void,
    count: u64,
}

#[repr(C)]
pub struct CfxCall {
    kind: u32,
    dtype: u32,
    op: u32,
    tag: u32,
    peer: i64,
    bufs: *const CfxBuf,
    nbufs: u64,
    send_counts: *const u64,
    recv_counts: *const u64,
    ncounts: u64,
    timeout_ms: u64,
    trace: *mut *mut c_void,
    help: *mut *mut c_void,
}

#[repr(C)]
pub struct CfxOutcome {
    code: i32,
    peer: i64,
    source: i64,
    msg_len: u64,
    msg: [c_char; 1024],
}

type Done = Option<unsafe extern "C" fn(ctx: *mut c_void, outcome: *const CfxOutcome)>;

#[repr(C)]
pub struct CfxApi {
    version: u32,
    call: unsafe extern "C" fn(*const c_void, *const CfxCall, Done, *mut c_void, *mut CfxOutcome) -> i32,
    abort: unsafe extern "C" fn(*const c_void),
    shutdown: unsafe extern "C" fn(*const c_void, *mut CfxOutcome) -> i32,
    release: unsafe extern "C" fn(*const c_void),
    trace_waited: unsafe extern "C" fn(*const c_void, u64),
    trace_elsewhere: unsafe extern "C" fn(*const c_void),
    trace_release: unsafe extern "C" fn(*const c_void),
    help: unsafe extern "C" fn(*const c_void, HelpDone, *mut c_void),
    help_release: unsafe extern "C" fn(*const c_void),
}

/// Asks the C side whether the operation a helper runs is over.
type HelpDone = unsafe extern "C" fn(*mut c_void) -> bool;

static API: CfxApi = CfxApi {
    version: VERSION,
    call,
    abort,
    shutdown,
    release,
    trace_waited,
    trace_elsewhere,
    trace_release,
    help,
    help_release,
};

/// A new handle on `comm` for the C side: a communicator handle of its own, boxed, given back
/// with `release`.
pub fn handle_of(comm: &Communicator) -> usize {
    Box::into_raw(Box::new(comm.with_algo(comm.algo()))) as usize
}

/// The table, as a capsule named "conflux._native.c_api".
#[pyfunction]
pub fn c_api(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let ptr = NonNull::from(&API).cast::<c_void>();
    // SAFETY: the capsule points at a static, which outlives every capsule and every reader.
    unsafe { PyCapsule::new_with_pointer(py, ptr, c"conflux._native.c_api") }
}

/// What an operation ended with, as the C side reads it.
fn outcome(r: &conflux::Result<Option<usize>>) -> CfxOutcome {
    let mut o = CfxOutcome { code: 0, peer: -1, source: -1, msg_len: 0, msg: [0; 1024] };
    match r {
        Ok(source) => o.source = source.map_or(-1, |s| s as i64),
        Err(e) => {
            o.code = code_of(e);
            o.peer = e.peer().map_or(-1, |p| p as i64);
            let text = format!("{}: {e}", classify(e));
            let n = text.len().min(o.msg.len() - 1);
            for (d, s) in o.msg.iter_mut().zip(&text.as_bytes()[..n]) {
                *d = *s as c_char;
            }
            o.msg_len = n as u64;
        }
    }
    o
}

fn code_of(e: &Error) -> i32 {
    match classify(e) {
        "InvalidArgument" => 1,
        "CommTimeout" => 2,
        "PeerError" => 3,
        "MismatchError" => 4,
        "ClosedError" => 5,
        _ => 6,
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// The call's buffers as regions of its dtype.
fn regions(c: &CfxCall) -> Result<(DataType, Vec<Region>), Error> {
    let dtype =
        *DataType::ALL.get(c.dtype as usize).ok_or_else(|| invalid(format!("unknown dtype code {}", c.dtype)))?;
    if c.nbufs > 0 && c.bufs.is_null() {
        return Err(invalid("a call with buffers at address 0"));
    }
    let bufs: &[CfxBuf] = if c.nbufs == 0 {
        &[]
    } else {
        // SAFETY: the C++ backend passes `nbufs` descriptors at `bufs`, alive for this call.
        unsafe { std::slice::from_raw_parts(c.bufs, c.nbufs as usize) }
    };
    let regions = bufs
        .iter()
        .map(|b| Region::new(b.ptr as usize, b.count as usize, dtype).map_err(invalid))
        .collect::<Result<_, _>>()?;
    Ok((dtype, regions))
}

fn counts(ptr: *const u64, n: u64) -> Result<Vec<usize>, Error> {
    if ptr.is_null() {
        return Err(invalid("all_to_all_v without counts"));
    }
    // SAFETY: the C++ backend passes `ncounts` entries at each counts pointer, alive for this call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) }.iter().map(|&c| c as usize).collect())
}

fn op_of(c: &CfxCall) -> Result<ReduceOp, Error> {
    ReduceOp::ALL.get(c.op as usize).copied().ok_or_else(|| invalid(format!("unknown reduce op code {}", c.op)))
}

fn peer_of(c: &CfxCall) -> Result<usize, Error> {
    usize::try_from(c.peer).map_err(|_| invalid(format!("rank {} is negative", c.peer)))
}

/// Where an asynchronous operation's outcome goes: the C callback and its context.
struct Notify {
    done: unsafe extern "C" fn(*mut c_void, *const CfxOutcome),
    ctx: *mut c_void,
    /// Where the call wants its operation's wait tracker, or null.
    trace: *mut *mut c_void,
    /// Where the call wants its operation's helper (`help`), or null.
    help: *mut *mut c_void,
}

// SAFETY: the context is the C++ Work, which stays alive until its callback has run (it holds
// a reference to itself for that) and is made to be completed from any thread.
unsafe impl Send for Notify {}

impl Notify {
    fn call(self, r: conflux::Result<Option<usize>>) {
        let o = outcome(&r);
        // SAFETY: the callback and context the C++ side passed with the call, run once.
        unsafe { (self.done)(self.ctx, &o) }
    }
}

/// An issued operation and whom to tell its outcome, until one of two threads takes them.
type Watched<T> = Arc<Mutex<Option<(conflux::Work<T>, Notify)>>>;

/// Has `notify` told the outcome of `w` once it completes (at once if it has).
fn watch<T: Send + 'static>(w: conflux::Work<T>, source: fn(&T) -> Option<usize>, notify: Notify) {
    // The C++ backend waits on its own Work objects, where conflux cannot see: it records
    // those waits through the operation's tracker (`trace_waited`, `trace_elsewhere`), and
    // runs the operation itself through its helper (`help`).
    hand_out(notify.trace, || w.wait_tracker());
    hand_out(notify.help, || w.helper());
    let slot: Watched<T> = Arc::new(Mutex::new(None));
    let again = slot.clone();
    w.on_complete(move || fire(&again, source));
    let mut stored = slot.lock().unwrap_or_else(|p| p.into_inner());
    *stored = Some((w, notify));
    // Asked after storing: a callback run before the pair was stored found nothing, and the
    // operation then reads as completed here; one still to run finds the pair. Whoever takes
    // it first tells, once.
    let completed = stored.as_ref().is_some_and(|(w, _)| w.is_completed());
    drop(stored);
    if completed {
        fire(&slot, source);
    }
}

/// Writes a boxed `make()` (null for None) into the caller's `slot`, unless it passed none.
fn hand_out<H>(slot: *mut *mut c_void, make: impl FnOnce() -> Option<H>) {
    if slot.is_null() {
        return;
    }
    let handle = make().map_or(std::ptr::null_mut(), |h| Box::into_raw(Box::new(h)).cast::<c_void>());
    // SAFETY: a non-null `slot` points at the caller's slot, valid for this call (conflux_c.h).
    unsafe { slot.write(handle) };
}

/// Tells the outcome, if nobody has yet. Runs where the operation completed: its wait returns
/// at once.
fn fire<T>(slot: &Watched<T>, source: fn(&T) -> Option<usize>) {
    let taken = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((w, n)) = taken {
        n.call(w.wait().map(|v| source(&v)));
    }
}

/// The value of an operation that received from a known rank, or none: no source to report.
fn no_source<T>(_: &T) -> Option<usize> {
    None
}

/// Runs one call: blocking (`done` None) or issued (`done` told the outcome later).
fn run(comm: &Communicator, c: &CfxCall, done: Option<Notify>) -> Result<(), Error> {
    macro_rules! go {
        ($buf:expr, |$b:ident| $blocking:expr, |$a:ident| $spawn:expr) => {{
            let buf = $buf;
            match done {
                None => {
                    #[allow(unused_mut)]
                    let mut $b = buf;
                    $blocking
                }
                Some(n) => {
                    let $a = buf;
                    watch($spawn, no_source, n);
                    Ok(())
                }
            }
        }};
    }
    let (dtype, regions) = regions(c)?;
    let first = || regions.first().copied().ok_or_else(|| invalid("a call without its buffer"));
    with_dtype!(dtype, T => {
        let raw = |r: Region| Raw::<T>::of(r).map_err(invalid);
        match c.kind {
            ALL_REDUCE => {
                let op = op_of(c)?;
                go!(raw(first()?)?, |b| comm.all_reduce(b.as_mut_slice(), op), |b| comm.all_reduce_async(b, op))
            }
            BROADCAST => {
                let root = peer_of(c)?;
                go!(raw(first()?)?, |b| comm.broadcast(b.as_mut_slice(), root), |b| comm.broadcast_async(b, root))
            }
            REDUCE => {
                let (op, root) = (op_of(c)?, peer_of(c)?);
                go!(raw(first()?)?, |b| comm.reduce(b.as_mut_slice(), op, root), |b| comm.reduce_async(b, op, root))
            }
            ALL_GATHER => go!(raw(first()?)?, |b| comm.all_gather_in_place(b.as_mut_slice()), |b| comm.all_gather_async(b)),
            REDUCE_SCATTER => {
                let op = op_of(c)?;
                go!(raw(first()?)?, |b| comm.reduce_scatter_in_place(b.as_mut_slice(), op), |b| comm
                    .reduce_scatter_async(b, op))
            }
            ALL_TO_ALL_V => {
                if regions.len() != 2 {
                    return Err(invalid("all_to_all_v takes a send and a recv buffer"));
                }
                let (sc, rc) = (counts(c.send_counts, c.ncounts)?, counts(c.recv_counts, c.ncounts)?);
                let bufs = (raw(regions[0])?, raw(regions[1])?);
                go!(bufs, |b| comm.all_to_all_v(b.0.as_slice(), &sc, b.1.as_mut_slice(), &rc), |b| comm
                    .all_to_all_v_async(b.0, &sc, b.1, &rc))
            }
            SEND => {
                let peer = peer_of(c)?;
                go!(raw(first()?)?, |b| comm.send(b.as_slice(), peer, c.tag), |b| comm.send_async(b, peer, c.tag))
            }
            RECV => {
                let peer = peer_of(c)?;
                go!(raw(first()?)?, |b| comm.recv(b.as_mut_slice(), peer, c.tag), |b| comm.recv_async(b, peer, c.tag))
            }
            RECV_ANY => {
                let b = raw(first()?)?;
                let n = done.ok_or_else(|| invalid("a receive from any rank is always asynchronous"))?;
                watch(comm.recv_any_async(b, c.tag), |v: &(Raw<T>, usize)| Some(v.1), n);
                Ok(())
            }
            ALL_REDUCE_COALESCED => {
                let op = op_of(c)?;
                let raws: Vec<Raw<T>> = regions.iter().map(|r| raw(*r)).collect::<Result<_, _>>()?;
                go!(raws, |b| {
                    let mut slices: Vec<&mut [T]> = b.iter_mut().map(|r| r.as_mut_slice()).collect();
                    comm.all_reduce_coalesced(&mut slices, op)
                }, |b| comm.all_reduce_coalesced_async(b, op))
            }
            BARRIER => match done {
                None => comm.barrier(),
                Some(n) => {
                    watch(comm.barrier_async(), no_source, n);
                    Ok(())
                }
            },
            k => Err(invalid(format!("unknown operation code {k}"))),
        }
    })
}

/// The communicator behind a handle from `handle_of`.
///
/// # Safety
/// `comm` must be such a handle, not yet released.
unsafe fn comm_of<'a>(comm: *const c_void) -> &'a Communicator {
    // SAFETY: per the contract, the handle is a live Box<Communicator> from `handle_of`.
    unsafe { &*comm.cast::<Communicator>() }
}

unsafe extern "C" fn release(comm: *const c_void) {
    if !comm.is_null() {
        // SAFETY: a handle from `handle_of`, released once (conflux_c.h): its Box is dropped here.
        drop(unsafe { Box::from_raw(comm.cast_mut().cast::<Communicator>()) });
    }
}

unsafe extern "C" fn call(
    comm: *const c_void,
    c: *const CfxCall,
    done: Done,
    ctx: *mut c_void,
    out: *mut CfxOutcome,
) -> i32 {
    // SAFETY: the C++ backend passes a live handle and a call descriptor alive for this call
    // (see conflux_c.h); `out` points at an outcome it owns.
    let (comm, c) = unsafe { (comm_of(comm), &*c) };
    let notify = done.map(|done| Notify { done, ctx, trace: c.trace, help: c.help });
    let issued_async = notify.is_some();
    let timed;
    let comm = if c.timeout_ms > 0 {
        timed = comm.with_timeout(Some(std::time::Duration::from_millis(c.timeout_ms)));
        &timed
    } else {
        comm
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(comm, c, notify)))
        .unwrap_or_else(|_| Err(Error::InvalidArgument("conflux panicked in this call (a bug)".into())));
    let o = outcome(&r.map(|()| None));
    let code = o.code;
    if !out.is_null() && (code != 0 || !issued_async) {
        // SAFETY: see above.
        unsafe { out.write(o) };
    }
    code
}

/// The tracker behind a handle from `watch`.
///
/// # Safety
/// `t` must be such a handle, not yet released.
unsafe fn tracker_of<'a>(t: *const c_void) -> &'a WaitTracker {
    // SAFETY: per the contract, a live Box<WaitTracker> from `watch`.
    unsafe { &*t.cast::<WaitTracker>() }
}

/// Runs the helper's operation on this thread until `done(ctx)` (`conflux::Helper`).
unsafe extern "C" fn help(h: *const c_void, done: HelpDone, ctx: *mut c_void) {
    if h.is_null() {
        return;
    }
    // SAFETY: a live helper handle from `watch` (conflux_c.h); `done` and `ctx` are the
    // caller's, valid for this call.
    let helper = unsafe { &*h.cast::<conflux::Helper>() };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: see above.
        helper.help_until(|| unsafe { done(ctx) })
    }));
    // A panic here is a bug; the operation's own Work reports how it ended, so waiting on
    // goes on as it would have without the help.
    drop(r);
}

unsafe extern "C" fn help_release(h: *const c_void) {
    if !h.is_null() {
        // SAFETY: a helper handle from `watch`, given back once (conflux_c.h).
        drop(unsafe { Box::from_raw(h.cast_mut().cast::<conflux::Helper>()) });
    }
}

unsafe extern "C" fn trace_waited(t: *const c_void, blocked_ns: u64) {
    if !t.is_null() {
        // SAFETY: a live tracker handle (conflux_c.h).
        unsafe { tracker_of(t) }.waited(std::time::Duration::from_nanos(blocked_ns));
    }
}

unsafe extern "C" fn trace_elsewhere(t: *const c_void) {
    if !t.is_null() {
        // SAFETY: a live tracker handle (conflux_c.h).
        unsafe { tracker_of(t) }.awaited_elsewhere();
    }
}

unsafe extern "C" fn trace_release(t: *const c_void) {
    if !t.is_null() {
        // SAFETY: a tracker handle from `watch`, released once (conflux_c.h).
        drop(unsafe { Box::from_raw(t.cast_mut().cast::<WaitTracker>()) });
    }
}

unsafe extern "C" fn abort(comm: *const c_void) {
    // SAFETY: a live handle (conflux_c.h).
    unsafe { comm_of(comm) }.abort();
}

unsafe extern "C" fn shutdown(comm: *const c_void, out: *mut CfxOutcome) -> i32 {
    // SAFETY: a live handle (conflux_c.h).
    let r = unsafe { comm_of(comm) }.shutdown();
    let o = outcome(&r.map(|()| None));
    let code = o.code;
    if !out.is_null() {
        // SAFETY: an outcome the caller owns.
        unsafe { out.write(o) };
    }
    code
}
