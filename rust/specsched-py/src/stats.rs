//! `AcceptanceStats`: online per-(depth, rank) acceptance counts fed with verify results.

use numpy::{PyArray1, PyArrayDyn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use specsched_core::{stats::AcceptanceStats, topology::sequoia};

use crate::convert::{int_arg, owned, type_name, IntoPyResult};
use crate::ndconv::i64_array;
use crate::tree::{PyTree, PyTreeBatch};
use crate::verify::{PyBatchVerifyResult, PyVerifyResult};

/// Accumulates acceptance per (depth, sibling rank) from verified trees.
#[pyclass(module = "specsched", name = "AcceptanceStats")]
#[derive(Default)]
pub struct PyAcceptanceStats {
    inner: AcceptanceStats,
}

/// `counts` of `stats` (its trials or hits, row-major) as int64 `[depths, ranks]` (counts stay
/// within int64).
fn count_table<'py>(
    py: Python<'py>,
    stats: &AcceptanceStats,
    counts: Vec<u64>,
) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
    let (d, r) = stats.shape();
    owned(py, counts.into_iter().map(|x| x as i64).collect(), &[d, r])
}

/// A count table `i64_array` checked to be 2-D, as its 2-D view.
fn two_d(a: ndarray::ArrayViewD<'_, i64>) -> PyResult<ndarray::ArrayView2<'_, i64>> {
    a.into_dimensionality()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymethods]
impl PyAcceptanceStats {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Records a verified Tree + VerifyResult, or a TreeBatch + BatchVerifyResult.
    fn update(
        &mut self,
        py: Python<'_>,
        tree: &Bound<'_, PyAny>,
        result: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let stats = &mut self.inner;
        if let (Ok(t), Ok(r)) = (tree.cast::<PyTree>(), result.cast::<PyVerifyResult>()) {
            let (t, r) = (&t.get().inner, &r.get().inner);
            // Check before counting: a mismatched pair must not leave partial counts.
            if r.num_nodes != t.num_nodes() {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "result: verified a tree of {} nodes, but tree has {}",
                    r.num_nodes,
                    t.num_nodes()
                )));
            }
            return py
                .detach(|| stats.observe(t.view(), &r.accepted_nodes, &r.tokens, ""))
                .py();
        }
        if let (Ok(b), Ok(r)) = (
            tree.cast::<PyTreeBatch>(),
            result.cast::<PyBatchVerifyResult>(),
        ) {
            let (b, r) = (&b.get().inner, &r.get().inner);
            return py.detach(|| stats.observe_batch(b, r)).py();
        }
        Err(PyTypeError::new_err(format!(
            "tree / result: expected (Tree, VerifyResult) or (TreeBatch, BatchVerifyResult), got ({}, {})",
            type_name(tree),
            type_name(result)
        )))
    }

    /// Adds the counts of another accumulator.
    fn merge(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let other = other.cast::<PyAcceptanceStats>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "other: expected an AcceptanceStats, got {}",
                crate::convert::type_name(other)
            ))
        })?;
        // Copy first, so that `stats.merge(stats)` (which doubles the counts) never holds a
        // shared and a mutable borrow of one object at once; a borrow held by another thread
        // is a RuntimeError, not a panic.
        let o = other.try_borrow()?.inner.clone();
        slf.try_borrow_mut()?.inner.merge(&o).py()
    }

    /// Verified trees recorded.
    #[getter]
    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    /// Mean accepted draft tokens per verified tree (bonus excluded).
    #[getter]
    fn mean_accepted(&self) -> f64 {
        self.inner.mean_accepted()
    }

    /// int64 `[depths, ranks]`: children of a reached node, by child depth - 1 and rank.
    #[getter]
    fn trials<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
        count_table(py, &self.inner, self.inner.trials())
    }

    /// int64 `[depths, ranks]`: accepted children.
    #[getter]
    fn hits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
        count_table(py, &self.inner, self.inner.hits())
    }

    /// float64 `[ranks]`: fitted acceptance per rank, pooled over depths.
    fn accept_probs<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_vec(py, self.inner.accept_probs())
    }

    /// `(low, high)` float64 `[ranks]`: Wilson score intervals at normal quantile `z`.
    #[pyo3(signature = (z=1.96))]
    fn confidence_interval<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::convert::z_arg)] z: f64,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (lo, hi) = self.inner.confidence_interval(z).py()?;
        PyTuple::new(py, [PyArray1::from_vec(py, lo), PyArray1::from_vec(py, hi)])
    }

    /// Sequoia's optimal tree for the fitted vector: `(choices, expected tokens per step)`.
    #[pyo3(signature = (budget, max_depth=None))]
    fn optimal_tree<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::convert::budget_arg)] budget: usize,
        #[pyo3(from_py_with = crate::convert::opt_max_depth_arg)] max_depth: Option<usize>,
    ) -> PyResult<(Bound<'py, PyAny>, f64)> {
        let mut p = self.inner.accept_probs();
        if p.is_empty() {
            // Nothing observed yet: no rank is known to be accepted.
            p.push(0.0);
        }
        let plan = py
            .detach(|| sequoia::optimal_tree(&p, budget, max_depth))
            .py()?;
        let items: Vec<Bound<'py, PyTuple>> = plan
            .choices
            .iter()
            .map(|c| PyTuple::new(py, c))
            .collect::<PyResult<_>>()?;
        Ok((
            pyo3::types::PyList::new(py, items)?.into_any(),
            plan.expected,
        ))
    }

    /// Pickles as its counts (`trials`, `hits`, `steps`, accepted drafts): a worker's
    /// statistics reach the process that merges them, or outlive a restart.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let stats = &slf.try_borrow()?.inner;
        let state = (
            count_table(py, stats, stats.trials())?,
            count_table(py, stats, stats.hits())?,
            stats.steps(),
            stats.accepted(),
        )
            .into_pyobject(py)?;
        PyTuple::new(
            py,
            [
                slf.get_type().into_any(),
                PyTuple::empty(py).into_any(),
                state.into_any(),
            ],
        )
    }

    /// Restores the counts `__reduce__` gave (checked: counts no verified trees produce are a
    /// ValueError naming the first one off, and leave this accumulator as it was).
    fn __setstate__(&mut self, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let parts = state
            .cast::<PyTuple>()
            .ok()
            .filter(|t| t.len() == 4)
            .ok_or_else(|| {
                let got = match state.cast::<PyTuple>() {
                    Ok(t) => format!("a tuple of {}", t.len()),
                    Err(_) => type_name(state),
                };
                PyTypeError::new_err(format!(
                    "state: expected a tuple (trials, hits, steps, accepted), got {got}"
                ))
            })?;
        let trials = i64_array(&parts.get_item(0)?, "trials", 2)?;
        let hits = i64_array(&parts.get_item(1)?, "hits", 2)?;
        let steps = int_arg(&parts.get_item(2)?, "steps")?;
        let accepted = int_arg(&parts.get_item(3)?, "accepted")?;
        let (trials, hits) = (two_d(trials.view())?, two_d(hits.view())?);
        self.inner = AcceptanceStats::from_counts(trials, hits, steps, accepted).py()?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        let (d, r) = self.inner.shape();
        format!(
            "AcceptanceStats(steps={}, mean_accepted={:.3}, depths={d}, ranks={r})",
            self.inner.steps(),
            self.inner.mean_accepted()
        )
    }
}
