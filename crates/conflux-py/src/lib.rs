//! `conflux._native`: the Rust side of the Python package. The public API is the Python
//! package `conflux` (crates/conflux-py/python), which wraps this module.

mod callback;
mod capi;
mod comm;
mod errors;
mod options;
mod raw;
mod work;

use pyo3::prelude::*;

/// Marks the start of the next step on every rank this process traces; how many it marked.
#[pyfunction]
fn mark_step() -> usize {
    conflux::trace::mark_step_everywhere()
}

/// Every asynchronous operation issued so far has been waited for, where conflux could not
/// see the wait (torch's DDP waits for its buckets in C++): the trace records the estimate.
#[pyfunction]
fn sync_point() {
    conflux::trace::sync_point_everywhere()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::Comm>()?;
    m.add_class::<work::Work>()?;
    m.add_function(wrap_pyfunction!(mark_step, m)?)?;
    m.add_function(wrap_pyfunction!(sync_point, m)?)?;
    m.add_function(wrap_pyfunction!(capi::c_api, m)?)?;
    m.add("kernel", conflux::reduce::kernel_name())?;
    Ok(())
}
