//! `conflux._native`: the Rust side of the Python package. The public API is the Python
//! package `conflux` (crates/conflux-py/python), which wraps this module.

mod callback;
mod comm;
mod errors;
mod raw;
mod work;

use pyo3::prelude::*;

/// Marks the start of the next step on every rank this process traces; how many it marked.
#[pyfunction]
fn mark_step() -> usize {
    conflux::trace::mark_step_everywhere()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::Comm>()?;
    m.add_class::<work::Work>()?;
    m.add_function(wrap_pyfunction!(mark_step, m)?)?;
    m.add("kernel", conflux::reduce::kernel_name())?;
    Ok(())
}
