//! `verify_*` entry points and the result classes. Results keep the core's vectors and expose
//! them as read-only numpy views (no copy).

use half::{bf16, f16};
use ndarray::{ArrayView1, ArrayView2};
use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use specsched_core::select::{LogitsView, ProbsView, SamplingParams};
use specsched_core::verify::{self, BatchVerified, Rule, Sampled, Seeds, Verified};
use specsched_core::IndexLike;
use specsched_core::{Tree, TreeBatch};

use crate::convert::{
    as_ndarray, bool_vec, check_ndim, int_arg, int_array1, owned, readonly_view, type_name,
    with_int_view, IntoPyResult,
};
use crate::ndconv::i64_array;
use crate::tree::{PyTree, PyTreeBatch};

/// Accepted path of one tree: `accepted_nodes` (root first) and the emitted `tokens`.
#[pyclass(frozen, module = "specsched", name = "VerifyResult")]
pub struct PyVerifyResult {
    pub inner: Verified,
}

#[pymethods]
impl PyVerifyResult {
    /// int32 `[k+1]`: 0, a1, ..., ak.
    #[getter]
    fn accepted_nodes<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i32>> {
        readonly_view(
            slf.as_any(),
            ArrayView1::from(&slf.get().inner.accepted_nodes),
        )
    }

    /// int64 `[k+1]`: accepted draft tokens, then the bonus token.
    #[getter]
    fn tokens<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i64>> {
        readonly_view(slf.as_any(), ArrayView1::from(&slf.get().inner.tokens))
    }

    #[getter]
    fn num_accepted(&self) -> usize {
        self.inner.num_accepted()
    }

    #[getter]
    fn bonus_token(&self) -> i64 {
        *self.inner.tokens.last().unwrap_or(&-1)
    }

    /// Node count of the verified tree.
    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes
    }

    /// Pickles as its parts, which `_from_parts` checks: a result sent to another process
    /// (a scheduler, a logger) or stored.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let parts = (
            Self::accepted_nodes(slf),
            Self::tokens(slf),
            slf.get().inner.num_nodes,
        );
        by_parts(slf.as_any(), parts.into_pyobject(slf.py())?.into_any())
    }

    /// The result of these parts (unpickling): a path a walk of a `num_nodes`-node tree can
    /// take, one token per node; anything else is a ValueError naming the part.
    #[classmethod]
    fn _from_parts(
        _cls: &Bound<'_, PyType>,
        accepted_nodes: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        num_nodes: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let nodes = i64_array(accepted_nodes, "accepted_nodes", 1)?;
        let toks = i64_array(tokens, "tokens", 1)?;
        let num_nodes = int_arg(num_nodes, "num_nodes")?;
        let inner =
            Verified::from_parts(dims(nodes.view())?, dims(toks.view())?, num_nodes).py()?;
        Ok(PyVerifyResult { inner })
    }

    fn __repr__(&self) -> String {
        format!(
            "VerifyResult(num_accepted={}, accepted_nodes={:?}, tokens={:?})",
            self.inner.num_accepted(),
            self.inner.accepted_nodes,
            self.inner.tokens
        )
    }
}

/// Accepted paths of a batch, `[B, D+1]` arrays padded with -1 (accepted nodes tree-local).
#[pyclass(frozen, module = "specsched", name = "BatchVerifyResult")]
pub struct PyBatchVerifyResult {
    pub inner: BatchVerified,
}

impl PyBatchVerifyResult {
    fn rows<'a, T>(&self, data: &'a [T]) -> ArrayView2<'a, T> {
        // The shape always matches: the core allocates B * width entries.
        ArrayView2::from_shape((self.inner.num_trees(), self.inner.width), data)
            .expect("BatchVerified rows are B x width")
    }
}

#[pymethods]
impl PyBatchVerifyResult {
    #[getter]
    fn num_accepted<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i32>> {
        readonly_view(
            slf.as_any(),
            ArrayView1::from(&slf.get().inner.num_accepted),
        )
    }

    #[getter]
    fn accepted_nodes<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray2<i32>> {
        let me = slf.get();
        readonly_view(slf.as_any(), me.rows(&me.inner.accepted_nodes))
    }

    #[getter]
    fn tokens<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray2<i64>> {
        let me = slf.get();
        readonly_view(slf.as_any(), me.rows(&me.inner.tokens))
    }

    /// int64 `[B+1]` offsets of the verified batch (a new array, read-only as the result's
    /// other arrays are).
    #[getter]
    fn offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let a = PyArray1::from_iter(py, self.inner.offsets.iter().map(|&o| o as i64));
        crate::convert::set_readonly(a.as_untyped());
        a
    }

    fn __len__(&self) -> usize {
        self.inner.num_trees()
    }

    fn __getitem__(
        &self,
        #[pyo3(from_py_with = crate::convert::index_arg)] index: isize,
    ) -> PyResult<PyVerifyResult> {
        let b = self.inner.num_trees() as isize;
        let i = if index < 0 { index + b } else { index };
        if i < 0 || i >= b {
            return Err(PyIndexError::new_err(format!(
                "index: {index} is out of range for a batch of {b} results"
            )));
        }
        Ok(PyVerifyResult {
            inner: self.inner.get(i as usize),
        })
    }

    /// The result as if each row had stopped after its first `keep[b]` tokens (a path cut at
    /// EOS): `keep[b]` in `1..=num_accepted[b] + 1`; the last kept token is the row's bonus.
    fn truncate(&self, py: Python<'_>, keep: &Bound<'_, PyAny>) -> PyResult<PyBatchVerifyResult> {
        let keep = crate::convert::int_array1(keep, "keep", false)?;
        let keep: Vec<i64> = crate::convert::with_int_view!(keep, v => {
            crate::convert::check_batch_len(v.len(), "keep")?;
            v.iter().map(|&x| x.to_i64()).collect()
        });
        let inner = &self.inner;
        Ok(PyBatchVerifyResult {
            inner: py.detach(|| inner.truncate(&keep)).py()?,
        })
    }

    /// SGLang `verify_tree_greedy` outputs: `(predicts int32 [T], accept_index int32 [B, D+1],
    /// accept_length int32 [B])`.
    fn to_sglang<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let inner = &self.inner;
        let (pred, idx, len) = py.detach(|| verify::sglang_outputs(inner)).py()?;
        let t = pred.len();
        let shape = [self.inner.num_trees(), self.inner.width];
        PyTuple::new(
            py,
            [
                owned(py, pred, &[t])?,
                owned(py, idx, &shape)?,
                owned(py, len, &[self.inner.num_trees()])?,
            ],
        )
    }

    /// Pickles as its parts (`num_accepted`, `accepted_nodes`, `tokens`, `offsets`), which
    /// `_from_parts` checks.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let parts = (
            Self::num_accepted(slf),
            Self::accepted_nodes(slf),
            Self::tokens(slf),
            slf.get().offsets(py),
        );
        by_parts(slf.as_any(), parts.into_pyobject(py)?.into_any())
    }

    /// The batch result of these parts (unpickling): row `b` a path of tree `b` of the
    /// `offsets` (`num_accepted[b] + 1` nodes and tokens), then -1 padding; anything else is a
    /// ValueError naming the part and row.
    #[classmethod]
    fn _from_parts(
        _cls: &Bound<'_, PyType>,
        num_accepted: &Bound<'_, PyAny>,
        accepted_nodes: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let k = i64_array(num_accepted, "num_accepted", 1)?;
        let nodes = i64_array(accepted_nodes, "accepted_nodes", 2)?;
        let toks = i64_array(tokens, "tokens", 2)?;
        let offsets = i64_array(offsets, "offsets", 1)?;
        let inner = BatchVerified::from_parts(
            dims(k.view())?,
            dims(nodes.view())?,
            dims(toks.view())?,
            dims(offsets.view())?,
        )
        .py()?;
        Ok(PyBatchVerifyResult { inner })
    }

    fn __repr__(&self) -> String {
        format!(
            "BatchVerifyResult(num_trees={}, num_accepted={:?})",
            self.inner.num_trees(),
            self.inner.num_accepted
        )
    }
}

/// `__reduce__`'s answer for a result pickled as its parts: rebuilt by its class's
/// `_from_parts`, which checks them.
fn by_parts<'py>(
    result: &Bound<'py, PyAny>,
    parts: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let from_parts = result.get_type().getattr("_from_parts")?;
    PyTuple::new(result.py(), [from_parts, parts])
}

/// A view of the dimensionality `i64_array` already checked.
fn dims<D: ndarray::Dimension>(
    a: ndarray::ArrayViewD<'_, i64>,
) -> PyResult<ndarray::ArrayView<'_, i64, D>> {
    a.into_dimensionality()
        .map_err(|e| PyValueError::new_err(format!("internal: {e}")))
}

/// A Tree or a TreeBatch argument.
pub enum AnyTree<'py> {
    One(Bound<'py, PyTree>),
    Batch(Bound<'py, PyTreeBatch>),
}

impl<'py> AnyTree<'py> {
    pub fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(t) = obj.cast::<PyTree>() {
            return Ok(AnyTree::One(t.clone()));
        }
        if let Ok(b) = obj.cast::<PyTreeBatch>() {
            return Ok(AnyTree::Batch(b.clone()));
        }
        Err(PyTypeError::new_err(format!(
            "tree: expected a Tree or a TreeBatch, got {}",
            type_name(obj)
        )))
    }

    fn num_nodes(&self) -> usize {
        match self {
            AnyTree::One(t) => t.get().inner.num_nodes(),
            AnyTree::Batch(b) => b.get().inner.num_nodes(),
        }
    }
}

/// Verifies with a per-node choice `choose(global node)`, single tree or batch.
fn run<'py, F>(
    py: Python<'py>,
    tree: &AnyTree<'py>,
    choose: F,
    row_cost: usize,
) -> PyResult<Py<PyAny>>
where
    F: Fn(usize) -> specsched_core::Result<i64> + Sync + Send,
{
    match tree {
        AnyTree::One(t) => {
            let tree: &Tree = &t.get().inner;
            let inner = py
                .detach(|| verify::verify_tree(tree.view(), &choose))
                .py()?;
            Ok(Py::new(py, PyVerifyResult { inner })?.into_any())
        }
        AnyTree::Batch(b) => {
            let batch: &TreeBatch = &b.get().inner;
            let inner = py
                .detach(|| verify::verify_batch(batch, &choose, row_cost))
                .py()?;
            Ok(Py::new(py, PyBatchVerifyResult { inner })?.into_any())
        }
    }
}

/// The walk alone, given the target's choice per node (`[N]` or `[T]`); `nan_rows` /
/// `no_finite_rows` (bool) mark nodes whose target output held a NaN / no finite logit, an
/// error if the walk reaches one.
#[pyfunction]
#[pyo3(signature = (tree, target_tokens, nan_rows=None, no_finite_rows=None))]
pub fn verify_target_tokens(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    target_tokens: &Bound<'_, PyAny>,
    nan_rows: Option<&Bound<'_, PyAny>>,
    no_finite_rows: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let tree = AnyTree::extract(tree)?;
    let arr = int_array1(target_tokens, "target_tokens", true)?;
    let nan = nan_rows.map(|o| bool_vec(o, "nan_rows")).transpose()?;
    let no_finite = no_finite_rows
        .map(|o| bool_vec(o, "no_finite_rows"))
        .transpose()?;
    let (nan_view, no_finite_view) = (
        nan.as_deref().map(ArrayView1::from),
        no_finite.as_deref().map(ArrayView1::from),
    );
    with_int_view!(arr, v => {
        let choose =
            verify::choice_from_tokens(v, nan_view, no_finite_view, tree.num_nodes()).py()?;
        run(py, &tree, choose, 1)
    })
}

/// Read-only 2-D logits in one of the supported float formats.
enum Logits<'py> {
    F32(PyReadonlyArray2<'py, f32>),
    F64(PyReadonlyArray2<'py, f64>),
    F16(PyReadonlyArray2<'py, f16>),
    /// bfloat16 given as its 16-bit patterns (torch's `view(torch.int16)`).
    BF16Bits(PyReadonlyArray2<'py, i16>),
}

impl Logits<'_> {
    fn view(&self) -> LogitsView<'_> {
        match self {
            Logits::F32(a) => LogitsView::F32(a.as_array()),
            Logits::F64(a) => LogitsView::F64(a.as_array()),
            Logits::F16(a) => LogitsView::F16(a.as_array()),
            Logits::BF16Bits(a) => {
                let bits: ArrayView2<'_, i16> = a.as_array();
                // SAFETY: bf16 is a transparent 16-bit type with the size and alignment of i16,
                // and every bit pattern is a valid bf16; the view keeps the borrow's lifetime.
                LogitsView::BF16(unsafe { bits.raw_view().cast::<bf16>().deref_into_view() })
            }
        }
    }
}

fn extract_logits<'py>(
    obj: &Bound<'py, PyAny>,
    logits_dtype: Option<&str>,
) -> PyResult<Logits<'py>> {
    let a = as_ndarray(obj, "logits")?;
    check_ndim(&a, "logits", 2)?;
    let dt = a.dtype();
    if !dt.is_native_byteorder().unwrap_or(true) {
        return Err(PyTypeError::new_err(
            "logits: non-native byte order is not supported",
        ));
    }
    let err = |what: &str| PyValueError::new_err(format!("logits: cannot be read ({what})"));
    let (kind, size) = (dt.kind(), dt.itemsize());
    match (logits_dtype, kind, size) {
        (Some("bfloat16"), b'i' | b'u', 2) => {
            let view = a.cast::<numpy::PyArray2<i16>>().ok().cloned().or_else(|| {
                // uint16 bit patterns: reinterpret through numpy's own view (no copy).
                a.call_method1("view", ("int16",))
                    .ok()?
                    .cast_into::<numpy::PyArray2<i16>>()
                    .ok()
            });
            let view = view.ok_or_else(|| err("bfloat16 bits must be int16 or uint16"))?;
            Ok(Logits::BF16Bits(
                view.try_readonly().map_err(|e| err(&e.to_string()))?,
            ))
        }
        (Some(other), _, _) if other != "bfloat16" => Err(PyValueError::new_err(format!(
            "logits_dtype: expected None or 'bfloat16', got {other:?}"
        ))),
        (Some(_), _, _) => Err(PyTypeError::new_err(format!(
            "logits: bfloat16 logits must be passed as int16/uint16 bit patterns, got {}",
            dt
        ))),
        (None, b'f', 4) => Ok(Logits::F32(
            a.cast::<PyArray2<f32>>()?
                .try_readonly()
                .map_err(|e| err(&e.to_string()))?,
        )),
        (None, b'f', 8) => Ok(Logits::F64(
            a.cast::<PyArray2<f64>>()?
                .try_readonly()
                .map_err(|e| err(&e.to_string()))?,
        )),
        (None, b'f', 2) => Ok(Logits::F16(
            a.cast::<PyArray2<f16>>()?
                .try_readonly()
                .map_err(|e| err(&e.to_string()))?,
        )),
        _ => Err(PyTypeError::new_err(format!(
            "logits: expected float16, float32 or float64 (or torch bfloat16), got {dt}"
        ))),
    }
}

/// Greedy verification from CPU logits `[N, V]` / `[T, V]`: only the visited rows are reduced.
#[pyfunction]
#[pyo3(signature = (tree, logits, logits_dtype=None))]
pub fn verify_greedy(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    logits: &Bound<'_, PyAny>,
    logits_dtype: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let tree = AnyTree::extract(tree)?;
    let logits = extract_logits(logits, logits_dtype)?;
    let view = logits.view();
    view.check(tree.num_nodes()).py()?;
    let vocab = view.shape().1;
    run(py, &tree, |g| view.argmax(g), vocab)
}

/// Read-only 2-D draft probabilities (float32 or float64).
enum Probs<'py> {
    F32(PyReadonlyArray2<'py, f32>),
    F64(PyReadonlyArray2<'py, f64>),
}

impl Probs<'_> {
    fn view(&self) -> ProbsView<'_> {
        match self {
            Probs::F32(a) => ProbsView::F32(a.as_array()),
            Probs::F64(a) => ProbsView::F64(a.as_array()),
        }
    }
}

fn extract_probs<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Probs<'py>> {
    let a = as_ndarray(obj, "draft_probs")?;
    check_ndim(&a, "draft_probs", 2)?;
    let dt = a.dtype();
    let err = |e: String| PyValueError::new_err(format!("draft_probs: cannot be read ({e})"));
    if !dt.is_native_byteorder().unwrap_or(true) {
        return Err(PyTypeError::new_err(
            "draft_probs: non-native byte order is not supported",
        ));
    }
    match (dt.kind(), dt.itemsize()) {
        (b'f', 4) => Ok(Probs::F32(
            a.cast::<PyArray2<f32>>()?
                .try_readonly()
                .map_err(|e| err(e.to_string()))?,
        )),
        (b'f', 8) => Ok(Probs::F64(
            a.cast::<PyArray2<f64>>()?
                .try_readonly()
                .map_err(|e| err(e.to_string()))?,
        )),
        _ => Err(PyTypeError::new_err(format!(
            "draft_probs: expected float32 or float64, got {dt}"
        ))),
    }
}

fn float_vec(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<f64>> {
    let a = as_ndarray(obj, arg)?;
    check_ndim(&a, arg, 1)?;
    let typed = a.cast::<PyArray1<f64>>().map_err(|_| {
        PyTypeError::new_err(format!("{arg}: expected float64 values, got {}", a.dtype()))
    })?;
    Ok(typed.try_readonly()?.as_array().to_vec())
}

/// `seed` of `verify_sampled`: an int in `[0, 2**64)` for the batch, or a uint64 array of
/// one seed per request.
fn seeds_arg(seed: &Bound<'_, PyAny>) -> PyResult<Seeds> {
    if let Ok(a) = seed.cast::<numpy::PyArray1<u64>>() {
        return Ok(Seeds::PerRequest(a.try_readonly()?.as_array().to_vec()));
    }
    let one: u64 = seed.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "seed: expected an integer in [0, 2**64) or a uint64 array of one per request, got {}",
            seed.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    Ok(Seeds::Batch(one))
}

/// Sampled verification from CPU logits: per-request `temperature` / `top_k` / `top_p`
/// (float64 / int64 / float64 arrays of length 1 or B), a 64-bit `seed` (or a uint64 array
/// of one per request), and the rule:
/// "match" (default), "rejection" (needs `draft_probs`) or "typical".
#[pyfunction]
#[pyo3(signature = (
    tree, logits, temperature, top_k, top_p, seed, *, logits_dtype=None, rule="match",
    draft_probs=None, without_replacement=false, posterior_threshold=0.09, posterior_alpha=0.3
))]
#[allow(clippy::too_many_arguments)]
pub fn verify_sampled(
    py: Python<'_>,
    tree: &Bound<'_, PyAny>,
    logits: &Bound<'_, PyAny>,
    temperature: &Bound<'_, PyAny>,
    top_k: &Bound<'_, PyAny>,
    top_p: &Bound<'_, PyAny>,
    seed: &Bound<'_, PyAny>,
    logits_dtype: Option<&str>,
    rule: &str,
    draft_probs: Option<&Bound<'_, PyAny>>,
    without_replacement: bool,
    posterior_threshold: f64,
    posterior_alpha: f64,
) -> PyResult<Py<PyAny>> {
    let tree = AnyTree::extract(tree)?;
    let logits = extract_logits(logits, logits_dtype)?;
    let seed = seeds_arg(seed)?;
    let temps = float_vec(temperature, "temperature")?;
    let ks = int_array1(top_k, "top_k", false)?;
    let ks: Vec<i64> = with_int_view!(ks, v => v.iter().map(|&x| x.to_i64()).collect());
    let ps = float_vec(top_p, "top_p")?;
    let probs = draft_probs.map(extract_probs).transpose()?;
    let rule = match (rule, &probs) {
        ("match", None) => Rule::Match,
        ("rejection", Some(p)) => Rule::Rejection {
            draft_probs: p.view(),
            without_replacement,
        },
        ("rejection", None) => {
            return Err(PyValueError::new_err(
                "draft_probs: the rejection rule needs the draft's probabilities",
            ))
        }
        ("typical", None) => Rule::Typical {
            posterior_threshold,
            posterior_alpha,
        },
        ("match" | "typical", Some(_)) => {
            return Err(PyValueError::new_err(format!(
                "draft_probs: not used by rule {rule:?}"
            )))
        }
        (other, _) => {
            return Err(PyValueError::new_err(format!(
                "rule: expected 'match', 'rejection' or 'typical', got {other:?}"
            )))
        }
    };
    let view = logits.view();
    match &tree {
        AnyTree::One(t) => {
            let tree: &Tree = &t.get().inner;
            let params = SamplingParams::per_request(&temps, &ks, &ps, 1).py()?;
            let sampled = Sampled::new(
                view,
                params,
                seed,
                rule,
                std::iter::once((0, tree.view())),
                tree.num_nodes(),
            )
            .py()?;
            let inner = py
                .detach(|| verify::verify_tree_sampled(tree.view(), &sampled))
                .py()?;
            Ok(Py::new(py, PyVerifyResult { inner })?.into_any())
        }
        AnyTree::Batch(b) => {
            let batch: &TreeBatch = &b.get().inner;
            let params = SamplingParams::per_request(&temps, &ks, &ps, batch.num_trees()).py()?;
            let trees = batch.offsets()[..batch.num_trees()]
                .iter()
                .copied()
                .zip(batch.trees());
            let sampled = Sampled::new(view, params, seed, rule, trees, batch.num_nodes()).py()?;
            let inner = py
                .detach(|| verify::verify_batch_sampled(batch, &sampled))
                .py()?;
            Ok(Py::new(py, PyBatchVerifyResult { inner })?.into_any())
        }
    }
}
