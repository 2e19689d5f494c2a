//! Conversions between Python objects and core inputs/outputs: dtype dispatch with messages a
//! Python user can act on, read-only views over Rust-owned arrays, and output buffers.

use ndarray::{ArrayView, Dimension};
use numpy::npyffi::flags::{NPY_ARRAY_ALIGNED, NPY_ARRAY_WRITEABLE};
use numpy::npyffi::{npy_intp, PY_ARRAY_API};
use numpy::{
    Element, PyArray, PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArray1,
    PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use specsched_core::{Error, IndexLike};

/// Maps a core error to the Python exception of the same meaning.
pub fn to_pyerr(e: Error) -> PyErr {
    match e {
        Error::Value { .. } => PyValueError::new_err(e.to_string()),
        Error::Index { .. } => PyIndexError::new_err(e.to_string()),
        Error::Type { .. } => PyTypeError::new_err(e.to_string()),
    }
}

pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for specsched_core::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_pyerr)
    }
}

/// `obj` as a numpy array: arrays as they are, anything else (lists, torch CPU tensors)
/// through `numpy.asarray`, which shares memory whenever it can.
pub fn as_ndarray<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if element_strided(a) {
            return Ok(a.clone());
        }
        let np = numpy::get_array_module(obj.py())?;
        // A field of a packed record array: its strides are not whole elements (or its data is
        // unaligned), which no typed view can express. Such inputs are rare and small here
        // (index arrays) or legitimately copied (a packed logits record); read a copy.
        let copy = np.call_method1("ascontiguousarray", (a,))?;
        return Ok(copy.cast_into::<PyUntypedArray>()?);
    }
    // Looked up only here: the import costs more than the common case above.
    let np = numpy::get_array_module(obj.py())?;
    // An empty list has no element type; numpy would call it float64 and the user would get a
    // dtype error for what is really an empty input.
    if obj.len().ok() == Some(0) && !obj.hasattr("dtype")? {
        let empty = np.call_method1("asarray", (obj, "int64"))?;
        return Ok(empty.cast_into::<PyUntypedArray>()?);
    }
    let tensor = torch_for_numpy(obj, arg)?;
    let obj = tensor.as_ref().unwrap_or(obj);
    let converted = np.call_method1("asarray", (obj,)).map_err(|e| {
        // numpy's own refusals (a ragged list, a value no dtype holds) are a wrong input;
        // anything else (an interrupt, a MemoryError, an object's own `__array__` failing,
        // a concurrent call on an object it reads) is passed on as it came.
        let py = obj.py();
        if !(e.is_instance_of::<PyTypeError>(py) || e.is_instance_of::<PyValueError>(py)) {
            return e;
        }
        let named = PyTypeError::new_err(format!(
            "{arg}: expected an array, got {}: {e}",
            type_name(obj)
        ));
        named.set_cause(py, Some(e));
        named
    })?;
    let converted = converted.cast_into::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!("{arg}: expected an array, got {}", type_name(obj)))
    })?;
    let converted = match &tensor {
        Some(t) => keyed_by_storage(&converted, t)?,
        None => converted,
    };
    let kind = converted.dtype().kind();
    if matches!(kind, b'f' | b'O' | b'u') {
        // numpy makes [1, 2**63] float64 (bits lost) and [2**64] an object array: an int the
        // indices cannot hold, named, rather than "expected an integer array, got float64".
        if let Some((i, x)) = first_wide_int(obj)? {
            return Err(PyValueError::new_err(format!(
                "{arg}[{i}]: {x} does not fit in int64"
            )));
        }
    }
    if matches!(kind, b'O' | b'S' | b'U' | b'V') {
        // None, a generator, bytes or a string: numpy wraps them as a 0-d object or text
        // array, which would be refused for its shape; it is the wrong type.
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected an array of numbers, got {}",
            type_name(obj)
        )));
    }
    if matches!(kind, b'i' | b'u') {
        // numpy reads True / False among ints as 1 / 0: a bool is not an index or a count
        // (and an all-bool list stays a bool array, for the arguments that take one).
        if let Some(at) = first_bool(obj)? {
            return Err(PyTypeError::new_err(format!(
                "{arg}{at}: a bool among ints (numpy would read it as an int); give ints"
            )));
        }
    }
    Ok(converted)
}

/// The first Python int of a flat list or tuple that does not fit in int64.
fn first_wide_int<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<(usize, Bound<'py, PyAny>)>> {
    if !is_sequence_literal(obj) {
        return Ok(None);
    }
    for (i, x) in obj.try_iter()?.enumerate() {
        let x = x?;
        if x.is_instance_of::<pyo3::types::PyInt>() && x.extract::<i64>().is_err() {
            return Ok(Some((i, x)));
        }
    }
    Ok(None)
}

fn is_sequence_literal(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<pyo3::types::PyList>() || obj.is_instance_of::<pyo3::types::PyTuple>()
}

/// Where the first Python bool sits in nested lists / tuples (`"[i][j]"`), if any.
fn first_bool(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if !is_sequence_literal(obj) {
        return Ok(None);
    }
    for (i, x) in obj.try_iter()?.enumerate() {
        let x = x?;
        if x.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(Some(format!("[{i}]")));
        }
        if let Some(inner) = first_bool(&x)? {
            return Ok(Some(format!("[{i}]{inner}")));
        }
    }
    Ok(None)
}

/// A torch tensor numpy can read: detached when it requires grad (same storage), copied to
/// the host from another device (the arrays read this way are indices, lengths and scores;
/// large device inputs, the logits and caches, have their own device paths). A tensor on
/// the meta device is a ValueError naming `arg`. None for anything else, which numpy
/// converts as it is.
fn torch_for_numpy<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    let Ok(requires_grad) = obj.getattr(pyo3::intern!(py, "requires_grad")) else {
        return Ok(None);
    };
    let mut tensor = if requires_grad.is_truthy()? {
        obj.call_method0(pyo3::intern!(py, "detach"))?
    } else {
        obj.clone()
    };
    if let Ok(device) = tensor.getattr(pyo3::intern!(py, "device")) {
        let kind = device.getattr(pyo3::intern!(py, "type"))?;
        let kind = kind.str()?;
        match kind.to_str()? {
            "cpu" => {}
            "meta" => {
                return Err(PyValueError::new_err(format!(
                    "{arg}: a tensor on the meta device holds no data"
                )))
            }
            _ => tensor = tensor.call_method0(pyo3::intern!(py, "cpu"))?,
        }
    }
    Ok(Some(tensor))
}

/// `view` (a numpy view of torch CPU tensor `tensor`'s memory) re-based on the tensor's
/// storage object. rust-numpy's borrow registry tells buffers apart by the first base of a
/// view that is not an array: for `tensor.numpy()` that is the tensor object, a new one for
/// every `detach()` or slice, so two specsched calls on one tensor (a verify of logits that a
/// compaction moves, two compactions of one cache) would never see each other and would race.
/// torch keeps one Python object per storage for as long as the storage lives, shared by all
/// its tensors, views and dtype reinterpretations: keyed by it, such calls overlap in the
/// registry and the second is refused. A view that shares nothing with `tensor`'s storage is
/// returned as it is.
pub fn keyed_by_storage<'py>(
    view: &Bound<'py, PyUntypedArray>,
    tensor: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = view.py();
    let storage = tensor.call_method0(pyo3::intern!(py, "untyped_storage"))?;
    let start: usize = storage
        .call_method0(pyo3::intern!(py, "data_ptr"))?
        .extract()?;
    let bytes: usize = storage
        .call_method0(pyo3::intern!(py, "nbytes"))?
        .extract()?;
    let data = data_ptr(view) as usize;
    if bytes == 0 || data < start || data >= start.saturating_add(bytes) {
        // An empty storage holds nothing to race over; a copy (numpy could not view the
        // tensor) is its own buffer already.
        return Ok(view.clone());
    }
    let mut dims: Vec<npy_intp> = view.shape().iter().map(|&d| d as npy_intp).collect();
    let mut strides: Vec<npy_intp> = view.strides().to_vec();
    let flags = if is_writeable(view) {
        NPY_ARRAY_WRITEABLE
    } else {
        0
    };
    // SAFETY: `view` is a live array; the new one describes exactly its memory (same dtype,
    // dimensions, strides and data pointer, which NewFromDescr only reads), its dtype reference
    // is a new one handed over (NewFromDescr steals it), its type `view`'s own, and its base, set before the array is
    // returned, is `storage`, which owns that memory: the array keeps it alive. SetBaseObject
    // steals the storage reference we hand it; a null or nonzero result means a Python error
    // is set.
    unsafe {
        let descr = (*view.as_array_ptr()).fields.descr;
        pyo3::ffi::Py_INCREF(descr.cast());
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            pyo3::ffi::Py_TYPE(view.as_ptr()),
            descr,
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
            data_ptr(view).cast(),
            flags,
            std::ptr::null_mut(),
        );
        let array = Bound::from_owned_ptr_or_err(py, ptr)?;
        if PY_ARRAY_API.PyArray_SetBaseObject(py, ptr.cast(), storage.into_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(array.cast_into_unchecked())
    }
}

/// The same as `keyed_by_storage`, for the Python layer's own conversions of CPU tensors
/// (`specsched._torch`): `view` is `tensor.numpy()` or a view of it.
#[pyfunction]
pub fn key_by_storage<'py>(
    view: &Bound<'py, PyUntypedArray>,
    tensor: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    keyed_by_storage(view, tensor)
}

/// A bfloat16 torch tensor widened to float32, for the arguments read as floats (numpy has
/// no bfloat16; the arrays read this way, top-k scores, are small); `obj` itself otherwise,
/// so an integer argument given bfloat16 is refused naming bfloat16.
pub fn widen_bfloat16<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    if obj.cast::<PyUntypedArray>().is_ok() {
        return Ok(obj.clone());
    }
    if let Ok(dtype) = obj.getattr(pyo3::intern!(py, "dtype")) {
        if dtype.str()?.to_str()? == "torch.bfloat16" {
            return obj.call_method0(pyo3::intern!(py, "float"));
        }
    }
    Ok(obj.clone())
}

/// Aligned, with every stride a whole number of elements: what a typed view can address.
fn element_strided(a: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: reading the flags of a live PyArrayObject.
    let aligned = unsafe { (*a.as_array_ptr()).fields.flags & NPY_ARRAY_ALIGNED != 0 };
    let item = a.dtype().itemsize() as isize;
    aligned && item > 0 && a.strides().iter().all(|s| s % item == 0)
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_owned())
}

fn dtype_str(a: &Bound<'_, PyUntypedArray>) -> String {
    a.dtype().to_string()
}

pub fn check_ndim(a: &Bound<'_, PyUntypedArray>, arg: &str, ndim: usize) -> PyResult<()> {
    if a.ndim() != ndim {
        return Err(PyValueError::new_err(format!(
            "{arg}: expected a {ndim}-D array, got {}-D with shape {:?}",
            a.ndim(),
            a.shape()
        )));
    }
    Ok(())
}

/// A 1-D integer array borrowed read-only, in one of the accepted element types.
pub enum IntArray1<'py> {
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
    U32(PyReadonlyArray1<'py, u32>),
}

/// Runs `$body` with `$v` bound to the `ArrayView1` of whichever integer type `$arr` holds.
macro_rules! with_int_view {
    ($arr:expr, $v:ident => $body:expr) => {
        match &$arr {
            $crate::convert::IntArray1::I32(a) => {
                let $v = a.as_array();
                $body
            }
            $crate::convert::IntArray1::I64(a) => {
                let $v = a.as_array();
                $body
            }
            $crate::convert::IntArray1::U32(a) => {
                let $v = a.as_array();
                $body
            }
        }
    };
}
pub(crate) use with_int_view;

fn readonly<'py, T: Element>(
    a: &Bound<'py, PyUntypedArray>,
    arg: &str,
) -> PyResult<PyReadonlyArray1<'py, T>> {
    let typed = a
        .cast::<PyArray<T, ndarray::Ix1>>()
        .map_err(|_| PyTypeError::new_err(format!("{arg}: unexpected dtype {}", dtype_str(a))))?;
    typed
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("{arg}: cannot be read: {e}")))
}

/// A 1-D bool array of any strides, borrowed (read its bytes with [`bool_vec`]).
fn bool_array1<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<PyReadonlyArray1<'py, bool>> {
    let a = as_ndarray(obj, arg)?;
    check_ndim(&a, arg, 1)?;
    let typed = a.cast::<PyArray1<bool>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{arg}: expected a bool array, got {}",
            dtype_str(&a)
        ))
    })?;
    typed
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("{arg}: cannot be read: {e}")))
}

/// A 1-D bool array's values, each byte read as `!= 0`. numpy lets any byte sit in a bool
/// array (`np.array([2], np.uint8).view(bool)`), which a Rust `bool` must never hold, so the
/// bytes are read as `u8`.
pub fn bool_vec(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<bool>> {
    let borrowed = bool_array1(obj, arg)?;
    check_batch_len(borrowed.len(), arg)?;
    let raw = borrowed.as_array().raw_view();
    // SAFETY: `u8` has the size and alignment of `bool` and every bit pattern is a valid
    // `u8`, so the bytes are read as what they are; the view lives while `borrowed` holds
    // the array's read borrow.
    let bytes = unsafe { raw.cast::<u8>().deref_into_view() };
    Ok(bytes.iter().map(|&b| b != 0).collect())
}

/// Refuses a per-request or per-node array (`active`, `keep`, `nan_rows`) longer than any
/// batch, before its entries are copied: a broadcast view can claim any length at no cost,
/// and copying 2^40 entries aborted the process. The callee checks the exact count.
pub fn check_batch_len(len: usize, arg: &str) -> PyResult<()> {
    let max = specsched_core::tree::MAX_BATCH_NODES;
    if len > max {
        return Err(PyValueError::new_err(format!(
            "{arg}: has {len} entries, more than a batch holds ({max} nodes)"
        )));
    }
    Ok(())
}

/// `values` collected into a vector reserved fallibly: a failed allocation is a MemoryError
/// naming `arg`, not an abort of the process.
pub fn try_collect<T>(len: usize, values: impl Iterator<Item = T>, arg: &str) -> PyResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        pyo3::exceptions::PyMemoryError::new_err(format!(
            "{arg}: {len} entries do not fit in memory"
        ))
    })?;
    v.extend(values);
    Ok(v)
}

/// Extracts a 1-D int32/int64 (and uint32 when `allow_u32`) array of any strides.
pub fn int_array1<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    allow_u32: bool,
) -> PyResult<IntArray1<'py>> {
    let a = as_ndarray(obj, arg)?;
    check_ndim(&a, arg, 1)?;
    let dt = a.dtype();
    let native = dt.is_native_byteorder().unwrap_or(true);
    let (kind, size) = (dt.kind(), dt.itemsize());
    let accepted = if allow_u32 {
        "int32, int64 or uint32"
    } else {
        "int32 or int64"
    };
    if !native {
        return Err(PyTypeError::new_err(format!(
            "{arg}: non-native byte order ({}) is not supported; convert with \
             arr.astype(arr.dtype.newbyteorder('='))",
            dtype_str(&a)
        )));
    }
    match (kind, size) {
        (b'i', 4) => Ok(IntArray1::I32(readonly(&a, arg)?)),
        (b'i', 8) => Ok(IntArray1::I64(readonly(&a, arg)?)),
        (b'u', 4) if allow_u32 => Ok(IntArray1::U32(readonly(&a, arg)?)),
        _ => Err(PyTypeError::new_err(format!(
            "{arg}: expected an integer array of dtype {accepted}, got {}",
            dtype_str(&a)
        ))),
    }
}

/// A per-request integer argument (`prefix_lens`, `max_depth`, `budgets`): an int for every
/// request (not a bool), or an int32 / int64 / uint32 array `[B]`, held as the caller's array
/// until the number of requests is known: a broadcast view can claim any length, and its
/// entries are copied only once that length is checked.
pub enum PerRequest<'py> {
    All(i64),
    Each(IntArray1<'py>, &'static str),
}

/// A numpy array of one or more dimensions (no conversion tried).
fn is_array(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<PyUntypedArray>().is_ok_and(|a| a.ndim() > 0)
}

/// `obj` as one int64 when it is one (a Python or numpy int, a 0-d int array or tensor, a
/// bool), else None. An array of one or more dimensions is None without trying it as an int:
/// numpy would raise (and format) a TypeError, which costs µs on every call right after a
/// model forward, where a decode loop passes its lengths. Nor is any other object with
/// dimensions one int, even when it holds one value: a one-element torch tensor has
/// `__index__`, and a stale `seq_lens[:1]` would have been spread over every request.
pub fn scalar_int(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return obj.extract::<i64>().ok();
    }
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return if a.ndim() == 0 {
            obj.extract::<i64>().ok()
        } else {
            None
        };
    }
    if let Ok(ndim) = obj.getattr(pyo3::intern!(obj.py(), "ndim")) {
        // A bool tensor indexes as 0 or 1, but is a flag, not a count (as a bool is).
        if ndim.extract::<usize>().ok() != Some(0) || is_bool_tensor(obj) {
            return None;
        }
    }
    obj.extract::<i64>().ok()
}

/// Whether `obj` is a torch bool tensor (its `__index__` reads it as 0 or 1; numpy's bools
/// refuse to index). Asked of objects that are neither Python ints nor numpy arrays only.
fn is_bool_tensor(obj: &Bound<'_, PyAny>) -> bool {
    obj.getattr(pyo3::intern!(obj.py(), "dtype"))
        .and_then(|d| d.str().map(|s| s.to_string()))
        .is_ok_and(|s| s == "torch.bool")
}

/// A dimensionless integer (a numpy scalar such as `np.uint64(2**63)`) past int64: an int
/// out of range, not a wrong type.
fn is_wide_int_scalar(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    let dimensionless = obj
        .getattr(pyo3::intern!(py, "ndim"))
        .is_ok_and(|n| n.extract::<usize>().ok() == Some(0));
    dimensionless
        && !obj.is_instance_of::<pyo3::types::PyBool>()
        && obj
            .call_method0(pyo3::intern!(py, "__index__"))
            .is_ok_and(|i| i.extract::<i64>().is_err())
}

impl<'py> PerRequest<'py> {
    pub fn extract(obj: &Bound<'py, PyAny>, arg: &'static str) -> PyResult<PerRequest<'py>> {
        if obj.is_instance_of::<pyo3::types::PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "{arg}: expected an int or a 1-D int array, got bool"
            )));
        }
        if let Some(p) = scalar_int(obj) {
            return Ok(PerRequest::All(p));
        }
        if obj.is_instance_of::<pyo3::types::PyInt>() || is_wide_int_scalar(obj) {
            return Err(PyValueError::new_err(format!(
                "{arg}: {obj} does not fit in int64"
            )));
        }
        if !is_array(obj) && as_ndarray(obj, arg)?.ndim() == 0 {
            return Err(PyTypeError::new_err(format!(
                "{arg}: expected an int or a 1-D int array, got {}",
                type_name(obj)
            )));
        }
        // uint32 too: lengths need no sign, and every uint32 fits the int64 they become.
        Ok(PerRequest::Each(int_array1(obj, arg, true)?, arg))
    }

    /// One value per tree of `num_trees`; an array of another length is refused before
    /// any entry is read.
    pub fn into_vec(self, num_trees: usize) -> PyResult<Vec<i64>> {
        self.into_vec_of(num_trees, "tree")
    }

    /// One value per `what` of `count` (in messages: "expected one per {what}").
    pub fn into_vec_of(self, count: usize, what: &str) -> PyResult<Vec<i64>> {
        match self {
            PerRequest::All(p) => Ok(vec![p; count]),
            PerRequest::Each(arr, arg) => {
                let len = with_int_view!(arr, v => v.len());
                if len != count {
                    return Err(PyValueError::new_err(format!(
                        "{arg}: has {len} entries, expected one per {what} ({count})"
                    )));
                }
                Ok(with_int_view!(arr, v => v.iter().map(|&x| x.to_i64()).collect()))
            }
        }
    }
}

/// A read-only numpy view of data owned by the frozen Python object `owner`.
pub fn readonly_view<'py, T: Element, D: Dimension>(
    owner: &Bound<'py, PyAny>,
    view: ArrayView<'_, T, D>,
) -> Bound<'py, PyArray<T, D>> {
    // SAFETY: `view` borrows from the Rust value inside `owner`, a frozen pyclass whose data is
    // never mutated or moved after construction; the new array holds a reference to `owner`
    // (its base), so the memory outlives the array. The array is made read-only below, so
    // Python cannot write into Rust-owned memory.
    let arr = unsafe { PyArray::borrow_from_array(&view, owner.clone()) };
    set_readonly(arr.as_untyped());
    arr
}

/// Clears numpy's WRITEABLE flag.
pub fn set_readonly(a: &Bound<'_, PyUntypedArray>) {
    // SAFETY: the pointer is a live PyArrayObject (we hold a reference); clearing a flag bit is
    // how numpy itself makes an array read-only.
    unsafe {
        (*a.as_array_ptr()).fields.flags &= !NPY_ARRAY_WRITEABLE;
    }
}

/// The array's data pointer.
pub fn data_ptr(a: &Bound<'_, PyUntypedArray>) -> *mut u8 {
    // SAFETY: reading a field of a live PyArrayObject.
    unsafe { (*a.as_array_ptr()).fields.data as *mut u8 }
}

/// The message for an output whose data is not aligned to its element type.
pub const MISALIGNED: &str = "{arg}: its data is not aligned to its element size (a view at an \
     odd byte offset): outputs are written in place, so pass an aligned array";

pub fn is_aligned(a: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: reading the flags of a live PyArrayObject.
    unsafe { (*a.as_array_ptr()).fields.flags & NPY_ARRAY_ALIGNED != 0 }
}

pub fn is_writeable(a: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: reading the flags of a live PyArrayObject.
    unsafe { (*a.as_array_ptr()).fields.flags & NPY_ARRAY_WRITEABLE != 0 }
}

/// The output array of a layout: the caller's `out` (checked: exact dtype and shape,
/// C-contiguous, writeable) or a fresh zeroed array.
pub fn output<'py, T: Element>(
    py: Python<'py>,
    out: Option<&Bound<'py, PyAny>>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let Some(out) = out else {
        return zeros(py, shape);
    };
    let want = numpy::dtype::<T>(py);
    let arr = out.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "out: expected a numpy array, got {}",
            type_name(out)
        ))
    })?;
    if !arr.dtype().is_equiv_to(&want) {
        return Err(PyTypeError::new_err(format!(
            "out: expected dtype {want}, got {}",
            arr.dtype()
        )));
    }
    if arr.shape() != shape {
        return Err(PyValueError::new_err(format!(
            "out: expected shape {shape:?}, got {:?}",
            arr.shape()
        )));
    }
    if !arr.is_c_contiguous() {
        return Err(PyValueError::new_err("out: must be C-contiguous"));
    }
    if !is_aligned(arr) {
        return Err(PyValueError::new_err(MISALIGNED.replace("{arg}", "out")));
    }
    if !is_writeable(arr) {
        return Err(PyValueError::new_err("out: is read-only"));
    }
    Ok(arr.cast::<PyArrayDyn<T>>()?.clone())
}

/// A fresh zeroed C-ordered array; an allocation numpy refuses is its `MemoryError`, not a
/// panic (numpy's `zeros` wrapper would unwrap the null pointer).
pub fn zeros<'py, T: Element>(
    py: Python<'py>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let mut dims: Vec<npy_intp> = Vec::with_capacity(shape.len());
    for &d in shape {
        dims.push(
            npy_intp::try_from(d).map_err(|_| {
                PyValueError::new_err(format!("output shape {shape:?} is too large"))
            })?,
        );
    }
    // SAFETY: PyArray_Zeros reads `dims.len()` dimensions from a live buffer and steals the
    // dtype reference we hand it; a null result means a Python error is set.
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_Zeros(
            py,
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            T::get_dtype(py).into_dtype_ptr(),
            0,
        );
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

/// Mutable access to a fresh or checked output array.
pub fn writer<'py, T: Element>(
    arr: &Bound<'py, PyArrayDyn<T>>,
) -> PyResult<PyReadwriteArrayDyn<'py, T>> {
    arr.try_readwrite()
        .map_err(|e| PyValueError::new_err(format!("out: cannot be written: {e}")))
}

/// An owned Vec as a numpy array without copying, reshaped to `shape`.
pub fn owned<'py, T: Element>(
    py: Python<'py>,
    data: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    // One dimension: rust-numpy's Vec conversion, which right after a model forward costs
    // ~2 µs where the dynamic-rank ndarray one costs ~4 (`compact_kv` returns one a step).
    if *shape == [data.len()] {
        return Ok(PyArray::from_vec(py, data).to_dyn().clone());
    }
    let arr = ndarray::ArrayD::from_shape_vec(shape, data)
        .map_err(|e| PyValueError::new_err(format!("internal shape error: {e}")))?;
    Ok(PyArray::from_owned_array(py, arr))
}

/// An integer argument as `i64`, with a message naming it: PyO3's own extraction error says
/// only "'float' object cannot be interpreted as an integer".
pub fn int_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<i64> {
    // A bool is a Python int, but `seq_dim=True` or `budget=False` is a mistake, not an axis
    // or a count; so is a torch bool tensor.
    let flag = if obj.is_instance_of::<pyo3::types::PyBool>() {
        Some("bool")
    } else if !obj.is_instance_of::<pyo3::types::PyInt>() && is_bool_tensor(obj) {
        Some("a bool tensor")
    } else {
        None
    };
    if let Some(flag) = flag {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected an int, got {flag}"
        )));
    }
    obj.extract::<i64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) {
            PyValueError::new_err(format!("{arg}: {obj} does not fit in int64"))
        } else {
            PyTypeError::new_err(format!("{arg}: expected an int, got {}", type_name(obj)))
        }
    })
}

/// A float argument as `f64`, with a message naming it (PyO3's says only "must be real
/// number, not str"). A bool is refused, as [`int_arg`] refuses it.
pub fn float_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<f64> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected a number, got bool"
        )));
    }
    obj.extract::<f64>().or_else(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py())
            && obj.is_instance_of::<pyo3::types::PyInt>()
        {
            // An int past float64 is past every finite range: +-inf, which the range checks
            // then name (as the Python layer's `specsched._args.float_arg` does).
            let negative = obj.lt(0).unwrap_or(false);
            return Ok(if negative {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            });
        }
        Err(PyTypeError::new_err(format!(
            "{arg}: expected a number, got {}",
            type_name(obj)
        )))
    })
}

/// The index in `choices` of string argument `arg`: a ValueError naming the choices for
/// another string, a TypeError for another type (PyO3's own says only "'None' is not an
/// instance of 'str'").
pub fn str_choice(obj: &Bound<'_, PyAny>, arg: &str, choices: &[&str]) -> PyResult<usize> {
    let expected = choices
        .iter()
        .map(|c| format!("{c:?}"))
        .collect::<Vec<_>>()
        .join(" or ")
        .replace('"', "'");
    let s = obj
        .cast::<pyo3::types::PyString>()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{arg}: expected {expected}, got {}",
                type_name(obj)
            ))
        })?
        .to_str()?;
    choices
        .iter()
        .position(|&c| c == s)
        .ok_or_else(|| PyValueError::new_err(format!("{arg}: expected {expected}, got {s:?}")))
}

/// An unsigned 64-bit argument (a seed, a step count): an int in `[0, 2^64)` named in its
/// errors.
pub fn u64_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u64> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected an int, got bool"
        )));
    }
    obj.extract::<u64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) {
            PyValueError::new_err(format!("{arg}: {obj} is not an int in [0, 2**64)"))
        } else {
            PyTypeError::new_err(format!("{arg}: expected an int, got {}", type_name(obj)))
        }
    })
}

/// A flag: a Python (or numpy) bool, named in its error (PyO3's own names no argument).
pub fn bool_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<bool> {
    obj.extract::<bool>().map_err(|_| {
        PyTypeError::new_err(format!("{arg}: expected a bool, got {}", type_name(obj)))
    })
}

/// Named extractors for `#[pyo3(from_py_with = ...)]`, which takes a function of the object
/// alone: each is one of the converters above with its argument's name.
macro_rules! named_args {
    ($($name:ident -> $ty:ty = $conv:ident($arg:literal);)*) => {$(
        #[doc = concat!("`", $arg, "` through [`", stringify!($conv), "`].")]
        pub fn $name(obj: &Bound<'_, PyAny>) -> PyResult<$ty> {
            $conv(obj, $arg)
        }
    )*};
}

named_args! {
    request_id_arg -> i64 = int_arg("request_id");
    budget_i64_arg -> i64 = int_arg("budget");
    max_depth_i64_arg -> i64 = int_arg("max_depth");
    max_global_tokens_arg -> i64 = int_arg("max_global_tokens");
    min_n_arg -> i64 = int_arg("min_n");
    max_n_arg -> i64 = int_arg("max_n");
    k_arg -> i64 = int_arg("k");
    max_model_len_arg -> i64 = int_arg("max_model_len");
    root_token_arg -> i64 = int_arg("root_token");
    batch_i64_arg -> i64 = int_arg("batch");
    topk_i64_arg -> i64 = int_arg("topk");
    depth_i64_arg -> i64 = int_arg("depth");
    max_children_arg -> usize = count_arg("max_children");
    sglang_topk_arg -> usize = count_arg("topk");
    sglang_depth_arg -> usize = count_arg("depth");
    num_verify_tokens_arg -> usize = count_arg("num_verify_tokens");
    num_draft_token_arg -> usize = count_arg("num_draft_token");
    seq_lens_sum_arg -> i64 = int_arg("seq_lens_sum");
    tree_mask_mode_arg -> i64 = int_arg("tree_mask_mode");
    steps_arg -> u64 = u64_arg("steps");
    seed_arg -> u64 = u64_arg("seed");
    min_prob_arg -> f64 = float_arg("min_prob");
    max_spec_factor_arg -> f64 = float_arg("max_spec_factor");
    t_draft_arg -> f64 = float_arg("t_draft");
    z_arg -> f64 = float_arg("z");
    cumulative_arg -> bool = bool_arg("cumulative");
    cache_arg -> bool = bool_arg("cache");
    chain_arg -> bool = bool_arg("chain");
    use_global_arg -> bool = bool_arg("use_global");
}

/// `prefix_len` of the single-tree layouts (checked `>= 0` by the layout).
pub fn prefix_len_arg(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    int_arg(obj, "prefix_len")
}

/// A count argument (a budget, a depth, a top-k): an int `>= 0` named in its errors. The
/// callee checks its own lower bound (most need `>= 1`), so a negative one says the same.
pub fn count_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<usize> {
    let x = int_arg(obj, arg)?;
    usize::try_from(x).map_err(|_| PyValueError::new_err(format!("{arg}: must be >= 1, got {x}")))
}

/// A node budget ([`count_arg`]).
pub fn budget_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_arg(obj, "budget")
}

/// A depth limit ([`count_arg`]).
pub fn max_depth_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_arg(obj, "max_depth")
}

/// An optional depth limit: None, or [`max_depth_arg`].
pub fn opt_max_depth_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    max_depth_arg(obj).map(Some)
}

/// `seq_dim` of the KV functions (negative counts from the end, as numpy axes do).
pub fn seq_dim_arg(obj: &Bound<'_, PyAny>) -> PyResult<isize> {
    let d = int_arg(obj, "seq_dim")?;
    isize::try_from(d).map_err(|_| PyValueError::new_err(format!("seq_dim: {d} is out of range")))
}

/// `batch_dim` of the KV functions: None, or an axis (negative counts from the end).
pub fn batch_dim_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<isize>> {
    if obj.is_none() {
        return Ok(None);
    }
    let d = int_arg(obj, "batch_dim")?;
    isize::try_from(d)
        .map(Some)
        .map_err(|_| PyValueError::new_err(format!("batch_dim: {d} is out of range")))
}

/// The index of `batch[index]` / `result[index]`.
pub fn index_arg(obj: &Bound<'_, PyAny>) -> PyResult<isize> {
    // An int past int64 is out of range, as it is for a list (`[1][2**63]`): IndexError.
    let i = int_arg(obj, "index").map_err(|e| {
        if e.is_instance_of::<PyValueError>(obj.py()) {
            PyIndexError::new_err(format!("index: {obj} is out of range"))
        } else {
            e
        }
    })?;
    isize::try_from(i).map_err(|_| PyIndexError::new_err(format!("index: {i} is out of range")))
}
