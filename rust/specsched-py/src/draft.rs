//! `SuffixDrafter`, `NgramDrafter` and `Draft`: argument conversion, locking and GIL release
//! around the core drafters of `specsched_core::draft`.
//!
//! A `SuffixDrafter` may be shared between threads: its state sits behind a read-write lock
//! (proposals share it, appends take it alone), always taken with the GIL released.

use std::sync::RwLock;

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use specsched_core::draft::ngram::NgramConfig;
use specsched_core::draft::suffix::{Proposal, ProposeOptions, SuffixDrafter};
use specsched_core::draft::MAX_CONTEXT_TOKENS;
use specsched_core::{Tree, TreeBatch};

use crate::convert::{
    int_array1, owned, set_readonly, try_collect, with_int_view, IntArray1, IntoPyResult,
    PerRequest,
};
use crate::tree::{PyTree, PyTreeBatch};

/// A drafter's 1-D int array argument, its length checked before anything is copied.
fn token_array<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<IntArray1<'py>> {
    let a = int_array1(obj, arg, true)?;
    let len = with_int_view!(a, v => v.len());
    if len > MAX_CONTEXT_TOKENS {
        return Err(PyValueError::new_err(format!(
            "{arg}: {len} entries, more than the {MAX_CONTEXT_TOKENS} a drafter takes"
        )));
    }
    Ok(a)
}

fn int_list(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<i64>> {
    let a = token_array(obj, arg)?;
    with_int_view!(a, v => try_collect(
        v.len(),
        v.iter().map(|x| specsched_core::IndexLike::to_i64(*x)),
        arg,
    ))
}

/// Runs `f` on the tokens as an `i64` slice: the array's own memory when it is a contiguous
/// int64 array (a long prompt is read in place, not copied first), else a converted copy.
fn with_tokens<R>(obj: &Bound<'_, PyAny>, arg: &str, f: impl FnOnce(&[i64]) -> R) -> PyResult<R> {
    let a = token_array(obj, arg)?;
    if let IntArray1::I64(v) = &a {
        if let Ok(s) = v.as_slice() {
            return Ok(f(s));
        }
    }
    let copy = with_int_view!(a, v => try_collect(
        v.len(),
        v.iter().map(|x| specsched_core::IndexLike::to_i64(*x)),
        arg,
    ))?;
    Ok(f(&copy))
}

fn sequence<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected a sequence, got str"
        )));
    }
    obj.try_iter()
        .map_err(|_| PyTypeError::new_err(format!("{arg}: expected a sequence")))?
        .collect()
}

fn poisoned<T>(_: T) -> PyErr {
    PyRuntimeError::new_err("SuffixDrafter: state lock poisoned by an earlier failure")
}

fn proposal_tree(p: &Proposal) -> specsched_core::Result<Tree> {
    Tree::new(&p.parents, &p.tokens)
}

fn batch(props: &[Proposal]) -> specsched_core::Result<TreeBatch> {
    let trees = props
        .iter()
        .map(proposal_tree)
        .collect::<specsched_core::Result<Vec<_>>>()?;
    TreeBatch::from_trees(&trees.iter().collect::<Vec<_>>())
}

/// One proposal: the tree, each node's path probability, its score and match length.
#[pyclass(frozen, module = "specsched", name = "Draft")]
pub struct PyDraft {
    tree: Py<PyTree>,
    probs: Vec<f64>,
    score: f64,
    match_len: usize,
}

#[pymethods]
impl PyDraft {
    #[getter]
    fn tree(&self, py: Python<'_>) -> Py<PyTree> {
        self.tree.clone_ref(py)
    }

    /// float64 `[N]`: path probability of each node under the frequency model (root 1).
    #[getter]
    fn probs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
        let a = owned(py, self.probs.clone(), &[self.probs.len()])?;
        set_readonly(a.as_untyped());
        Ok(a)
    }

    #[getter]
    fn score(&self) -> f64 {
        self.score
    }

    #[getter]
    fn match_len(&self) -> usize {
        self.match_len
    }

    fn __repr__(&self) -> String {
        format!(
            "Draft(num_nodes={}, score={:.4}, match_len={})",
            self.tree.get().inner.num_nodes(),
            self.score,
            self.match_len
        )
    }
}

/// Suffix-trie tree drafter over request contexts and past responses (SuffixDecoding-class).
#[pyclass(frozen, module = "specsched", name = "SuffixDrafter")]
pub struct PySuffixDrafter {
    inner: RwLock<SuffixDrafter>,
}

fn options(budget: i64, min_prob: f64, factor: f64, chain: bool) -> PyResult<ProposeOptions> {
    ProposeOptions::new(budget, min_prob, factor, chain).py()
}

impl PySuffixDrafter {
    /// `f` on the state under the shared lock, waited for with the GIL released: a long
    /// append in another thread holds the lock, and every Python thread would stop behind a
    /// getter waiting with the GIL held.
    fn read<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&SuffixDrafter) -> T + Send,
    ) -> PyResult<T> {
        py.detach(|| Ok(f(&*self.inner.read().map_err(poisoned)?)))
    }
}

#[pymethods]
impl PySuffixDrafter {
    #[new]
    #[pyo3(signature = (max_depth=64, max_global_tokens=1 << 22))]
    fn new(
        #[pyo3(from_py_with = crate::convert::max_depth_i64_arg)] max_depth: i64,
        #[pyo3(from_py_with = crate::convert::max_global_tokens_arg)] max_global_tokens: i64,
    ) -> PyResult<Self> {
        Ok(PySuffixDrafter {
            inner: RwLock::new(SuffixDrafter::new(max_depth, max_global_tokens).py()?),
        })
    }

    #[getter]
    fn max_depth(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |d| d.max_depth())
    }

    #[getter]
    fn max_global_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |d| d.max_global_tokens())
    }

    #[getter]
    fn num_requests(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |d| d.num_requests())
    }

    #[getter]
    fn num_global_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |d| d.num_global_tokens())
    }

    #[getter]
    fn num_indexed_tokens(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |d| d.num_indexed_tokens())
    }

    /// Heap bytes held by every index.
    #[getter]
    fn memory_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |d| d.memory_bytes())
    }

    /// Request ids whose responses are in the global index, oldest first.
    #[getter]
    fn cached_responses(&self, py: Python<'_>) -> PyResult<Vec<i64>> {
        self.read(py, |d| d.cached_responses())
    }

    fn has_request(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::request_id_arg)] request_id: i64,
    ) -> PyResult<bool> {
        self.read(py, |d| d.has_request(request_id))
    }

    fn start_request(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::request_id_arg)] request_id: i64,
        prompt: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        with_tokens(prompt, "prompt", |prompt| {
            py.detach(|| {
                let mut d = self.inner.write().map_err(poisoned)?;
                d.start_request(request_id, prompt).py()
            })
        })?
    }

    fn append(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::request_id_arg)] request_id: i64,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        with_tokens(tokens, "tokens", |tokens| {
            py.detach(|| {
                let mut d = self.inner.write().map_err(poisoned)?;
                d.append(request_id, tokens).py()
            })
        })?
    }

    #[pyo3(signature = (request_id, cache=true))]
    fn finish_request(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::request_id_arg)] request_id: i64,
        #[pyo3(from_py_with = crate::convert::cache_arg)] cache: bool,
    ) -> PyResult<()> {
        py.detach(|| {
            let mut d = self.inner.write().map_err(poisoned)?;
            d.finish_request(request_id, cache).py()
        })
    }

    fn remove_response(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::request_id_arg)] request_id: i64,
    ) -> PyResult<()> {
        py.detach(|| {
            let mut d = self.inner.write().map_err(poisoned)?;
            d.remove_response(request_id).py()
        })
    }

    #[pyo3(signature = (request_id, budget, min_prob=0.1, max_spec_factor=1.0, *, chain=false, use_global=true))]
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::request_id_arg)] request_id: i64,
        #[pyo3(from_py_with = crate::convert::budget_i64_arg)] budget: i64,
        #[pyo3(from_py_with = crate::convert::min_prob_arg)] min_prob: f64,
        #[pyo3(from_py_with = crate::convert::max_spec_factor_arg)] max_spec_factor: f64,
        #[pyo3(from_py_with = crate::convert::chain_arg)] chain: bool,
        #[pyo3(from_py_with = crate::convert::use_global_arg)] use_global: bool,
    ) -> PyResult<PyDraft> {
        let opt = options(budget, min_prob, max_spec_factor, chain)?;
        let (p, tree) = py.detach(|| -> PyResult<(Proposal, Tree)> {
            let d = self.inner.read().map_err(poisoned)?;
            let p = d.propose(request_id, &opt, use_global).py()?;
            let t = proposal_tree(&p).py()?;
            Ok((p, t))
        })?;
        Ok(PyDraft {
            tree: Py::new(py, PyTree { inner: tree })?,
            probs: p.probs,
            score: p.score,
            match_len: p.match_len,
        })
    }

    #[pyo3(signature = (request_ids, budgets, min_prob=0.1, max_spec_factor=1.0, *, chain=false, use_global=true))]
    #[allow(clippy::too_many_arguments)]
    fn propose_batch(
        &self,
        py: Python<'_>,
        request_ids: &Bound<'_, PyAny>,
        budgets: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::convert::min_prob_arg)] min_prob: f64,
        #[pyo3(from_py_with = crate::convert::max_spec_factor_arg)] max_spec_factor: f64,
        #[pyo3(from_py_with = crate::convert::chain_arg)] chain: bool,
        #[pyo3(from_py_with = crate::convert::use_global_arg)] use_global: bool,
    ) -> PyResult<PyTreeBatch> {
        let ids = int_list(request_ids, "request_ids")?;
        if ids.is_empty() {
            return Err(PyValueError::new_err(
                "request_ids: empty: a TreeBatch holds at least one tree",
            ));
        }
        // The shared options first, so their errors name them rather than `budgets[0]`.
        options(1, min_prob, max_spec_factor, chain)?;
        let budgets =
            PerRequest::extract(budgets, "budgets")?.into_vec_of(ids.len(), "request_ids entry")?;
        let opts = budgets
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                ProposeOptions::new(b, min_prob, max_spec_factor, chain)
                    .map_err(|e| PyValueError::new_err(format!("budgets[{i}]: {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let inner = py.detach(|| -> PyResult<TreeBatch> {
            let d = self.inner.read().map_err(poisoned)?;
            let props = d.propose_batch(&ids, &opts, use_global).py()?;
            batch(&props)
                .map_err(|e| e.renamed("trees", "request_ids"))
                .py()
        })?;
        Ok(PyTreeBatch { inner })
    }
}

/// vLLM's n-gram (prompt-lookup) proposer: chains from the longest earlier suffix match.
#[pyclass(frozen, module = "specsched", name = "NgramDrafter")]
pub struct PyNgramDrafter {
    cfg: NgramConfig,
}

/// Token ids (`0..=MAX_TOKEN_ID`, as the suffix drafter takes them), possibly none.
fn token_ids(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<i64>> {
    let c = int_list(obj, arg)?;
    if let Some(msg) = specsched_core::draft::bad_token(arg, &c) {
        return Err(PyValueError::new_err(msg));
    }
    Ok(c)
}

/// A draft's context: token ids, at least one (the last is the tree's root).
fn context(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<i64>> {
    let c = token_ids(obj, arg)?;
    if c.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{arg}: empty context: the root of a draft is the last context token"
        )));
    }
    Ok(c)
}

/// The chain tree of a proposal: the context's last token, then the drafts, cut to a
/// tree's node limit (`propose_tokens` returns all `k`; a tree holds `MAX_NODES`, as the
/// suffix drafter's budget is capped).
fn chain_of(ctx: &[i64], draft: &[i64]) -> specsched_core::Result<Tree> {
    let draft = &draft[..draft.len().min(specsched_core::tree::MAX_NODES - 1)];
    let mut tokens = Vec::with_capacity(draft.len() + 1);
    tokens.push(ctx[ctx.len() - 1]);
    tokens.extend_from_slice(draft);
    specsched_core::topology::chain(ndarray::ArrayView1::from(&tokens))
}

#[pymethods]
impl PyNgramDrafter {
    #[new]
    #[pyo3(signature = (min_n=1, max_n=4, k=5, max_model_len=1 << 40))]
    fn new(
        #[pyo3(from_py_with = crate::convert::min_n_arg)] min_n: i64,
        #[pyo3(from_py_with = crate::convert::max_n_arg)] max_n: i64,
        #[pyo3(from_py_with = crate::convert::k_arg)] k: i64,
        #[pyo3(from_py_with = crate::convert::max_model_len_arg)] max_model_len: i64,
    ) -> PyResult<Self> {
        Ok(PyNgramDrafter {
            cfg: NgramConfig::new(min_n, max_n, k, max_model_len).py()?,
        })
    }

    #[getter]
    fn min_n(&self) -> usize {
        self.cfg.min_n
    }

    #[getter]
    fn max_n(&self) -> usize {
        self.cfg.max_n
    }

    #[getter]
    fn k(&self) -> usize {
        self.cfg.k
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.cfg.max_model_len
    }

    /// The draft tokens vLLM would propose for `context` (int64, possibly empty).
    fn propose_tokens<'py>(
        &self,
        py: Python<'py>,
        context: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        // No root to draft from is needed here: an empty context proposes nothing, as vLLM's.
        let c = token_ids(context, "context")?;
        let draft = py.detach(|| self.cfg.propose(&c).to_vec());
        Ok(PyArray1::from_vec(py, draft))
    }

    /// The proposal as a chain Tree whose root is the last context token.
    fn propose(&self, py: Python<'_>, context: &Bound<'_, PyAny>) -> PyResult<PyTree> {
        let c = context_arg(context)?;
        let inner = py.detach(|| chain_of(&c, self.cfg.propose(&c))).py()?;
        Ok(PyTree { inner })
    }

    /// Chains for many contexts, computed in parallel with the GIL released.
    fn propose_batch(&self, py: Python<'_>, contexts: &Bound<'_, PyAny>) -> PyResult<PyTreeBatch> {
        let items = sequence(contexts, "contexts")?;
        if items.is_empty() {
            return Err(PyValueError::new_err(
                "contexts: empty: a TreeBatch holds at least one tree",
            ));
        }
        // Borrowed here; read, checked and converted with the GIL released (16 contexts of
        // 200,000 tokens spent half the call converting under the GIL).
        let arrays = items
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let arg = format!("contexts[{i}]");
                let a = token_array(c, &arg)?;
                if with_int_view!(a, v => v.is_empty()) {
                    return Err(PyValueError::new_err(format!(
                        "{arg}: empty context: the root of a draft is the last context token"
                    )));
                }
                Ok(a)
            })
            .collect::<PyResult<Vec<_>>>()?;
        let views: Vec<TokenView<'_>> = arrays.iter().map(TokenView::of).collect();
        let inner = py.detach(|| -> PyResult<TreeBatch> {
            let ctxs = views
                .iter()
                .enumerate()
                .map(|(i, v)| v.checked(&format!("contexts[{i}]")))
                .collect::<PyResult<Vec<_>>>()?;
            let refs: Vec<&[i64]> = ctxs.iter().map(|c| &c[..]).collect();
            let drafts = self.cfg.propose_batch(&refs);
            let trees = refs
                .iter()
                .zip(drafts)
                .map(|(c, d)| chain_of(c, d))
                .collect::<specsched_core::Result<Vec<_>>>()
                .py()?;
            TreeBatch::from_trees(&trees.iter().collect::<Vec<_>>())
                .map_err(|e| e.renamed("trees", "contexts"))
                .py()
        })?;
        Ok(PyTreeBatch { inner })
    }
}

/// A borrowed token array, readable without the GIL (the borrow is held by its
/// `IntArray1`, outside the released section).
enum TokenView<'a> {
    I32(ndarray::ArrayView1<'a, i32>),
    I64(ndarray::ArrayView1<'a, i64>),
    U32(ndarray::ArrayView1<'a, u32>),
}

impl<'a> TokenView<'a> {
    fn of(a: &'a IntArray1<'_>) -> Self {
        match a {
            IntArray1::I32(x) => TokenView::I32(x.as_array()),
            IntArray1::I64(x) => TokenView::I64(x.as_array()),
            IntArray1::U32(x) => TokenView::U32(x.as_array()),
        }
    }

    /// The tokens as `i64`, checked as token ids: a contiguous int64 array in place.
    fn checked(&self, arg: &str) -> PyResult<std::borrow::Cow<'a, [i64]>> {
        use std::borrow::Cow;
        let tokens: Cow<'a, [i64]> = match self {
            TokenView::I64(v) => match v.to_slice() {
                Some(s) => Cow::Borrowed(s),
                None => Cow::Owned(try_collect(v.len(), v.iter().copied(), arg)?),
            },
            TokenView::I32(v) => {
                Cow::Owned(try_collect(v.len(), v.iter().map(|&x| i64::from(x)), arg)?)
            }
            TokenView::U32(v) => {
                Cow::Owned(try_collect(v.len(), v.iter().map(|&x| i64::from(x)), arg)?)
            }
        };
        match specsched_core::draft::bad_token(arg, &tokens) {
            Some(msg) => Err(PyValueError::new_err(msg)),
            None => Ok(tokens),
        }
    }
}

fn context_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    context(obj, "context")
}
