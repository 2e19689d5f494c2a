"""Observing GIL release: a call that holds the GIL freezes every other Python thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np


def heartbeat_gap(call: Callable[[], object]) -> float:
    """Runs `call()` in a thread while this thread runs Python in a loop; the largest gap
    between heartbeats during the call, as a fraction of the call (~1 if the GIL is held).

    Unlike checking that two calls' time intervals intersect (which a GIL-holding call also
    passes: the waiting thread starts the moment the first returns), a held GIL shows here as
    one gap spanning the whole call."""
    barrier = threading.Barrier(2)
    done = threading.Event()
    span: list[float] = []

    def worker() -> None:
        barrier.wait()
        t0 = time.perf_counter()
        call()
        span.extend([t0, time.perf_counter()])
        done.set()

    th = threading.Thread(target=worker)
    th.start()
    barrier.wait()
    beats = []
    while not done.is_set():
        beats.append(time.perf_counter())
    th.join()
    t0, t1 = span
    inside = [t0, *(b for b in beats if t0 < b < t1), t1]
    return float(max(np.diff(inside)) / (t1 - t0))
