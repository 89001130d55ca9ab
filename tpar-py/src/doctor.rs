//! `tpar._tpar.doctor`: `tpar doctor`'s report for `python -m tpar.doctor` (the library's
//! `tpar::doctor`). The engine rules are the library's (`tpar::doctor::rules`); this Python
//! only reports the facts they read (`python/tpar/doctor.py`).

use crate::py_err;
use pyo3::prelude::*;
use tpar::doctor::rules;

/// `tpar doctor`'s report (text, or JSON with `json`), as `python -m tpar.doctor` prints it:
/// `inspect(query) -> str` is called once with the engine rules' query (JSON) and answers
/// this Python's facts (doctor.py's `facts`, JSON), which the rules judge for `engine`.
#[pyfunction]
#[pyo3(signature = (inspect, topology=None, tp=None, hidden=None, json=false, engine="all"))]
pub fn doctor(inspect: &Bound<'_, PyAny>, topology: Option<String>, tp: Option<usize>, hidden: Option<usize>, json: bool, engine: &str) -> PyResult<String> {
    rules::check_engine(engine).map_err(py_err)?;
    let defaults = tpar::doctor::Options::default();
    let opts = tpar::doctor::Options { topology, tp, hidden: hidden.unwrap_or(defaults.hidden), probe: false };
    let mut report = tpar::doctor::Report::gather(&opts).map_err(py_err)?;
    let ctx = report.engine_context();
    let answer: String = inspect.call1((rules::query_json(),))?.extract()?;
    report.finish(Some(rules::judge_answer("this Python", &answer, engine, &ctx)));
    Ok(if json { report.json() } else { report.text() })
}

/// The engine rules' query (JSON): what doctor.py's `facts` must report.
#[pyfunction]
pub fn doctor_query() -> String {
    rules::query_json()
}

/// The engine part of the report (JSON) for `facts` (doctor.py's answer to
/// [`doctor_query`], JSON), judged for `engine` at `tp` ranks on GPUs of `archs`.
#[pyfunction]
#[pyo3(signature = (facts, engine="all", tp=0, archs=Vec::new()))]
pub fn doctor_engine(facts: &str, engine: &str, tp: usize, archs: Vec<String>) -> PyResult<String> {
    rules::judge_json(facts, engine, tp, &archs).map_err(py_err)
}
