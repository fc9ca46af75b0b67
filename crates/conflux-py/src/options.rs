//! Per-communicator options from Python (`conflux.Options`, torch's `pg_options`) and the link
//! health check's result back to Python.

use std::time::Duration;

use conflux::config::parse_traffic_class;
use conflux::{AlgoSpec, Error, LinkHealth, Options, TransportKind};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::py_err;

fn invalid(msg: String) -> PyErr {
    py_err(Error::InvalidArgument(msg))
}

/// `conflux.Options._native()`'s dict ({"transport", "algorithm", "timeout",
/// "traffic_class"}, each optional) as conflux's `Options`; None for none.
pub fn from_dict(d: Option<&Bound<'_, PyDict>>) -> PyResult<Options> {
    let mut o = Options::default();
    let Some(d) = d else { return Ok(o) };
    for (key, value) in d.iter() {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        match key.as_str() {
            "transport" => {
                let s: String = value.extract()?;
                let t = TransportKind::parse(&s)
                    .ok_or_else(|| invalid(format!("transport must be \"auto\", \"shm\" or \"tcp\", not {s:?}")))?;
                o.transport = Some(t);
            }
            "algorithm" => {
                let s: String = value.extract()?;
                o.algo = Some(AlgoSpec::parse(&s).map_err(|e| invalid(format!("algorithm {s:?}: {e}")))?);
            }
            "timeout" => {
                let secs: f64 = value.extract()?;
                let t = Duration::try_from_secs_f64(secs).ok().filter(|t| !t.is_zero());
                o.timeout = Some(t.ok_or_else(|| invalid(format!("timeout must be positive seconds, not {secs}")))?);
            }
            "traffic_class" => {
                let s = value.str()?.to_string();
                let tc = parse_traffic_class(&s).ok_or_else(|| {
                    invalid(format!("traffic_class must be a DSCP code point (0-63, or ef, af41, cs3, ...), not {s:?}"))
                })?;
                o.traffic_class = Some(tc);
            }
            other => return Err(invalid(format!("unknown option {other:?}"))),
        }
    }
    Ok(o)
}

/// A `LinkHealth` as a dict: "latency_us" and "gbps" (matrices by rank), "kinds" (each pair's
/// "shm"/"tcp", None on the diagonal), "slow" ((a, b, ratio) pairs), "reference" (per kind).
pub fn health_dict<'py>(py: Python<'py>, h: &LinkHealth) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("latency_us", &h.latency_us)?;
    d.set_item("gbps", &h.gbps)?;
    let kinds: Vec<Vec<Option<&str>>> =
        h.kind.iter().map(|row| row.iter().map(|k| k.map(|k| k.name())).collect()).collect();
    d.set_item("kinds", kinds)?;
    d.set_item("slow", &h.slow)?;
    let refs = PyList::empty(py);
    for r in &h.reference {
        let e = PyDict::new(py);
        e.set_item("kind", r.kind.name())?;
        e.set_item("latency_us", r.latency_us)?;
        e.set_item("gbps", r.gbps)?;
        e.set_item("pairs", r.pairs)?;
        refs.append(e)?;
    }
    d.set_item("reference", refs)?;
    Ok(d)
}
