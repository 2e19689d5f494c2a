//! KV-cache plans, in-place compaction of CPU buffers, and paged slot commits.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use specsched_core::kv::{self, Move, RawParts, StridedMut};
use specsched_core::verify::{BatchVerified, Verified};

use crate::convert::{
    bool_vec, data_ptr, int_array1, is_writeable, owned, type_name, with_int_view, IntoPyResult,
    PerRequest,
};
use crate::verify::{PyBatchVerifyResult, PyVerifyResult};

/// A VerifyResult or a BatchVerifyResult argument.
enum AnyResult<'py> {
    One(Bound<'py, PyVerifyResult>),
    Batch(Bound<'py, PyBatchVerifyResult>),
}

impl<'py> AnyResult<'py> {
    fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(r) = obj.cast::<PyVerifyResult>() {
            return Ok(AnyResult::One(r.clone()));
        }
        if let Ok(r) = obj.cast::<PyBatchVerifyResult>() {
            return Ok(AnyResult::Batch(r.clone()));
        }
        Err(PyTypeError::new_err(format!(
            "result: expected a VerifyResult or a BatchVerifyResult, got {}",
            type_name(obj)
        )))
    }
}

/// Per-request prefix lengths of a batch result (an int applies to every request).
fn batch_prefixes(r: &BatchVerified, prefix_lens: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    PerRequest::extract(prefix_lens, "prefix_lens")?.into_vec(r.num_trees())
}

fn single_prefix(prefix_lens: &Bound<'_, PyAny>) -> PyResult<i64> {
    match PerRequest::extract(prefix_lens, "prefix_lens")? {
        PerRequest::All(p) => Ok(p),
        PerRequest::Each(..) => Err(PyTypeError::new_err(
            "prefix_lens: expected an int for a single-tree result, got an array",
        )),
    }
}

/// Per request `(prefix, num_nodes)`: what a cache must hold.
type Extents = Vec<(usize, usize)>;

/// Committed lengths after compaction: an int for one tree, one per request for a batch.
enum Committed {
    One(i64),
    Batch(Vec<i64>),
}

impl Committed {
    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Committed::One(n) => n.into_pyobject(py)?.into_any().unbind(),
            Committed::Batch(v) => {
                let n = v.len();
                owned(py, v, &[n])?.into_any().unbind()
            }
        })
    }
}

/// A compaction plan's inputs, read from Python: the result and its requests' prefix lengths
/// and `active` flags (bool `[B]`, a batch only: the requests that commit; the others move
/// nothing and keep their prefix). [`PlanArgs::plan`] is the core's work, run with the GIL
/// released.
enum PlanArgs<'a> {
    One(&'a Verified, i64),
    Batch(&'a BatchVerified, Vec<i64>, Option<Vec<bool>>),
}

impl<'a> PlanArgs<'a> {
    fn extract(
        result: &'a AnyResult<'_>,
        prefix_lens: &Bound<'_, PyAny>,
        active: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        match result {
            AnyResult::One(_) if active.is_some() => Err(PyValueError::new_err(
                "active: one flag per request of a BatchVerifyResult; a VerifyResult has no rows",
            )),
            AnyResult::One(r) => Ok(PlanArgs::One(&r.get().inner, single_prefix(prefix_lens)?)),
            AnyResult::Batch(r) => {
                let v: &BatchVerified = &r.get().inner;
                let p = batch_prefixes(v, prefix_lens)?;
                let active = active.map(|a| bool_vec(a, "active")).transpose()?;
                Ok(PlanArgs::Batch(v, p, active))
            }
        }
    }

    /// The moves and committed lengths for a cache of `shape` (sequence axis `seq`, batch axis
    /// `batch`), checked to hold every request's prefix and tree.
    fn plan_for_cache(
        &self,
        shape: &[usize],
        seq: usize,
        batch: Option<usize>,
    ) -> specsched_core::Result<(Vec<Move>, Committed)> {
        let (moves, extents, committed) = self.plan()?;
        kv::check_cache_shape(shape, seq, batch, &extents)?;
        Ok((moves, committed))
    }

    /// Moves of the result, the extents of its requests and their committed lengths.
    fn plan(&self) -> specsched_core::Result<(Vec<Move>, Extents, Committed)> {
        match self {
            PlanArgs::One(v, p) => {
                let moves = kv::compaction_plan(v, *p)?;
                let committed = kv::committed_length(v, *p)?;
                Ok((
                    moves,
                    vec![(*p as usize, v.num_nodes)],
                    Committed::One(committed),
                ))
            }
            PlanArgs::Batch(v, p, active) => {
                let active = active.as_deref();
                let moves = kv::batch_compaction_plan(v, p, active)?;
                let extents = (0..v.num_trees())
                    .map(|b| (p[b] as usize, v.offsets[b + 1] - v.offsets[b]))
                    .collect();
                let committed = kv::batch_committed_lengths(v, p, active)?;
                Ok((moves, extents, Committed::Batch(committed)))
            }
        }
    }
}

/// `(src, dst)` int64 for a VerifyResult, `(req, src, dst)` for a batch.
#[pyfunction]
#[pyo3(signature = (result, prefix_lens, active=None))]
pub fn kv_compaction_plan<'py>(
    py: Python<'py>,
    result: &Bound<'py, PyAny>,
    prefix_lens: &Bound<'py, PyAny>,
    active: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let result = AnyResult::extract(result)?;
    let args = PlanArgs::extract(&result, prefix_lens, active)?;
    let (moves, _, _) = py.detach(|| args.plan()).py()?;
    let n = moves.len();
    let src = owned(py, moves.iter().map(|m| m.src as i64).collect(), &[n])?;
    let dst = owned(py, moves.iter().map(|m| m.dst as i64).collect(), &[n])?;
    match result {
        AnyResult::One(_) => PyTuple::new(py, [src, dst]),
        AnyResult::Batch(_) => {
            let req = owned(py, moves.iter().map(|m| m.req as i64).collect(), &[n])?;
            PyTuple::new(py, [req, src, dst])
        }
    }
}

fn normalize_dim(arg: &str, dim: isize, ndim: usize) -> PyResult<usize> {
    let d = if dim < 0 { dim + ndim as isize } else { dim };
    if d < 0 || d >= ndim as isize {
        return Err(PyValueError::new_err(format!(
            "{arg}: {dim} is out of range for a cache with {ndim} dimensions"
        )));
    }
    Ok(d as usize)
}

/// Sequence and batch axes, normalised; a batch result defaults to batch axis 0.
fn axes(
    result: &AnyResult<'_>,
    ndim: usize,
    seq_dim: isize,
    batch_dim: Option<isize>,
) -> PyResult<(usize, Option<usize>)> {
    let seq = normalize_dim("seq_dim", seq_dim, ndim)?;
    let batch = match (result, batch_dim) {
        (AnyResult::One(_), None) => None,
        (AnyResult::One(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "batch_dim: only applies to a BatchVerifyResult",
            ))
        }
        (AnyResult::Batch(_), d) => Some(normalize_dim("batch_dim", d.unwrap_or(0), ndim)?),
    };
    Ok((seq, batch))
}

/// Applies the compaction plan in place on a numpy buffer of any dtype and strides, or on each
/// buffer of a list or tuple of them (one shape: a cache's layers, or its keys and values);
/// returns the committed lengths (an int, or int64 `[B]`).
#[pyfunction]
#[pyo3(signature = (cache, result, prefix_lens, seq_dim, batch_dim=None, active=None))]
pub fn compact_kv(
    py: Python<'_>,
    cache: &Bound<'_, PyAny>,
    result: &Bound<'_, PyAny>,
    prefix_lens: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = crate::convert::seq_dim_arg)] seq_dim: isize,
    #[pyo3(from_py_with = crate::convert::batch_dim_arg)] batch_dim: Option<isize>,
    active: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let (parts, arrays) = match cache.cast::<PyUntypedArray>() {
        Ok(arr) => (vec![host_buffer(arr, None)?], vec![arr.clone()]),
        Err(_) if cache.is_instance_of::<PyList>() || cache.is_instance_of::<PyTuple>() => {
            host_buffers(cache)?
        }
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "cache: expected a numpy array, or a list or tuple of them, got {}",
                type_name(cache)
            )))
        }
    };
    let result = AnyResult::extract(result)?;
    let shape = parts[0].shape.clone();
    let (seq, batch) = axes(&result, shape.len(), seq_dim, batch_dim)?;
    let args = PlanArgs::extract(&result, prefix_lens, active)?;
    let listed = !cache.is_instance_of::<PyUntypedArray>();
    check_self_overlap(
        parts
            .iter()
            .map(|p| (&p.shape[..], &p.strides[..], p.itemsize)),
        listed,
    )?;
    // SAFETY: each description comes from a live, writeable numpy array that this call holds a
    // reference to for its whole duration; numpy guarantees every in-shape index addresses its
    // allocation, and `new_disjoint` refuses buffers that may share memory. `_borrows` holds
    // each buffer's write borrow in rust-numpy's registry until the moves are done, so another
    // specsched call on a view of the same memory is refused rather than racing them (for
    // the dtypes rust-numpy has types for; like any in-place numpy operation, plain numpy
    // code in another thread must not use the buffers meanwhile).
    let mut bufs = unsafe { StridedMut::new_disjoint(parts) }.py()?;
    let _borrows = arrays
        .iter()
        .enumerate()
        .map(|(i, a)| write_borrow(a, listed.then_some(i)))
        .collect::<PyResult<Vec<_>>>()?;
    // The plan, the cache's shape check and the moves in one release of the GIL.
    let committed = py
        .detach(|| -> specsched_core::Result<Committed> {
            let (moves, committed) = args.plan_for_cache(&shape, seq, batch)?;
            kv::apply_all(&mut bufs, seq, batch, &moves)?;
            Ok(committed)
        })
        .py()?;
    committed.into_py(py)
}

/// The name of the cache argument in messages: `cache`, or `cache[i]` for entry `i` of a list.
fn cache_arg(index: Option<usize>) -> String {
    index.map_or_else(|| "cache".to_owned(), |i| format!("cache[{i}]"))
}

/// A write borrow in rust-numpy's registry, of whatever element type: held, never read.
trait WriteBorrow {}
impl<T: numpy::Element, D: ndarray::Dimension> WriteBorrow for numpy::PyReadwriteArray<'_, T, D> {}

/// `arr`'s write borrow in rust-numpy's registry, taken through the element type of its dtype
/// (the registry is what makes a concurrent specsched call on a view of the same memory a
/// refusal); None for a dtype rust-numpy has no type for (datetime, void, ...).
fn write_borrow<'py>(
    arr: &Bound<'py, PyUntypedArray>,
    index: Option<usize>,
) -> PyResult<Option<Box<dyn WriteBorrow + 'py>>> {
    use numpy::{Complex32, Complex64, PyArrayDyn, PyArrayMethods};
    macro_rules! first_match {
        ($($t:ty),*) => {$(
            if let Ok(typed) = arr.cast::<PyArrayDyn<$t>>() {
                let borrow = typed.try_readwrite().map_err(|e| {
                    PyValueError::new_err(format!("{}: cannot be written: {e}", cache_arg(index)))
                })?;
                return Ok(Some(Box::new(borrow)));
            }
        )*};
    }
    // Caches first (bfloat16 and float8 arrive as int16 / int8 views of torch tensors).
    first_match!(
        f32,
        half::f16,
        i16,
        f64,
        i8,
        u8,
        u16,
        bool,
        i32,
        u32,
        i64,
        u64,
        Complex32,
        Complex64
    );
    Ok(None)
}

/// The raw parts of a cache buffer (entry `index` of a list, or the one buffer), refused if
/// compaction cannot write it in place.
fn host_buffer(arr: &Bound<'_, PyUntypedArray>, index: Option<usize>) -> PyResult<RawParts> {
    if !is_writeable(arr) {
        return Err(PyValueError::new_err(format!(
            "{}: is read-only; compaction writes in place",
            cache_arg(index)
        )));
    }
    if arr.dtype().has_object() {
        // Moving object pointers as raw bytes would skip their reference counts.
        return Err(PyTypeError::new_err(format!(
            "{}: dtype {} holds Python objects; only plain-data caches can be compacted",
            cache_arg(index),
            arr.dtype()
        )));
    }
    Ok(RawParts {
        ptr: data_ptr(arr),
        shape: arr.shape().to_vec(),
        strides: arr.strides().to_vec(),
        itemsize: arr.dtype().itemsize(),
    })
}

/// The buffers of a list or tuple `cache`, each checked as one cache and of the first's shape,
/// with the arrays (whose write borrows are taken once every check has passed).
type Buffers<'py> = (Vec<RawParts>, Vec<Bound<'py, PyUntypedArray>>);
fn host_buffers<'py>(cache: &Bound<'py, PyAny>) -> PyResult<Buffers<'py>> {
    let (mut parts, mut arrays) = (Vec::new(), Vec::new());
    for (i, item) in cache.try_iter()?.enumerate() {
        let arr = item?.cast_into::<PyUntypedArray>().map_err(|e| {
            PyTypeError::new_err(format!(
                "{}: expected a numpy array, got {}",
                cache_arg(Some(i)),
                type_name(e.into_inner().as_any())
            ))
        })?;
        parts.push(host_buffer(&arr, Some(i))?);
        arrays.push(arr);
    }
    same_shape(parts.iter().map(|p| p.shape.as_slice()))?;
    Ok((parts, arrays))
}

/// Refuses an empty list of caches, or caches of different shapes (one plan, one shape).
fn same_shape<'a>(mut shapes: impl Iterator<Item = &'a [usize]>) -> PyResult<()> {
    let first = shapes.next().ok_or_else(|| {
        PyValueError::new_err("cache: an empty sequence; pass at least one buffer")
    })?;
    for (i, shape) in shapes.enumerate() {
        if shape != first {
            return Err(PyValueError::new_err(format!(
                "cache[{}]: shape {shape:?} differs from cache[0]'s {first:?}; the buffers of one call share a shape",
                i + 1
            )));
        }
    }
    Ok(())
}

/// The checks `compact_kv` makes of host buffers, for buffers held elsewhere (device tensors)
/// described as `(address, shape, byte strides, itemsize)`: at least one, one shape, none whose
/// indices share memory (a broadcast), no two that may share memory. `listed`: the buffers came
/// as a list (messages name `cache[i]`), else as the one `cache`.
#[pyfunction]
#[pyo3(signature = (buffers, listed=true))]
pub fn check_cache_buffers(
    buffers: Vec<(usize, Vec<usize>, Vec<isize>, usize)>,
    listed: bool,
) -> PyResult<()> {
    same_shape(buffers.iter().map(|b| b.1.as_slice()))?;
    if let Some(i) = buffers.iter().position(|b| b.1.len() != b.2.len()) {
        return Err(PyValueError::new_err(format!(
            "{}: {} axes but {} strides",
            cache_arg(listed.then_some(i)),
            buffers[i].1.len(),
            buffers[i].2.len()
        )));
    }
    // Before any move: the device path writes each buffer in turn, so a broadcast one found
    // by the device would come after the others were compacted.
    check_self_overlap(buffers.iter().map(|b| (&b.1[..], &b.2[..], b.3)), listed)?;
    // Descriptions only: nothing is read or written through these pointers.
    let parts: Vec<RawParts> = buffers
        .into_iter()
        .map(|(addr, shape, strides, itemsize)| RawParts {
            ptr: addr as *mut u8,
            shape,
            strides,
            itemsize,
        })
        .collect();
    kv::check_disjoint(&parts).py()
}

/// Refuses a buffer in which two indices share memory (a broadcast or self-overlapping view),
/// named `cache[i]` when the cache is a list: the core's handles refuse one too, but can only
/// name `cache`.
fn check_self_overlap<'a>(
    buffers: impl Iterator<Item = (&'a [usize], &'a [isize], usize)>,
    listed: bool,
) -> PyResult<()> {
    for (i, (shape, strides, itemsize)) in buffers.enumerate() {
        if kv::is_self_overlapping(shape, strides, itemsize) {
            let arg = cache_arg(listed.then_some(i));
            return Err(PyValueError::new_err(format!(
                "{arg}: {}",
                kv::SELF_OVERLAP
            )));
        }
    }
    Ok(())
}

/// The moves of `compact_kv` for a cache of `cache_shape` held elsewhere (a CUDA tensor),
/// checked exactly as `compact_kv` checks a host buffer: `(req, src, dst, seq_dim, batch_dim,
/// committed)` with normalised axes (`batch_dim` is -1 for a single-tree result) and the
/// committed lengths `compact_kv` returns.
#[pyfunction]
#[pyo3(signature = (cache_shape, result, prefix_lens, seq_dim, batch_dim=None, active=None))]
pub fn cache_moves<'py>(
    py: Python<'py>,
    cache_shape: Vec<usize>,
    result: &Bound<'py, PyAny>,
    prefix_lens: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::convert::seq_dim_arg)] seq_dim: isize,
    #[pyo3(from_py_with = crate::convert::batch_dim_arg)] batch_dim: Option<isize>,
    active: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let result = AnyResult::extract(result)?;
    let (seq, batch) = axes(&result, cache_shape.len(), seq_dim, batch_dim)?;
    let args = PlanArgs::extract(&result, prefix_lens, active)?;
    let (moves, committed) = py
        .detach(|| args.plan_for_cache(&cache_shape, seq, batch))
        .py()?;
    let n = moves.len();
    let req = owned(py, moves.iter().map(|m| m.req as i64).collect(), &[n])?;
    let src = owned(py, moves.iter().map(|m| m.src as i64).collect(), &[n])?;
    let dst = owned(py, moves.iter().map(|m| m.dst as i64).collect(), &[n])?;
    let batch = batch.map_or(-1, |b| b as isize);
    (req, src, dst, seq, batch, committed.into_py(py)?).into_pyobject(py)
}

/// Paged caches: `(kept, freed)` slot ids.
#[pyfunction]
pub fn commit_slots<'py>(
    py: Python<'py>,
    slots: &Bound<'py, PyAny>,
    result: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let result = AnyResult::extract(result)?;
    let arr = int_array1(slots, "slots", false)?;
    match result {
        AnyResult::One(r) => {
            let inner = &r.get().inner;
            let (kept, freed) =
                with_int_view!(arr, v => py.detach(|| kv::commit_slots(v, inner))).py()?;
            let (k, f) = (kept.len(), freed.len());
            PyTuple::new(py, [owned(py, kept, &[k])?, owned(py, freed, &[f])?])
        }
        AnyResult::Batch(r) => {
            let inner = &r.get().inner;
            let (kept, freed) =
                with_int_view!(arr, v => py.detach(|| kv::batch_commit_slots(v, inner))).py()?;
            let f = freed.len();
            PyTuple::new(
                py,
                [
                    owned(py, kept, &[inner.num_trees(), inner.width])?,
                    owned(py, freed, &[f])?,
                ],
            )
        }
    }
}
