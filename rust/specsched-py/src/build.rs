//! Tree builders: the top-N selection, Sequoia's optimal trees and hardware-aware choice,
//! and the batched EAGLE-2 `DynamicTreeBuilder`. Each entry point extracts its arrays,
//! releases the GIL and calls one core function.

use ndarray::ArrayView1;
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use specsched_core::topology::dynamic::{DynamicTreeBuilder, NodeOrder, Step};
use specsched_core::topology::{self, sequoia};

use crate::buffers::{Layout, Parts, PyDraftBuffers};
use crate::convert::{bool_vec, owned, type_name, IntoPyResult, PerRequest};
use crate::ndconv::{f64_vec, fixed, float_array, i64_array, with_float_view};
use crate::tree::{PyTree, PyTreeBatch};

/// The best `budget - 1` candidates of a pool as a Tree, with their pool indices (int64).
#[pyfunction]
#[pyo3(signature = (parents, scores, budget, tokens=None, root_token=0, cumulative=true))]
pub fn top_n_tree<'py>(
    py: Python<'py>,
    parents: &Bound<'py, PyAny>,
    scores: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::convert::budget_arg)] budget: usize,
    tokens: Option<&Bound<'py, PyAny>>,
    #[pyo3(from_py_with = crate::convert::root_token_arg)] root_token: i64,
    #[pyo3(from_py_with = crate::convert::cumulative_arg)] cumulative: bool,
) -> PyResult<(PyTree, Bound<'py, PyArray1<i64>>)> {
    let p = i64_array(parents, "parents", 1)?;
    let s = float_array(scores, "scores", 1)?;
    let pv = fixed(p.view(), "parents")?;
    // Without tokens, each node carries its pool index.
    let t = tokens.map(|t| i64_array(t, "tokens", 1)).transpose()?;
    let tv = t
        .as_ref()
        .map(|t| fixed::<_, ndarray::Ix1>(t.view(), "tokens"))
        .transpose()?;
    let (tree, idx) = with_float_view!(s, sv => {
        let sv = fixed(sv, "scores")?;
        py.detach(|| topology::top_n(pv, sv, tv, root_token, budget, cumulative))
    })
    .py()?;
    let n = idx.len();
    let idx = owned(py, idx, &[n])?.cast_into::<PyArray1<i64>>()?;
    Ok((PyTree { inner: tree }, idx))
}

fn choices_list<'py>(py: Python<'py>, choices: &[Vec<i64>]) -> PyResult<Bound<'py, PyAny>> {
    let items: Vec<Bound<'py, PyTuple>> = choices
        .iter()
        .map(|c| PyTuple::new(py, c))
        .collect::<PyResult<_>>()?;
    Ok(pyo3::types::PyList::new(py, items)?.into_any())
}

/// `method` of `optimal_tree`.
#[derive(Clone, Copy)]
pub enum SequoiaMethod {
    Auto,
    Dp,
    Heap,
}

/// "auto", "dp" or "heap"; any other object, a non-string included, is an error naming
/// `method`.
fn sequoia_method(obj: &Bound<'_, PyAny>) -> PyResult<SequoiaMethod> {
    Ok(
        match crate::convert::str_choice(obj, "method", &["auto", "dp", "heap"])? {
            0 => SequoiaMethod::Auto,
            1 => SequoiaMethod::Dp,
            _ => SequoiaMethod::Heap,
        },
    )
}

/// Sequoia's optimal tree: `(choices, expected tokens per step)`.
#[pyfunction]
#[pyo3(
    signature = (accept_probs, budget, max_depth=None, method=SequoiaMethod::Auto),
    text_signature = "(accept_probs, budget, max_depth=None, method='auto')"
)]
pub fn optimal_tree<'py>(
    py: Python<'py>,
    accept_probs: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::convert::budget_arg)] budget: usize,
    #[pyo3(from_py_with = crate::convert::opt_max_depth_arg)] max_depth: Option<usize>,
    #[pyo3(from_py_with = sequoia_method)] method: SequoiaMethod,
) -> PyResult<(Bound<'py, PyAny>, f64)> {
    let p = f64_vec(accept_probs, "accept_probs")?;
    let plan = match method {
        SequoiaMethod::Auto => py.detach(|| sequoia::optimal_tree(&p, budget, max_depth)),
        SequoiaMethod::Dp => py.detach(|| sequoia::optimal_tree_dp(&p, budget, max_depth)),
        SequoiaMethod::Heap => py.detach(|| sequoia::optimal_tree_heap(&p, budget, max_depth)),
    }
    .py()?;
    Ok((choices_list(py, &plan.choices)?, plan.expected))
}

/// `1 + Σ_{v≠root} Π accept_probs[rank]` over `tree`.
#[pyfunction]
pub fn expected_accept_length(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    accept_probs: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let tree = tree.cast::<PyTree>().map_err(|_| {
        PyTypeError::new_err(format!("tree: expected a Tree, got {}", type_name(tree)))
    })?;
    let p = f64_vec(accept_probs, "accept_probs")?;
    let t = &tree.get().inner;
    py.detach(|| sequoia::expected_accept_length(t.view(), &p))
        .py()
}

/// `(choices, budget, depth, expected, time_per_token)` minimizing the time per token.
#[pyfunction]
pub fn choose_tree<'py>(
    py: Python<'py>,
    accept_probs: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::convert::t_draft_arg)] t_draft: f64,
    t_verify: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::convert::max_depth_arg)] max_depth: usize,
) -> PyResult<(Bound<'py, PyAny>, usize, usize, f64, f64)> {
    let p = f64_vec(accept_probs, "accept_probs")?;
    let d = t_verify.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "t_verify: expected a dict {{budget: seconds}}, got {}",
            type_name(t_verify)
        ))
    })?;
    let mut costs = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        // A bool is not a budget (PyO3 would read True as 1), and an int past int64 is one
        // out of range (ValueError), not one of the wrong type.
        let n = crate::convert::int_arg(&k, "t_verify key").map_err(|e| {
            if e.is_instance_of::<PyValueError>(py) {
                PyValueError::new_err(format!("t_verify: key {k} does not fit in int64"))
            } else {
                PyTypeError::new_err(format!("t_verify: key {k} is not an int budget"))
            }
        })?;
        let t: f64 = v
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("t_verify[{k}]: {v} is not a number")))?;
        let n = usize::try_from(n)
            .map_err(|_| PyValueError::new_err(format!("t_verify: key {n} must be >= 1")))?;
        costs.push((n, t));
    }
    let c = py
        .detach(|| sequoia::choose_tree(&p, t_draft, &costs, max_depth))
        .py()?;
    Ok((
        choices_list(py, &c.plan.choices)?,
        c.budget,
        c.depth,
        c.plan.expected,
        c.time_per_token,
    ))
}

/// Batched EAGLE-2/3 drafting state: `start`, `expand` per draft step, then `build`.
#[pyclass(module = "specsched", name = "DynamicTreeBuilder")]
pub struct PyDynamicTreeBuilder {
    inner: DynamicTreeBuilder,
    /// Made on the first read of `buffers`.
    buffers: Option<Py<PyDraftBuffers>>,
    /// `buffers.active` as bools, for `start_in_place` (no allocation per call).
    active: Vec<bool>,
}

type StepArrays<'py> = (
    Bound<'py, PyArrayDyn<i64>>,
    Bound<'py, PyArrayDyn<i64>>,
    Bound<'py, PyArrayDyn<bool>>,
    Bound<'py, PyArrayDyn<i64>>,
);

/// `prefix_lens` of `start`: None (0), or what every `prefix_lens` takes (one int for every
/// request, or an int32 / int64 array of `b`: the layouts' rules).
fn prefix_arg(prefix_lens: Option<&Bound<'_, PyAny>>, b: usize) -> PyResult<Vec<i64>> {
    let Some(p) = prefix_lens else {
        return Ok(vec![0; b]);
    };
    PerRequest::extract(p, "prefix_lens")?.into_vec(b)
}

fn step_arrays(py: Python<'_>, b: usize, k: usize, s: Step) -> PyResult<StepArrays<'_>> {
    Ok((
        owned(py, s.tokens, &[b, k])?,
        owned(py, s.parent_index, &[b, k])?,
        owned(py, s.mask, &[b, k, s.width])?,
        owned(py, s.positions, &[b, k])?,
    ))
}

impl PyDynamicTreeBuilder {
    /// Runs `step` on the builder state and its buffers' parts: one borrow of the block, the
    /// GIL released. The buffers must have been read first (the caller writes the inputs
    /// into them).
    fn step_in_place<T: Send>(
        &mut self,
        py: Python<'_>,
        call: &str,
        step: impl for<'a> FnOnce(&mut DynamicTreeBuilder, Parts<'a>) -> specsched_core::Result<T>
            + Send,
    ) -> PyResult<T> {
        let bufs = self.buffers.as_ref().ok_or_else(|| {
            PyValueError::new_err(format!(
                "{call}: works on the builder's `buffers`: get them first (and write the \
                 roots, prefix lengths and the draft's top-k into them)"
            ))
        })?;
        let bufs = bufs.get();
        let mut block = bufs.block.bind(py).try_readwrite().map_err(in_use)?;
        let parts = bufs.layout.split(block.as_slice_mut()?)?;
        let inner = &mut self.inner;
        py.detach(|| step(inner, parts)).py()
    }
}

/// `order` of `build`: "pool" or "depth_first" (any other object, a non-string included, is
/// an error naming `order`).
fn node_order(order: &Bound<'_, PyAny>) -> PyResult<NodeOrder> {
    match crate::convert::str_choice(order, "order", &["pool", "depth_first"])? {
        0 => Ok(NodeOrder::Pool),
        _ => Ok(NodeOrder::DepthFirst),
    }
}

/// Why the buffers' block cannot be written: another call holds one of its views (a
/// specsched call in another thread), or the user made the block read-only.
fn in_use(e: numpy::BorrowError) -> PyErr {
    match e {
        numpy::BorrowError::NotWriteable => {
            PyValueError::new_err("buffers: the block under the views was made read-only")
        }
        _ => PyValueError::new_err(format!("buffers: in use by another call: {e}")),
    }
}

#[pymethods]
impl PyDynamicTreeBuilder {
    #[new]
    fn new(
        #[pyo3(from_py_with = crate::convert::batch_i64_arg)] batch: i64,
        #[pyo3(from_py_with = crate::convert::topk_i64_arg)] topk: i64,
        #[pyo3(from_py_with = crate::convert::depth_i64_arg)] depth: i64,
        #[pyo3(from_py_with = crate::convert::budget_i64_arg)] budget: i64,
    ) -> PyResult<Self> {
        let nonneg = |x: i64, arg: &str| {
            usize::try_from(x)
                .map_err(|_| PyValueError::new_err(format!("{arg}: must be >= 1, got {x}")))
        };
        let batch = nonneg(batch, "batch")?;
        Ok(PyDynamicTreeBuilder {
            inner: DynamicTreeBuilder::new(
                batch,
                nonneg(topk, "topk")?,
                nonneg(depth, "depth")?,
                nonneg(budget, "budget")?,
            )
            .py()?,
            buffers: None,
            active: Vec::with_capacity(batch),
        })
    }

    #[getter]
    fn batch(&self) -> usize {
        self.inner.batch()
    }
    #[getter]
    fn topk(&self) -> usize {
        self.inner.topk()
    }
    #[getter]
    fn depth(&self) -> usize {
        self.inner.depth()
    }
    #[getter]
    fn budget(&self) -> usize {
        self.inner.budget()
    }
    /// Levels drafted so far (0 before `start`).
    #[getter]
    fn level(&self) -> usize {
        self.inner.level()
    }
    /// True when no further level can change what `build` returns (every request's best
    /// current frontier node scores no better than the `budget - 1`-th best of its frontier
    /// nodes so far): a decode loop can stop drafting. False before `start`.
    #[getter]
    fn settled(&self) -> bool {
        self.inner.settled()
    }

    /// Starts a tree per request; returns `(tokens, parent_index, attention_mask, positions)`.
    /// `active` (bool `[B]`, None = all): the requests still running; the others build to
    /// their root alone.
    #[pyo3(signature = (root_tokens, topk_tokens, topk_logprobs, prefix_lens=None, active=None))]
    fn start<'py>(
        &mut self,
        py: Python<'py>,
        root_tokens: &Bound<'py, PyAny>,
        topk_tokens: &Bound<'py, PyAny>,
        topk_logprobs: &Bound<'py, PyAny>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
        active: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<StepArrays<'py>> {
        let (b, k) = (self.inner.batch(), self.inner.topk());
        let r = i64_array(root_tokens, "root_tokens", 1)?;
        let t = i64_array(topk_tokens, "topk_tokens", 2)?;
        let lp = float_array(topk_logprobs, "topk_logprobs", 2)?;
        let prefix = prefix_arg(prefix_lens, b)?;
        let active = active.map(|a| bool_vec(a, "active")).transpose()?;
        let (rv, tv) = (
            fixed(r.view(), "root_tokens")?,
            fixed(t.view(), "topk_tokens")?,
        );
        let inner = &mut self.inner;
        let step = with_float_view!(lp, lv => {
            let lv = fixed(lv, "topk_logprobs")?;
            py.detach(|| inner.start(rv, tv, lv, &prefix, active.as_deref()))
        })
        .py()?;
        step_arrays(py, b, k, step)
    }

    /// One draft step from `[B, K, K]` top-k tokens and log probabilities of the frontier.
    fn expand<'py>(
        &mut self,
        py: Python<'py>,
        topk_tokens: &Bound<'py, PyAny>,
        topk_logprobs: &Bound<'py, PyAny>,
    ) -> PyResult<StepArrays<'py>> {
        let (b, k) = (self.inner.batch(), self.inner.topk());
        let t = i64_array(topk_tokens, "topk_tokens", 3)?;
        let lp = float_array(topk_logprobs, "topk_logprobs", 3)?;
        let tv = fixed(t.view(), "topk_tokens")?;
        let inner = &mut self.inner;
        let step = with_float_view!(lp, lv => {
            let lv = fixed(lv, "topk_logprobs")?;
            py.detach(|| inner.expand(tv, lv))
        })
        .py()?;
        step_arrays(py, b, k, step)
    }

    /// This builder's persistent buffers (made on first use): write the draft's top-k into
    /// them, then `start_in_place` / `expand_in_place` write each step into them.
    #[getter]
    fn buffers(&mut self, py: Python<'_>) -> PyResult<Py<PyDraftBuffers>> {
        if let Some(b) = &self.buffers {
            return Ok(b.clone_ref(py));
        }
        let i = &self.inner;
        let layout = Layout::new(i.batch(), i.topk(), i.depth(), i.budget());
        let b = Py::new(py, PyDraftBuffers::new(py, layout)?)?;
        self.buffers = Some(b.clone_ref(py));
        Ok(b)
    }

    /// `start` reading the roots, prefix lengths and the root's top-k from `buffers`
    /// (`root_tokens`, `prefix_lens`, `topk_tokens[:, 0]`, `topk_logprobs[:, 0]`) and writing
    /// the step into `buffers`; returns `settled` (no extra call for a loop that stops on it).
    fn start_in_place(&mut self, py: Python<'_>) -> PyResult<bool> {
        let mut active = std::mem::take(&mut self.active);
        let settled = self.step_in_place(py, "start_in_place", |inner, p| {
            active.clear();
            active.extend(p.active.iter().map(|&a| a != 0));
            let (tt, lp) = p.root_topk()?;
            let roots = ArrayView1::from(p.root_tokens);
            // The root's top-k is slot 0 of the `[B, K, K]` buffers: named `[r, 0, c]`.
            let at = |r: usize, c: usize| format!("[{r}, 0, {c}]");
            inner.start_into_named(roots, tt, lp, p.prefix_lens, Some(&active), p.out, at)?;
            Ok(inner.settled())
        });
        self.active = active;
        settled
    }

    /// `expand` reading `[B, K, K]` from `buffers.topk_tokens` / `buffers.topk_logprobs` and
    /// writing the step into `buffers`; returns `settled`.
    fn expand_in_place(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.step_in_place(py, "expand_in_place", |inner, p| {
            inner.expand_flat(p.topk_tokens, p.topk_logprobs, p.out)?;
            Ok(inner.settled())
        })
    }

    /// `(TreeBatch, pool_index int64 [B, budget - 1])` from every candidate drafted so far,
    /// each tree's nodes in `order`: "pool" (increasing pool index) or "depth_first".
    #[pyo3(signature = (order=NodeOrder::Pool), text_signature = "($self, order='pool')")]
    fn build<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = node_order)] order: NodeOrder,
    ) -> PyResult<(PyTreeBatch, Bound<'py, PyArrayDyn<i64>>)> {
        let inner = &self.inner;
        let (batch, idx) = py.detach(|| inner.build_in(order)).py()?;
        let shape = [inner.batch(), inner.budget() - 1];
        Ok((PyTreeBatch { inner: batch }, owned(py, idx, &shape)?))
    }

    /// `build` writing the pool indices into `buffers.pool_index` instead of a new array:
    /// returns the TreeBatch alone (right after a draft forward a new numpy array costs more
    /// than the rest of the call's work on a small tree).
    #[pyo3(signature = (order=NodeOrder::Pool), text_signature = "($self, order='pool')")]
    fn build_in_place(
        &mut self,
        py: Python<'_>,
        #[pyo3(from_py_with = node_order)] order: NodeOrder,
    ) -> PyResult<PyTreeBatch> {
        let batch = self.step_in_place(py, "build_in_place", |inner, p| {
            inner.build_into(order, p.pool_index)
        })?;
        Ok(PyTreeBatch { inner: batch })
    }

    fn __repr__(&self) -> String {
        format!(
            "DynamicTreeBuilder(batch={}, topk={}, depth={}, budget={}, level={})",
            self.inner.batch(),
            self.inner.topk(),
            self.inner.depth(),
            self.inner.budget(),
            self.inner.level()
        )
    }
}
