//! `DraftBuffers`: the persistent numpy buffers of one `DynamicTreeBuilder`, for a decode loop
//! that writes the draft's top-k into them (e.g. `torch.topk(..., out=...)` on
//! `torch.from_numpy` views) and reads each step (and the built trees' pool indices) from
//! them, with nothing extracted or allocated per draft level.
//!
//! All buffers are typed views of one byte block, so a step takes a single rust-numpy borrow
//! (of the block) for everything it reads and writes: a concurrent specsched call holding any
//! of the views is refused instead of racing, and the step pays for one borrow, not nine.

use ndarray::{ArrayView2, ShapeBuilder};
use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PySlice;

use specsched_core::topology::dynamic::StepOut;

use crate::convert::zeros;

/// Fields of the block.
const FIELDS: usize = 10;

/// Byte layout of the block: the 8-byte fields first, so every field is aligned given the
/// block's (numpy allocates at least 16-byte aligned).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    batch: usize,
    topk: usize,
    /// Nodes per built tree, the root included (`pool_index` holds `budget - 1` a request).
    budget: usize,
    /// Mask columns per row: `depth · K`, room for every level.
    pub mask_stride: usize,
}

/// One step's view of the block, row-major: inputs the caller wrote (`[B]` roots, prefix
/// lengths and running flags, `[B, K, K]` top-k), outputs the builder writes.
pub struct Parts<'a> {
    pub root_tokens: &'a [i64],
    pub prefix_lens: &'a [i64],
    /// numpy bools as bytes (nonzero = running): read as `u8`, so a byte numpy did not write
    /// through a bool view is a flag, not an invalid `bool`.
    pub active: &'a [u8],
    pub topk_tokens: &'a [i64],
    pub topk_logprobs: &'a [f32],
    pub out: StepOut<'a, u8>,
    /// `[B, budget - 1]` row-major, written by `build_in_place`.
    pub pool_index: &'a mut [i64],
    batch: usize,
    topk: usize,
}

impl<'a> Parts<'a> {
    /// The root's top-k, `[:, 0, :]` of the `[B, K, K]` fields (what `start_in_place` reads):
    /// views with a row stride of `K²`.
    pub fn root_topk(&self) -> specsched_core::Result<(ArrayView2<'a, i64>, ArrayView2<'a, f32>)> {
        let (b, k) = (self.batch, self.topk);
        let rows = || (b, k).strides((k * k, 1));
        match (
            ArrayView2::from_shape(rows(), self.topk_tokens),
            ArrayView2::from_shape(rows(), self.topk_logprobs),
        ) {
            (Ok(tokens), Ok(logprobs)) => Ok((tokens, logprobs)),
            _ => Err(specsched_core::Error::value(
                "buffers",
                "internal layout error (top-k)",
            )),
        }
    }
}

/// One field of the block: its numpy dtype, item size and shape (the first `ndim` dims).
struct Field {
    dtype: &'static str,
    item: usize,
    dims: [usize; 3],
    ndim: usize,
}

impl Field {
    fn new(dtype: &'static str, item: usize, shape: &[usize]) -> Self {
        let mut dims = [1; 3];
        dims[..shape.len()].copy_from_slice(shape);
        Field {
            dtype,
            item,
            dims,
            ndim: shape.len(),
        }
    }

    fn shape(&self) -> &[usize] {
        &self.dims[..self.ndim]
    }

    fn bytes(&self) -> usize {
        self.item * self.shape().iter().product::<usize>()
    }
}

impl Layout {
    pub fn new(batch: usize, topk: usize, depth: usize, budget: usize) -> Self {
        Layout {
            batch,
            topk,
            budget,
            mask_stride: depth * topk,
        }
    }

    /// Each field, in block order: root_tokens, prefix_lens, topk_tokens, tokens,
    /// parent_index, positions, pool_index, topk_logprobs, attention_mask, active. No allocation:
    /// every step splits the block by it, right after a model forward, where each `malloc`
    /// costs. The builder bounds `batch · topk · depth · topk`, and with it `batch · budget`
    /// (a budget past the pool is refused), so no product here overflows.
    fn fields(&self) -> [Field; FIELDS] {
        let (b, k, w) = (self.batch, self.topk, self.mask_stride);
        let int64 = |shape: &[usize]| Field::new("int64", 8, shape);
        [
            int64(&[b]),
            int64(&[b]),
            int64(&[b, k, k]),
            int64(&[b, k]),
            int64(&[b, k]),
            int64(&[b, k]),
            int64(&[b, self.budget - 1]),
            Field::new("float32", 4, &[b, k, k]),
            Field::new("bool", 1, &[b, k, w]),
            Field::new("bool", 1, &[b]),
        ]
    }

    fn field_bytes(&self) -> [usize; FIELDS] {
        self.fields().map(|f| f.bytes())
    }

    fn bytes(&self) -> usize {
        self.field_bytes().iter().sum()
    }

    /// The block cut into its fields. Fails only if the block is not the one this layout
    /// made (wrong length or alignment), which the builder never hands out.
    pub fn split<'a>(&self, block: &'a mut [u8]) -> PyResult<Parts<'a>> {
        let [root, pre, tt, tok, par, pos, idx, lp, mask, _] = self.field_bytes();
        let ints = root + pre + tt + tok + par + pos + idx;
        if block.len() != self.bytes() {
            return Err(internal_layout_error());
        }
        let (ints, rest) = block.split_at_mut(ints);
        let (lp, rest) = rest.split_at_mut(lp);
        let (mask, active) = rest.split_at_mut(mask);
        let ints: &mut [i64] =
            bytemuck::try_cast_slice_mut(ints).map_err(|_| internal_layout_error())?;
        let lp: &[f32] = bytemuck::try_cast_slice(lp).map_err(|_| internal_layout_error())?;
        let (root_tokens, ints) = ints.split_at_mut(root / 8);
        let (prefix_lens, ints) = ints.split_at_mut(pre / 8);
        let (topk_tokens, ints) = ints.split_at_mut(tt / 8);
        let (tokens, ints) = ints.split_at_mut(tok / 8);
        let (parent_index, ints) = ints.split_at_mut(par / 8);
        let (positions, pool_index) = ints.split_at_mut(pos / 8);
        Ok(Parts {
            root_tokens,
            prefix_lens,
            active,
            topk_tokens,
            topk_logprobs: lp,
            out: StepOut {
                tokens,
                parent_index,
                positions,
                mask,
                mask_stride: self.mask_stride,
            },
            pool_index,
            batch: self.batch,
            topk: self.topk,
        })
    }
}

/// The block is not the one its layout made (an internal error: never handed out).
#[cold]
fn internal_layout_error() -> PyErr {
    PyValueError::new_err("buffers: internal layout error")
}

/// The buffers of one `DynamicTreeBuilder` (its `buffers` attribute), numpy views of one
/// block: write the roots, prefix lengths and the draft's top-k into `root_tokens`,
/// `prefix_lens`, `topk_tokens` / `topk_logprobs`, call `start_in_place` / `expand_in_place`,
/// read the step from `tokens`, `parent_index`, `positions` and `attention_mask`, and after
/// `build_in_place` the trees' pool indices from `pool_index`. Each call overwrites its
/// outputs, as a CUDA-graph runner's static buffers are.
#[pyclass(module = "specsched", name = "DraftBuffers", frozen)]
pub struct PyDraftBuffers {
    pub block: Py<PyArray1<u8>>,
    pub layout: Layout,
    root_tokens: Py<PyAny>,
    prefix_lens: Py<PyAny>,
    topk_tokens: Py<PyAny>,
    topk_logprobs: Py<PyAny>,
    tokens: Py<PyAny>,
    parent_index: Py<PyAny>,
    positions: Py<PyAny>,
    pool_index: Py<PyAny>,
    attention_mask: Py<PyAny>,
    active: Py<PyAny>,
}

impl PyDraftBuffers {
    pub fn new(py: Python<'_>, layout: Layout) -> PyResult<Self> {
        // A failed allocation is numpy's MemoryError (the builder bounds the size).
        let block = zeros::<u8>(py, &[layout.bytes()])?.cast_into::<PyArray1<u8>>()?;
        let mut views = Vec::with_capacity(FIELDS);
        let mut at = 0isize;
        for field in layout.fields() {
            let end = at + field.bytes() as isize;
            let view = block
                .as_any()
                .get_item(PySlice::new(py, at, end, 1))?
                .call_method1("view", (field.dtype,))?
                .call_method1("reshape", (field.shape(),))?;
            views.push(view.unbind());
            at = end;
        }
        let views: [Py<PyAny>; FIELDS] = views
            .try_into()
            .map_err(|_| PyValueError::new_err("buffers: internal layout error"))?;
        let [root_tokens, prefix_lens, topk_tokens, tokens, parent_index, positions, pool_index, topk_logprobs, attention_mask, active] =
            views;
        // Every request runs until the caller says otherwise.
        active.bind(py).call_method1("fill", (true,))?;
        Ok(PyDraftBuffers {
            block: block.unbind(),
            layout,
            root_tokens,
            prefix_lens,
            topk_tokens,
            topk_logprobs,
            tokens,
            parent_index,
            positions,
            pool_index,
            attention_mask,
            active,
        })
    }
}

#[pymethods]
impl PyDraftBuffers {
    /// int64 `[B]`: each request's root (its last committed token), read by `start_in_place`.
    #[getter]
    fn root_tokens(&self, py: Python<'_>) -> Py<PyAny> {
        self.root_tokens.clone_ref(py)
    }
    /// int64 `[B]`: tokens committed before each root (>= 0), read by `start_in_place`.
    #[getter]
    fn prefix_lens(&self, py: Python<'_>) -> Py<PyAny> {
        self.prefix_lens.clone_ref(py)
    }
    /// int64 `[B, K, K]`: the draft's top-k tokens of each frontier slot (`start_in_place`
    /// reads `[:, 0, :]`, the root's).
    #[getter]
    fn topk_tokens(&self, py: Python<'_>) -> Py<PyAny> {
        self.topk_tokens.clone_ref(py)
    }
    /// float32 `[B, K, K]`: their log probabilities (`<= 0`, not NaN).
    #[getter]
    fn topk_logprobs(&self, py: Python<'_>) -> Py<PyAny> {
        self.topk_logprobs.clone_ref(py)
    }
    /// int64 `[B, K]`: the frontier's tokens, the next draft forward's input ids.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> Py<PyAny> {
        self.tokens.clone_ref(py)
    }
    /// int64 `[B, K]`: each frontier node's parent slot in the previous frontier (0 at start).
    #[getter]
    fn parent_index(&self, py: Python<'_>) -> Py<PyAny> {
        self.parent_index.clone_ref(py)
    }
    /// int64 `[B, K]`: prefix length + depth.
    #[getter]
    fn positions(&self, py: Python<'_>) -> Py<PyAny> {
        self.positions.clone_ref(py)
    }
    /// int64 `[B, budget - 1]`: the pool index of each built tree's draft nodes, in node order
    /// (written by `build_in_place`).
    #[getter]
    fn pool_index(&self, py: Python<'_>) -> Py<PyAny> {
        self.pool_index.clone_ref(py)
    }
    /// bool `[B, K, depth·K]`: the draft mask; after level `L` its first `L·K` columns are the
    /// step's `attention_mask` and the rest are False.
    #[getter]
    fn attention_mask(&self, py: Python<'_>) -> Py<PyAny> {
        self.attention_mask.clone_ref(py)
    }
    /// bool `[B]`, True when made: the requests still running, read by `start_in_place`. A
    /// request that is not builds to its root alone (pool row -1) and does not keep the
    /// builder from settling.
    #[getter]
    fn active(&self, py: Python<'_>) -> Py<PyAny> {
        self.active.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        let l = &self.layout;
        format!(
            "DraftBuffers(batch={}, topk={}, mask_columns={})",
            l.batch, l.topk, l.mask_stride
        )
    }
}
