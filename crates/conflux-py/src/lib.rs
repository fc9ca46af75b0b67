//! `conflux._native`: the Rust side of the Python package. The public API is the Python
//! package `conflux` (crates/conflux-py/python), which wraps this module.

mod callback;
mod comm;
mod errors;
mod raw;
mod work;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::Comm>()?;
    m.add_class::<work::Work>()?;
    m.add("kernel", conflux::reduce::kernel_name())?;
    Ok(())
}
