"""Scalar argument checks shared by the Python layer, worded as the binding words its own
(`"{arg}: must be >= {low}, got {n}"`), so an argument reads the same wherever it is refused."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from specsched._verify import _representable


def int_arg(value: Any, arg: str, low: int | None = None) -> int:
    """`value` as a Python int `>= low`: anything with `__index__` (a numpy int, a 0-d int
    array or tensor), except a bool, which is a flag, not a count (nor a bool array or
    tensor), and an array of one element, which is a per-request value, not a scalar (torch
    indexes `tensor([2])` as 2). Named when it is not one."""
    if isinstance(value, (bool, np.bool_)) or "bool" in str(getattr(value, "dtype", "")):
        raise TypeError(f"{arg}: expected an int, got {_kind(value)}")
    if getattr(value, "ndim", 0):
        raise TypeError(f"{arg}: expected an int, got a {value.ndim}-D {type(value).__name__}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{arg}: expected an int, got {type(value).__name__}") from None
    if low is not None and n < low:
        raise ValueError(f"{arg}: must be >= {low}, got {n}")
    return n


def _kind(value: Any) -> str:
    """A value's type as an error names it: an array's or tensor's with its dtype."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or isinstance(value, np.generic):
        return type(value).__name__
    return f"{type(value).__name__} of {dtype}"


def float_arg(value: Any, arg: str) -> float:
    """A Python or numpy real number (not a bool) as a float, named when it is not one; an int
    past float64 becomes +-inf (out of every finite range, checked by the caller)."""
    # np.timedelta64 is an np.integer subclass, but a duration, not a number.
    if isinstance(value, (bool, np.bool_, np.timedelta64)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{arg}: expected a number, got {type(value).__name__}")
    return float(_representable(value, integer=False))
