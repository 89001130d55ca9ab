//! `tpar._tpar.doctor`: `tpar doctor`'s report for `python -m tpar.doctor` (the library's
//! `tpar::doctor`; the engine part is `python/tpar/doctor.py`, run in this Python).

use crate::py_err;
use pyo3::prelude::*;

/// `tpar doctor`'s report (text, or JSON with `json`), as `python -m tpar.doctor` prints it:
/// `inspect(tp, archs) -> str` is called once for the engine part (doctor.py's JSON).
#[pyfunction]
#[pyo3(signature = (inspect, topology=None, tp=None, hidden=None, json=false))]
pub fn doctor(inspect: &Bound<'_, PyAny>, topology: Option<String>, tp: Option<usize>, hidden: Option<usize>, json: bool) -> PyResult<String> {
    let defaults = tpar::doctor::Options::default();
    let opts = tpar::doctor::Options { topology, tp, hidden: hidden.unwrap_or(defaults.hidden), probe: false };
    let mut report = tpar::doctor::Report::gather(&opts).map_err(py_err)?;
    let ctx = report.engine_context();
    let answer: String = inspect.call1((ctx.tp, ctx.archs))?.extract()?;
    report.finish(Some(tpar::doctor::EngineSection::from_json("this Python", &answer)));
    Ok(if json { report.json() } else { report.text() })
}

