//! N-D array extraction for the tree builders: integer arrays as int64 (a view when they are
//! int64 already, a converted copy otherwise) and float arrays as f32 / f64 views, each with a
//! shape check whose message names the argument.

use ndarray::{ArrayD, ArrayViewD, Dimension};
use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyReadwriteArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use specsched_core::kv;

use crate::convert::{as_ndarray, check_ndim, data_ptr, is_writeable};

fn typed<'py, T: numpy::Element>(
    a: &Bound<'py, PyUntypedArray>,
    arg: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    a.cast::<PyArrayDyn<T>>()
        .map_err(|_| PyTypeError::new_err(format!("{arg}: unexpected dtype {}", a.dtype())))?
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("{arg}: cannot be read: {e}")))
}

fn checked<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    ndim: usize,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let a = as_ndarray(obj, arg)?;
    check_ndim(&a, arg, ndim)?;
    if !a.dtype().is_native_byteorder().unwrap_or(true) {
        return Err(PyTypeError::new_err(format!(
            "{arg}: non-native byte order ({}) is not supported",
            a.dtype()
        )));
    }
    Ok(a)
}

/// An integer array as int64: borrowed if it is int64, converted if int32 / uint32.
pub struct I64Array<'py> {
    borrowed: Option<PyReadonlyArrayDyn<'py, i64>>,
    owned: Option<ArrayD<i64>>,
}

impl I64Array<'_> {
    pub fn view(&self) -> ArrayViewD<'_, i64> {
        match (&self.borrowed, &self.owned) {
            (Some(b), _) => b.as_array(),
            (None, Some(o)) => o.view(),
            (None, None) => unreachable!("I64Array holds one of the two"),
        }
    }
}

/// Extracts an `ndim`-D int32 / int64 / uint32 array.
pub fn i64_array<'py>(obj: &Bound<'py, PyAny>, arg: &str, ndim: usize) -> PyResult<I64Array<'py>> {
    let a = checked(obj, arg, ndim)?;
    let dt = a.dtype();
    match (dt.kind(), dt.itemsize()) {
        (b'i', 8) => Ok(I64Array {
            borrowed: Some(typed::<i64>(&a, arg)?),
            owned: None,
        }),
        (b'i', 4) => Ok(I64Array {
            borrowed: None,
            owned: Some(typed::<i32>(&a, arg)?.as_array().mapv(i64::from)),
        }),
        (b'u', 4) => Ok(I64Array {
            borrowed: None,
            owned: Some(typed::<u32>(&a, arg)?.as_array().mapv(i64::from)),
        }),
        _ => Err(PyTypeError::new_err(format!(
            "{arg}: expected an integer array of dtype int32, int64 or uint32, got {dt}"
        ))),
    }
}

/// A float array, f32 or f64, borrowed.
pub enum FloatArray<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F64(PyReadonlyArrayDyn<'py, f64>),
}

/// Runs `$body` with `$v` bound to the `ArrayViewD` of whichever float type `$arr` holds.
macro_rules! with_float_view {
    ($arr:expr, $v:ident => $body:expr) => {
        match &$arr {
            $crate::ndconv::FloatArray::F32(a) => {
                let $v = a.as_array();
                $body
            }
            $crate::ndconv::FloatArray::F64(a) => {
                let $v = a.as_array();
                $body
            }
        }
    };
}
pub(crate) use with_float_view;

/// Extracts an `ndim`-D float32 / float64 array; float16 (a half-precision draft head's
/// scores) is widened to float32, a copy of what is a small array here (top-k scores).
pub fn float_array<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    ndim: usize,
) -> PyResult<FloatArray<'py>> {
    let a = checked(&crate::convert::widen_bfloat16(obj)?, arg, ndim)?;
    let dt = a.dtype();
    match (dt.kind(), dt.itemsize()) {
        (b'f', 4) => Ok(FloatArray::F32(typed::<f32>(&a, arg)?)),
        (b'f', 8) => Ok(FloatArray::F64(typed::<f64>(&a, arg)?)),
        (b'f', 2) => Ok(FloatArray::F32(typed::<f32>(
            &converted(&a, "float32")?,
            arg,
        )?)),
        // An empty list has no element type (it converts as int64); an empty input is one.
        (b'i' | b'u', _) if a.len() == 0 => Ok(FloatArray::F64(typed::<f64>(
            &converted(&a, "float64")?,
            arg,
        )?)),
        _ => Err(PyTypeError::new_err(format!(
            "{arg}: expected a float16, float32 or float64 array, got {dt}"
        ))),
    }
}

/// `a` as numpy converts it to `dtype`: a new array (a widening, or an empty input typed).
fn converted<'py>(
    a: &Bound<'py, PyUntypedArray>,
    dtype: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let np = numpy::get_array_module(a.py())?;
    Ok(np
        .call_method1("asarray", (a, dtype))?
        .cast_into::<PyUntypedArray>()?)
}

/// A float vector as f64 values (a list or any 1-D float/int array).
pub fn f64_vec(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<f64>> {
    // bfloat16 tensors widened as the float arrays' are; float16 and integers read as float64.
    let a = checked(&crate::convert::widen_bfloat16(obj)?, arg, 1)?;
    let dt = a.dtype();
    match (dt.kind(), dt.itemsize()) {
        (b'f', 4) => Ok(typed::<f32>(&a, arg)?
            .as_array()
            .iter()
            .map(|&x| x as f64)
            .collect()),
        (b'f', 8) => Ok(typed::<f64>(&a, arg)?.as_array().iter().copied().collect()),
        (b'i', _) | (b'u', _) | (b'f', 2) => Ok(typed::<f64>(&converted(&a, "float64")?, arg)?
            .as_array()
            .iter()
            .copied()
            .collect()),
        _ => Err(PyTypeError::new_err(format!(
            "{arg}: expected a float or integer array, got {dt}"
        ))),
    }
}

/// A writable C-contiguous output array of element type `T` and `ndim` dimensions, supplied by
/// the caller (SGLang's in-place outputs and preallocated buffers).
pub fn out_array<'py, T: numpy::Element>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    dtype_name: &str,
) -> PyResult<PyReadwriteArrayDyn<'py, T>> {
    let a = obj.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!("{arg}: expected a numpy array (or a CPU tensor)"))
    })?;
    if !a.dtype().is_equiv_to(&numpy::dtype::<T>(obj.py())) {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected dtype {dtype_name}, got {}",
            a.dtype()
        )));
    }
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{arg}: must be C-contiguous"
        )));
    }
    if !crate::convert::is_aligned(a) {
        return Err(PyValueError::new_err(
            crate::convert::MISALIGNED.replace("{arg}", arg),
        ));
    }
    if !is_writeable(a) {
        return Err(PyValueError::new_err(format!("{arg}: is read-only")));
    }
    a.cast::<PyArrayDyn<T>>()?
        .try_readwrite()
        .map_err(|e| PyValueError::new_err(format!("{arg}: cannot be written: {e}")))
}

/// A dynamic view with `D` dimensions; the rank was checked at extraction, so the error
/// branch is only a guard.
pub fn fixed<'a, T, D: Dimension>(
    v: ArrayViewD<'a, T>,
    arg: &str,
) -> PyResult<ndarray::ArrayView<'a, T, D>> {
    v.into_dimensionality()
        .map_err(|e| PyValueError::new_err(format!("{arg}: {e}")))
}

/// The bytes an array argument spans, or None for an empty one or one that does not convert
/// (its conversion, later, names the error). A torch tensor or a buffer is measured through
/// the numpy view the kernel will read or write; a list becomes a new array, which shares
/// memory with nothing.
fn span(obj: &Bound<'_, PyAny>, arg: &str) -> Option<(usize, usize)> {
    let converted;
    let a = match obj.cast::<PyUntypedArray>() {
        Ok(a) => a,
        Err(_) => {
            converted = as_ndarray(obj, arg).ok()?;
            &converted
        }
    };
    let (start, end) = kv::byte_span(
        data_ptr(a) as usize,
        a.shape(),
        a.strides(),
        a.dtype().itemsize(),
    );
    (start < end).then_some((start, end))
}

/// Refuses an output that may share memory with another output or an input of the same call.
/// rust-numpy's borrow registry catches that only between views of one base object, and each
/// torch tensor's numpy view has a base of its own, so two tensors over one storage would be
/// written (or read while written) through aliased slices. Address ranges, as
/// `numpy.may_share_memory` compares them.
pub fn check_outputs_disjoint(
    outputs: &[(&str, &Bound<'_, PyAny>)],
    inputs: &[(&str, &Bound<'_, PyAny>)],
) -> PyResult<()> {
    // Spans on the stack: this runs on every call of the SGLang kernels, whose whole binding
    // costs a few µs. Empty spans (non-arrays, empty arrays) overlap nothing.
    const MAX_ARGS: usize = 16;
    let count = outputs.len() + inputs.len();
    if count > MAX_ARGS {
        return Err(PyValueError::new_err(
            "internal: too many arguments to compare",
        ));
    }
    let args = || outputs.iter().chain(inputs);
    let mut spans = [(0usize, 0usize); MAX_ARGS];
    for (slot, (name, a)) in spans.iter_mut().zip(args()) {
        *slot = span(a, name).unwrap_or((0, 0));
    }
    let overlap = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    for i in 0..outputs.len() {
        if let Some(j) = (i + 1..count).find(|&j| overlap(spans[i], spans[j])) {
            let other = args().nth(j).map_or("", |(name, _)| name);
            return Err(PyValueError::new_err(format!(
                "{} and {other} may share memory (their address ranges overlap): pass \
                 separate buffers",
                outputs[i].0
            )));
        }
    }
    Ok(())
}
