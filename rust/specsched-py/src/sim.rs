//! `sim_*` entry points: acceptance models, expected tokens, best-first trees and the
//! Monte-Carlo simulator of specsched-core's `sim` module.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use specsched_core::sim::{self, Acceptance};

use crate::convert::{owned, IntoPyResult};
use crate::tree::PyTree;

/// The core model from its kind and values: `"iid"` `[[alpha]]`, `"per_depth"` and
/// `"per_rank"` one row, `"table"` one row per depth.
fn model(kind: &str, values: Vec<Vec<f64>>) -> PyResult<Acceptance> {
    let one_row = |values: Vec<Vec<f64>>| -> PyResult<Vec<f64>> {
        match <[Vec<f64>; 1]>::try_from(values) {
            Ok([row]) => Ok(row),
            Err(v) => Err(PyValueError::new_err(format!(
                "acceptance: a {kind} model takes one row of values, got {} rows",
                v.len()
            ))),
        }
    };
    let m = match kind {
        "iid" => match one_row(values)?[..] {
            [a] => Acceptance::Iid(a),
            ref v => {
                return Err(PyValueError::new_err(format!(
                    "acceptance: an iid model takes one alpha, got {} values",
                    v.len()
                )))
            }
        },
        "per_depth" => Acceptance::PerDepth(one_row(values)?),
        "per_rank" => Acceptance::PerRank(one_row(values)?),
        "table" => Acceptance::Table(values),
        other => {
            return Err(PyValueError::new_err(format!(
                "acceptance: unknown kind {other:?}, expected 'iid', 'per_depth', 'per_rank' or 'table'"
            )))
        }
    };
    m.validate().py()?;
    Ok(m)
}

/// Expected tokens per target call of a chain of `gamma` drafts (bonus included).
#[pyfunction]
pub fn sim_chain_expected_tokens(alpha: f64, gamma: &Bound<'_, PyAny>) -> PyResult<f64> {
    // Named past int64 (a usize argument raised an OverflowError naming nothing).
    let gamma = crate::convert::int_arg(gamma, "gamma")?;
    let gamma = usize::try_from(gamma)
        .map_err(|_| PyValueError::new_err(format!("gamma: must be >= 0, got {gamma}")))?;
    sim::chain_expected_tokens(alpha, gamma).py()
}

/// Expected tokens per step of `tree` under the model: `1 + Σ P(path to v accepted)`.
#[pyfunction]
pub fn sim_expected_tokens(
    py: Python<'_>,
    tree: &Bound<'_, PyTree>,
    kind: &str,
    values: Vec<Vec<f64>>,
) -> PyResult<f64> {
    let m = model(kind, values)?;
    let t = &tree.get().inner;
    py.detach(|| sim::expected_tokens(t.view(), &m)).py()
}

/// float64 `[N]`: probability that the path to each node is accepted (1 at the root).
#[pyfunction]
pub fn sim_path_probs<'py>(
    py: Python<'py>,
    tree: &Bound<'py, PyTree>,
    kind: &str,
    values: Vec<Vec<f64>>,
) -> PyResult<Bound<'py, PyAny>> {
    let m = model(kind, values)?;
    let t = &tree.get().inner;
    let p = py.detach(|| sim::path_probs(t.view(), &m)).py()?;
    let n = p.len();
    Ok(owned(py, p, &[n])?.into_any())
}

/// The best-first tree of at most `budget` nodes under the model.
#[pyfunction]
pub fn sim_best_tree(
    py: Python<'_>,
    kind: &str,
    values: Vec<Vec<f64>>,
    #[pyo3(from_py_with = crate::convert::budget_arg)] budget: usize,
    #[pyo3(from_py_with = crate::convert::max_depth_arg)] max_depth: usize,
    #[pyo3(from_py_with = crate::convert::max_children_arg)] max_children: usize,
) -> PyResult<PyTree> {
    let m = model(kind, values)?;
    let inner = py
        .detach(|| sim::best_tree(&m, budget, max_depth, max_children))
        .py()?;
    Ok(PyTree { inner })
}

/// Monte-Carlo verification: `(steps, histogram int64 [max_depth + 1])`, `histogram[k]` = steps
/// that accepted `k` draft tokens. Same result for every `threads`.
#[pyfunction]
#[pyo3(signature = (tree, kind, values, steps, seed, threads=None))]
pub fn sim_simulate<'py>(
    py: Python<'py>,
    tree: &Bound<'py, PyTree>,
    kind: &str,
    values: Vec<Vec<f64>>,
    #[pyo3(from_py_with = crate::convert::steps_arg)] steps: u64,
    #[pyo3(from_py_with = crate::convert::seed_arg)] seed: u64,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyTuple>> {
    let m = model(kind, values)?;
    let t = &tree.get().inner;
    let stats = py
        .detach(|| sim::simulate(t.view(), &m, steps, seed, threads))
        .py()?;
    let hist: Vec<i64> = stats.histogram.iter().map(|&c| c as i64).collect();
    let n = hist.len();
    PyTuple::new(
        py,
        [
            stats.steps.into_pyobject(py)?.into_any(),
            owned(py, hist, &[n])?.into_any(),
        ],
    )
}
