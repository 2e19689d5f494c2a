//! `Tree` and `TreeBatch`: validation, properties and every layout. Each method extracts its
//! arguments, allocates (or checks) the output array, releases the GIL and calls one core
//! kernel that writes straight into the array's memory.

use ndarray::ArrayView1;
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArray};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use specsched_core::layout::{self, packed_words, PrefixLens};
use specsched_core::topology::{self, ChoiceOrder};
use specsched_core::{Tree, TreeBatch, TreeRef};

use crate::convert::{
    int_array1, output, readonly_view, type_name, with_int_view, writer, zeros, IntoPyResult,
    PerRequest,
};

/// `max_depth` of `Tree.limit_depth`, an int (named in the error).
fn max_depth_arg(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    crate::convert::int_arg(obj, "max_depth")
}

/// A draft tree: node 0 is the root (the last committed token), `parents[i] < i`.
#[pyclass(frozen, eq, module = "specsched", name = "Tree")]
#[derive(PartialEq)]
pub struct PyTree {
    pub inner: Tree,
}

/// Float dtype of an attention bias.
#[derive(Clone, Copy)]
enum BiasDtype {
    F16,
    F32,
    F64,
}

fn bias_dtype(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<BiasDtype> {
    let Some(dtype) = dtype else {
        return Ok(BiasDtype::F32);
    };
    let np = numpy::get_array_module(dtype.py())?;
    let d = np
        .call_method1("dtype", (dtype,))
        .map_err(|e| PyTypeError::new_err(format!("dtype: not a numpy dtype: {e}")))?;
    let ch: String = d.getattr("char")?.extract()?;
    match ch.as_str() {
        "e" => Ok(BiasDtype::F16),
        "f" => Ok(BiasDtype::F32),
        "d" => Ok(BiasDtype::F64),
        _ => Err(PyTypeError::new_err(format!(
            "dtype: expected float16, float32 or float64, got {}",
            d.str()?
        ))),
    }
}

fn check_prefix_len(p: i64) -> PyResult<usize> {
    if p < 0 {
        return Err(PyValueError::new_err(format!(
            "prefix_len: must be >= 0, got {p}"
        )));
    }
    Ok(p as usize)
}

/// Dense ancestor layout of one tree with `prefix` leading columns of `yes`.
fn dense<'py, T: numpy::Element + Copy + Send>(
    py: Python<'py>,
    tree: TreeRef<'_>,
    prefix: usize,
    yes: T,
    no: T,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let n = tree.num_nodes();
    layout::output_len("prefix_len", n, prefix + n).py()?;
    let arr = output::<T>(py, out, &[n, prefix + n])?;
    {
        let mut w = writer(&arr)?;
        let buf = w.as_slice_mut()?;
        py.detach(|| layout::fill_ancestor_rows(tree, prefix, prefix + n, yes, no, buf))
            .py()?;
    }
    Ok(arr)
}

fn bias<'py>(
    py: Python<'py>,
    tree: TreeRef<'_>,
    prefix: usize,
    dtype: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    Ok(match bias_dtype(dtype)? {
        BiasDtype::F16 => dense(
            py,
            tree,
            prefix,
            half::f16::ZERO,
            half::f16::NEG_INFINITY,
            out,
        )?
        .as_untyped()
        .clone(),
        BiasDtype::F32 => dense(py, tree, prefix, 0f32, f32::NEG_INFINITY, out)?
            .as_untyped()
            .clone(),
        BiasDtype::F64 => dense(py, tree, prefix, 0f64, f64::NEG_INFINITY, out)?
            .as_untyped()
            .clone(),
    })
}

fn paths_array<'py>(py: Python<'py>, tree: TreeRef<'_>) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let width = tree.max_depth as usize + 1;
    let arr = zeros::<i32>(py, &[tree.num_leaves, width])?;
    {
        let mut w = writer(&arr)?;
        let buf = w.as_slice_mut()?;
        py.detach(|| layout::fill_paths(tree, width, buf)).py()?;
    }
    Ok(arr)
}

#[pymethods]
impl PyTree {
    #[new]
    fn new(
        py: Python<'_>,
        parents: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let p = int_array1(parents, "parents", false)?;
        let t = int_array1(tokens, "tokens", true)?;
        let inner = with_int_view!(p, pv => with_int_view!(t, tv => {
            py.detach(|| Tree::from_views(pv, tv))
        }))
        .py()?;
        Ok(PyTree { inner })
    }

    /// Root plus a linear draft: `tokens[0]` is the root, node i's parent is i - 1.
    #[staticmethod]
    fn chain(py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<Self> {
        let t = int_array1(tokens, "tokens", true)?;
        Ok(PyTree {
            inner: with_int_view!(t, v => py.detach(|| topology::chain(v))).py()?,
        })
    }

    /// A tree from Medusa / EAGLE / vLLM / TensorRT-LLM choice paths (root implicit), nodes
    /// in `order`: "breadth_first" (by length, then path) or "depth_first" (by path).
    #[staticmethod]
    #[pyo3(
        signature = (choices, tokens=None, order=ChoiceOrder::BreadthFirst),
        text_signature = "(choices, tokens=None, order='breadth_first')"
    )]
    fn from_choices(
        py: Python<'_>,
        choices: &Bound<'_, PyAny>,
        tokens: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = choice_order)] order: ChoiceOrder,
    ) -> PyResult<Self> {
        let layout = order;
        let mut paths: Vec<Vec<i64>> = Vec::new();
        let iter = choices.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "choices: expected a sequence of int tuples, got {}",
                type_name(choices)
            ))
        })?;
        for (j, c) in iter.enumerate() {
            paths.push(choice_path(&c?, j)?);
        }
        let inner = match tokens {
            None => {
                py.detach(|| topology::from_choices_in(&paths, None::<ArrayView1<'_, i64>>, layout))
            }
            Some(t) => {
                let t = int_array1(t, "tokens", true)?;
                with_int_view!(t, v => py.detach(|| {
                    topology::from_choices_in(&paths, Some(v), layout)
                }))
            }
        }
        .py()?;
        Ok(PyTree { inner })
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    #[getter]
    fn max_depth(&self) -> u32 {
        self.inner.max_depth()
    }

    #[getter]
    fn num_leaves(&self) -> usize {
        self.inner.num_leaves()
    }

    /// The tree without its nodes deeper than `max_depth` (0: the root alone), order kept.
    fn limit_depth(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = max_depth_arg)] max_depth: i64,
    ) -> PyResult<PyTree> {
        let d = usize::try_from(max_depth).map_err(|_| {
            PyValueError::new_err(format!("max_depth: must be >= 0, got {max_depth}"))
        })?;
        let tree = &self.inner;
        Ok(PyTree {
            inner: py.detach(|| tree.limit_depth(d)),
        })
    }

    /// int32 `[N]`, read-only, shares the tree's memory.
    #[getter]
    fn parents<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i32>> {
        readonly_view(slf.as_any(), ArrayView1::from(slf.get().inner.parents()))
    }

    #[getter]
    fn tokens<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i64>> {
        readonly_view(slf.as_any(), ArrayView1::from(slf.get().inner.tokens()))
    }

    #[getter]
    fn depths<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i32>> {
        readonly_view(slf.as_any(), ArrayView1::from(slf.get().inner.depths()))
    }

    /// Pickles as `Tree(parents, tokens)` (a serving engine ships trees between its
    /// scheduler and worker processes).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let args = PyTuple::new(
            slf.py(),
            [Self::parents(slf).into_any(), Self::tokens(slf).into_any()],
        )?;
        PyTuple::new(slf.py(), [slf.get_type().into_any(), args.into_any()])
    }

    /// Immutable: a copy is the tree itself.
    fn __copy__(slf: &Bound<'_, Self>) -> Py<Self> {
        slf.clone().unbind()
    }

    fn __deepcopy__(slf: &Bound<'_, Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf.clone().unbind()
    }

    fn __len__(&self) -> usize {
        self.inner.num_nodes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Tree(num_nodes={}, max_depth={}, num_leaves={})",
            self.inner.num_nodes(),
            self.inner.max_depth(),
            self.inner.num_leaves()
        )
    }

    #[pyo3(signature = (prefix_len=0, *, out=None))]
    fn attention_mask<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::convert::prefix_len_arg)] prefix_len: i64,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<bool>>> {
        dense(
            py,
            self.inner.view(),
            check_prefix_len(prefix_len)?,
            true,
            false,
            out,
        )
    }

    #[pyo3(signature = (prefix_len=0, dtype=None, *, out=None))]
    fn attention_bias<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::convert::prefix_len_arg)] prefix_len: i64,
        dtype: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        bias(
            py,
            self.inner.view(),
            check_prefix_len(prefix_len)?,
            dtype,
            out,
        )
    }

    #[pyo3(signature = (*, out=None))]
    fn packed_mask<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<u32>>> {
        let t = self.inner.view();
        let words = packed_words(t.num_nodes());
        let arr = output::<u32>(py, out, &[t.num_nodes(), words])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            py.detach(|| layout::fill_packed_mask(t, words, buf)).py()?;
        }
        Ok(arr)
    }

    #[pyo3(signature = (prefix_len=0, *, out=None))]
    fn positions<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::convert::prefix_len_arg)] prefix_len: i64,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
        check_prefix_len(prefix_len)?;
        let t = self.inner.view();
        let arr = output::<i64>(py, out, &[t.num_nodes()])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            py.detach(|| layout::fill_positions(t, prefix_len, buf))
                .py()?;
        }
        Ok(arr)
    }

    fn paths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
        paths_array(py, self.inner.view())
    }

    fn sglang_links<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let t = self.inner.view();
        let n = t.num_nodes();
        let (nt, ns) = (zeros::<i64>(py, &[n])?, zeros::<i64>(py, &[n])?);
        {
            let (mut a, mut b) = (writer(&nt)?, writer(&ns)?);
            let (a, b) = (a.as_slice_mut()?, b.as_slice_mut()?);
            py.detach(|| layout::fill_sglang_links(t, a, b)).py()?;
        }
        PyTuple::new(py, [nt, ns])
    }
}

/// `B` trees stored flat and ragged, with CSR offsets; parents are tree-local.
#[pyclass(frozen, eq, module = "specsched", name = "TreeBatch")]
#[derive(PartialEq)]
pub struct PyTreeBatch {
    pub inner: TreeBatch,
}

impl PyTreeBatch {
    fn ragged<'py, T: numpy::Element + Copy + Send + Sync>(
        &self,
        py: Python<'py>,
        prefix: &[usize],
        yes: T,
        no: T,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
        let indptr = layout::ragged_mask_indptr(&self.inner, prefix).py()?;
        let total = *indptr.last().unwrap_or(&0);
        let arr = output::<T>(py, out, &[total])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            let b = &self.inner;
            py.detach(|| layout::fill_ragged_mask(b, prefix, yes, no, buf))
                .py()?;
        }
        Ok(arr)
    }
}

fn usize_array<'py>(py: Python<'py>, v: &[usize]) -> Bound<'py, PyArray1<i64>> {
    PyArray1::from_iter(py, v.iter().map(|&x| x as i64))
}

#[pymethods]
impl PyTreeBatch {
    #[new]
    fn new(py: Python<'_>, trees: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut refs: Vec<Bound<'_, PyTree>> = Vec::new();
        let iter = trees.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "trees: expected a sequence of Tree, got {}",
                type_name(trees)
            ))
        })?;
        for (i, t) in iter.enumerate() {
            let t = t?;
            let tree = t.cast::<PyTree>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "trees[{i}]: expected a Tree, got {}",
                    type_name(&t)
                ))
            })?;
            refs.push(tree.clone());
        }
        let inner_refs: Vec<&Tree> = refs.iter().map(|t| &t.get().inner).collect();
        Ok(PyTreeBatch {
            inner: py.detach(|| TreeBatch::from_trees(&inner_refs)).py()?,
        })
    }

    /// Validates flat tree-local `parents`, `tokens` and CSR `offsets` `[B+1]`.
    #[classmethod]
    fn from_flat(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        parents: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let p = int_array1(parents, "parents", false)?;
        let t = int_array1(tokens, "tokens", true)?;
        let o = int_array1(offsets, "offsets", false)?;
        let inner = with_int_view!(p, pv => with_int_view!(t, tv => with_int_view!(o, ov => {
            py.detach(|| TreeBatch::from_views(pv, tv, ov))
        })))
        .py()?;
        Ok(PyTreeBatch { inner })
    }

    #[getter]
    fn num_trees(&self) -> usize {
        self.inner.num_trees()
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    #[getter]
    fn max_depth(&self) -> u32 {
        self.inner.max_depth()
    }

    #[getter]
    fn max_nodes(&self) -> usize {
        self.inner.max_nodes()
    }

    /// The batch without the nodes of tree `b` deeper than `max_depth[b]` (an int for every
    /// tree, or an int array `[B]`), order kept.
    fn limit_depth(&self, py: Python<'_>, max_depth: &Bound<'_, PyAny>) -> PyResult<PyTreeBatch> {
        let d = PerRequest::extract(max_depth, "max_depth")?.into_vec(self.inner.num_trees())?;
        let b = &self.inner;
        let inner = py.detach(|| b.limit_depth(&d)).py()?;
        Ok(PyTreeBatch { inner })
    }

    /// int64 `[B+1]` CSR offsets (a new array, read-only as every array of a batch is:
    /// writing into it would change nothing).
    #[getter]
    fn offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let a = usize_array(py, self.inner.offsets());
        crate::convert::set_readonly(a.as_untyped());
        a
    }

    #[getter]
    fn parents<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i32>> {
        readonly_view(slf.as_any(), ArrayView1::from(slf.get().inner.parents()))
    }

    #[getter]
    fn tokens<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i64>> {
        readonly_view(slf.as_any(), ArrayView1::from(slf.get().inner.tokens()))
    }

    #[getter]
    fn depths<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyArray1<i32>> {
        readonly_view(slf.as_any(), ArrayView1::from(slf.get().inner.depths()))
    }

    /// Pickles as `TreeBatch.from_flat(parents, tokens, offsets)`.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let args = PyTuple::new(
            py,
            [
                Self::parents(slf).into_any(),
                Self::tokens(slf).into_any(),
                slf.get().offsets(py).into_any(),
            ],
        )?;
        let from_flat = slf.get_type().getattr("from_flat")?;
        PyTuple::new(py, [from_flat, args.into_any()])
    }

    /// Immutable: a copy is the batch itself.
    fn __copy__(slf: &Bound<'_, Self>) -> Py<Self> {
        slf.clone().unbind()
    }

    fn __deepcopy__(slf: &Bound<'_, Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf.clone().unbind()
    }

    fn __len__(&self) -> usize {
        self.inner.num_trees()
    }

    fn __getitem__(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::convert::index_arg)] index: isize,
    ) -> PyResult<PyTree> {
        let b = self.inner.num_trees() as isize;
        let i = if index < 0 { index + b } else { index };
        if i < 0 || i >= b {
            return Err(PyIndexError::new_err(format!(
                "index: {index} is out of range for a batch of {b} trees"
            )));
        }
        let batch = &self.inner;
        Ok(PyTree {
            inner: py.detach(|| batch.to_tree(i as usize)),
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "TreeBatch(num_trees={}, num_nodes={}, max_nodes={}, max_depth={})",
            self.inner.num_trees(),
            self.inner.num_nodes(),
            self.inner.max_nodes(),
            self.inner.max_depth()
        )
    }

    #[pyo3(signature = (prefix_lens=None, *, out=None))]
    fn positions<'py>(
        &self,
        py: Python<'py>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
        let prefix = self.prefix_or_zero(prefix_lens)?;
        let arr = output::<i64>(py, out, &[self.inner.num_nodes()])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            let b = &self.inner;
            py.detach(|| layout::fill_batch_positions(b, &prefix, buf))
                .py()?;
        }
        Ok(arr)
    }

    #[pyo3(signature = (prefix_lens=None, *, out=None))]
    fn attention_mask<'py>(
        &self,
        py: Python<'py>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<bool>>> {
        let prefix = self.prefix_or_zero(prefix_lens)?;
        self.ragged(py, &prefix, true, false, out)
    }

    #[pyo3(signature = (prefix_lens=None))]
    fn mask_indptr<'py>(
        &self,
        py: Python<'py>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let prefix = self.prefix_or_zero(prefix_lens)?;
        let b = &self.inner;
        let indptr = py.detach(|| layout::ragged_mask_indptr(b, &prefix)).py()?;
        Ok(usize_array(py, &indptr))
    }

    #[pyo3(signature = (prefix_lens=None, dtype=None, *, out=None))]
    fn attention_bias<'py>(
        &self,
        py: Python<'py>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        let prefix = self.prefix_or_zero(prefix_lens)?;
        Ok(match bias_dtype(dtype)? {
            BiasDtype::F16 => self
                .ragged(py, &prefix, half::f16::ZERO, half::f16::NEG_INFINITY, out)?
                .as_untyped()
                .clone(),
            BiasDtype::F32 => self
                .ragged(py, &prefix, 0f32, f32::NEG_INFINITY, out)?
                .as_untyped()
                .clone(),
            BiasDtype::F64 => self
                .ragged(py, &prefix, 0f64, f64::NEG_INFINITY, out)?
                .as_untyped()
                .clone(),
        })
    }

    /// FlashInfer `segment_packbits(mask, mask_indptr, bitorder="little")` of the ragged mask.
    #[pyo3(signature = (prefix_lens=None))]
    fn packed_attention_mask<'py>(
        &self,
        py: Python<'py>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let prefix = self.prefix_or_zero(prefix_lens)?;
        let indptr = layout::packed_ragged_indptr(&self.inner, &prefix).py()?;
        let arr = zeros::<u8>(py, &[*indptr.last().unwrap_or(&0)])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            let b = &self.inner;
            py.detach(|| layout::fill_packed_ragged_mask(b, &prefix, buf))
                .py()?;
        }
        PyTuple::new(py, [arr.into_any(), usize_array(py, &indptr).into_any()])
    }

    /// SGLang QLEN_ONLY mask `[B, N, N]` (all trees the same size).
    #[pyo3(signature = (*, out=None))]
    fn qlen_mask<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<bool>>> {
        let n = layout::qlen_tree_size(&self.inner).py()?;
        let arr = output::<bool>(py, out, &[self.inner.num_trees(), n, n])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            let b = &self.inner;
            py.detach(|| layout::fill_qlen_mask(b, buf)).py()?;
        }
        Ok(arr)
    }

    /// `[B, Nmax, Nmax]` tree mask, False outside each tree.
    #[pyo3(signature = (*, out=None))]
    fn padded_mask<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<bool>>> {
        let m = self.inner.max_nodes();
        let arr = output::<bool>(py, out, &[self.inner.num_trees(), m, m])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            let b = &self.inner;
            py.detach(|| layout::fill_padded_mask(b, buf)).py()?;
        }
        Ok(arr)
    }

    /// `(tokens, positions, tree_mask, rows, cols)`: the batch as the `[B, Nmax]` batch a model
    /// runs (`generate.pad_trees`), in one call: right after a model forward each numpy
    /// operation of a Python formulation costs µs.
    #[pyo3(signature = (prefix_lens=None))]
    fn padded_layout<'py>(
        &self,
        py: Python<'py>,
        prefix_lens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let prefix = self.prefix_or_zero(prefix_lens)?;
        let b = &self.inner;
        let (n, m, t) = (b.num_trees(), b.max_nodes(), b.num_nodes());
        let tokens = zeros::<i64>(py, &[n, m])?;
        let positions = zeros::<i64>(py, &[n, m])?;
        let mask = zeros::<bool>(py, &[n, m, m])?;
        let rows = zeros::<i64>(py, &[t])?;
        let cols = zeros::<i64>(py, &[t])?;
        // SAFETY: the five arrays were made just above, each its own C-contiguous allocation,
        // and no other reference to any of them exists before this function returns them, so
        // these are the only views of their data (rust-numpy's borrow registry, which tracks
        // views shared with other calls, has none to find).
        let out = unsafe {
            layout::PaddedOut {
                tokens: tokens.as_slice_mut()?,
                positions: positions.as_slice_mut()?,
                mask: mask.as_slice_mut()?,
                rows: rows.as_slice_mut()?,
                cols: cols.as_slice_mut()?,
            }
        };
        py.detach(|| layout::fill_padded_layout(b, &prefix, out))
            .py()?;
        PyTuple::new(
            py,
            [
                tokens.into_any(),
                positions.into_any(),
                mask.into_any(),
                rows.into_any(),
                cols.into_any(),
            ],
        )
    }

    /// uint32 `[T, ceil(Nmax/32)]`: each node's ancestor bits over its own tree.
    #[pyo3(signature = (*, out=None))]
    fn packed_mask<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<u32>>> {
        let words = packed_words(self.inner.max_nodes());
        let arr = output::<u32>(py, out, &[self.inner.num_nodes(), words])?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            let b = &self.inner;
            py.detach(|| layout::fill_batch_packed_mask(b, buf)).py()?;
        }
        Ok(arr)
    }

    /// int32 `[B, Lmax, Dmax+1]` root-to-leaf paths, tree-local, -1 padded.
    fn paths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
        let b = &self.inner;
        let shape = [
            b.num_trees(),
            layout::max_leaves(b),
            b.max_depth() as usize + 1,
        ];
        let arr = zeros::<i32>(py, &shape)?;
        {
            let mut w = writer(&arr)?;
            let buf = w.as_slice_mut()?;
            py.detach(|| layout::fill_batch_paths(b, buf)).py()?;
        }
        Ok(arr)
    }

    fn sglang_links<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let n = self.inner.num_nodes();
        let (nt, ns) = (zeros::<i64>(py, &[n])?, zeros::<i64>(py, &[n])?);
        {
            let (mut a, mut b) = (writer(&nt)?, writer(&ns)?);
            let (a, b) = (a.as_slice_mut()?, b.as_slice_mut()?);
            let batch = &self.inner;
            py.detach(|| layout::fill_batch_sglang_links(batch, a, b))
                .py()?;
        }
        PyTuple::new(py, [nt, ns])
    }
}

impl PyTreeBatch {
    fn prefix_or_zero(&self, prefix_lens: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<usize>> {
        match prefix_lens {
            None => Ok(vec![0; self.inner.num_trees()]),
            Some(p) => {
                let n = self.inner.num_trees();
                match PerRequest::extract(p, "prefix_lens")? {
                    PerRequest::All(p) => PrefixLens::All(p).resolve(n).py(),
                    each => PrefixLens::PerTree(&each.into_vec(n)?).resolve(n).py(),
                }
            }
        }
    }
}

/// `order` of `Tree.from_choices`: "breadth_first" or "depth_first" (any other object, a
/// non-string included, is an error naming `order`).
/// `choices[j]` as a path of ints: a bool entry is refused (PyO3 reads it as 0 / 1).
fn choice_path(c: &Bound<'_, PyAny>, j: usize) -> PyResult<Vec<i64>> {
    let path = c.extract::<Vec<i64>>();
    // Entry by entry: a bool (PyO3 reads it as 0 / 1) or a non-int is a TypeError and an int
    // past int64 a ValueError, each naming `choices[j][k]`.
    for (k, x) in c.try_iter().into_iter().flatten().enumerate() {
        let x = x?;
        if x.is_instance_of::<pyo3::types::PyBool>() || x.extract::<i64>().is_err() {
            crate::convert::int_arg(&x, &format!("choices[{j}][{k}]"))?;
        }
    }
    path.map_err(|e| {
        PyTypeError::new_err(format!(
            "choices[{j}]: expected a tuple of ints, got {} ({e})",
            type_name(c)
        ))
    })
}

fn choice_order(order: &Bound<'_, PyAny>) -> PyResult<ChoiceOrder> {
    match crate::convert::str_choice(order, "order", &["breadth_first", "depth_first"])? {
        0 => Ok(ChoiceOrder::BreadthFirst),
        _ => Ok(ChoiceOrder::DepthFirst),
    }
}
