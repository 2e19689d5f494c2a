"""KV compaction after verification: move the accepted nodes' entries to `prefix + 0..k`.

Two caches, float16, sequence axis 2: one tree `[layers=32, heads=8, seq=4096, dim=128]`
(a 64-node tree accepting nodes 0, 3, 9, 20, 41 at prefix 2000: 4 moves of 32 x 8 rows), and a
batch `[B=8, heads=8, seq=4096, dim=128]` (8 EAGLE-like trees of 64 nodes, batch_dim=0).
Contenders:
- `rust`: `ss.compact_kv(cache, result, prefix_lens, seq_dim)`;
- `reference`: `reference.kv_compaction_plan` + `reference.compact_kv` (one slice copy a move);
- `numpy_peer`: the plan from `accepted_nodes` in numpy, then one fancy-index gather/scatter
  `cache[..., dst, :] = cache[..., src, :]`;
- `memcpy`: `np.copyto` between two preallocated contiguous buffers of the moved byte count,
  the floor for moving those bytes.
Compaction is not idempotent, but re-running a plan moves the same bytes between the same
places, so every round times the same work. Correctness is checked on small caches with the
same plans (`test_contenders_agree`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import numpy as np
import pytest
import specsched as ss
from bench_inputs import eagle_parents, make_batch, run
from specsched import reference as ref

SEQ_DIM = 2
SEQ = 4096
TREE_PATH = [0, 3, 9, 20, 41]
TREE_PREFIX = 2000
TREE_NODES = 64
CONTENDERS = ["rust", "reference", "numpy_peer", "memcpy"]


def tree_result() -> ss.VerifyResult:
    """A 64-node EAGLE-like tree whose walk accepts exactly TREE_PATH."""
    rng = np.random.default_rng(41)
    parents = eagle_parents(TREE_NODES, rng)
    for parent, child in itertools.pairwise(TREE_PATH):
        parents[child] = parent
    tokens = rng.choice(32000, size=TREE_NODES + 1, replace=False)  # distinct; last is spare
    choices = rng.integers(32000, size=TREE_NODES)
    for parent, child in itertools.pairwise(TREE_PATH):
        choices[parent] = tokens[child]
    choices[TREE_PATH[-1]] = tokens[-1]  # no node has it: the walk stops there
    result = ss.verify(ss.Tree(parents, tokens[:-1]), target_tokens=choices)
    assert result.accepted_nodes.tolist() == TREE_PATH
    return result


@functools.cache
def case(kind: str, small: bool = False):
    """`(cache, result, prefix_lens, batch_dim)`; `small` shrinks the non-sequence axes."""
    if kind == "tree":
        result, prefix, batch_dim = tree_result(), TREE_PREFIX, None
        shape = (2, 3, SEQ, 4) if small else (32, 8, SEQ, 128)
    else:
        batch = make_batch([TREE_NODES] * 8, seed=8)
        result = ss.verify(batch.tree_batch(), target_tokens=batch.choices)
        prefix, batch_dim = batch.prefix_lens, 0
        shape = (8, 3, SEQ, 4) if small else (8, 8, SEQ, 128)
    rng = np.random.default_rng(0)
    if small:
        cache = rng.standard_normal(shape).astype(np.float16)
    else:
        cache = np.empty(shape, dtype=np.float16)
        cache.fill(1.0)  # touch every page before timing
    return cache, result, prefix, batch_dim


def numpy_plan(result, prefix) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """`(req, src, dst)` sequence positions of the moves, from `accepted_nodes` (`req` None
    for a single tree)."""
    acc = result.accepted_nodes
    pos = np.arange(acc.shape[-1])
    moved = (acc >= 0) & (acc != pos)
    if acc.ndim == 1:
        return None, prefix + acc[moved], prefix + pos[moved]
    req, j = np.nonzero(moved)
    base = prefix[req]
    return req, base + acc[req, j], base + j


def numpy_apply(cache: np.ndarray, plan) -> None:
    """One gather and one scatter along the sequence axis."""
    req, src, dst = plan
    if req is None:
        cache[:, :, dst] = cache[:, :, src]
    else:
        cache[req, :, dst] = cache[req, :, src]


def numpy_compact(cache: np.ndarray, result, prefix) -> None:
    """The numpy peer: plan from `accepted_nodes`, then one gather and one scatter."""
    numpy_apply(cache, numpy_plan(result, prefix))


def reference_compact(cache: np.ndarray, result, prefix, batch_dim) -> None:
    if batch_dim is None:
        moves = ref.kv_compaction_plan(result.accepted_nodes.tolist(), prefix)
    else:
        moves = ref.batch_kv_compaction_plan(result.accepted_nodes.tolist(), prefix.tolist())
    ref.compact_kv(cache, moves, SEQ_DIM, batch_dim)


def contender_fn(name: str, cache: np.ndarray, result, prefix, batch_dim) -> Callable[[], None]:
    if name == "rust":
        kw = {} if batch_dim is None else {"batch_dim": batch_dim}
        return lambda: ss.compact_kv(cache, result, prefix, SEQ_DIM, **kw)
    if name == "reference":
        return lambda: reference_compact(cache, result, prefix, batch_dim)
    if name == "numpy_peer":
        return lambda: numpy_compact(cache, result, prefix)
    per_position = cache.nbytes // cache.shape[SEQ_DIM]  # one position, all other indices
    if batch_dim is not None:
        per_position //= cache.shape[batch_dim]  # a move touches one request's row
    moved_bytes = len(ss.kv_compaction_plan(result, prefix)[-1]) * per_position
    src = np.ones(moved_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("kind", ["tree", "batch"])
def test_compact_kv(benchmark, kind, contender):
    cache, result, prefix, batch_dim = case(kind)
    moves = len(ss.kv_compaction_plan(result, prefix)[-1])
    shape = "x".join(map(str, cache.shape))
    benchmark.group = f"compact_kv {kind} [{shape}] f16, {moves} moves"
    run(benchmark, contender_fn(contender, cache, result, prefix, batch_dim))


@pytest.mark.parametrize("kind", ["tree", "batch"])
def test_contenders_agree(kind):
    """Every moving contender leaves the same cache as the reference (same plan, small axes)."""
    cache, result, prefix, batch_dim = case(kind, small=True)
    expected = cache.copy()
    reference_compact(expected, result, prefix, batch_dim)
    assert not np.array_equal(expected, cache)  # the plan moves something
    for name in ("rust", "numpy_peer"):
        got = cache.copy()
        contender_fn(name, got, result, prefix, batch_dim)()
        np.testing.assert_array_equal(got, expected, err_msg=name)


# A model's whole cache as separate per-layer tensors (HF's DynamicCache): 32 layers of keys
# and values `[B=8, heads=8, seq, dim=128]` (Llama-7B's count and head size), the batch's plan
# applied to all 64 buffers.
LAYERS = 32
LAYER_SEQ = 320
LAYER_CONTENDERS = ["rust", "rust_per_buffer", "reference", "numpy_peer"]


@functools.cache
def layers_case(small: bool = False):
    """`(buffers, result, prefix_lens)`: the batch case's trees at prefixes below 256."""
    batch = make_batch([TREE_NODES] * 8, seed=8)
    result = ss.verify(batch.tree_batch(), target_tokens=batch.choices)
    prefix = batch.prefix_lens % 256
    shape = (8, 3, LAYER_SEQ, 4) if small else (8, 8, LAYER_SEQ, 128)
    rng = np.random.default_rng(1)
    buffers = [rng.standard_normal(shape).astype(np.float16) for _ in range(2 * LAYERS)]
    return buffers, result, prefix


def layers_fn(name: str, buffers: list[np.ndarray], result, prefix) -> Callable[[], None]:
    if name == "rust":
        return lambda: ss.compact_kv(buffers, result, prefix, SEQ_DIM, batch_dim=0)
    if name == "rust_per_buffer":  # how a loop over the layers calls it one buffer at a time

        def per_buffer() -> None:
            for b in buffers:
                ss.compact_kv(b, result, prefix, SEQ_DIM, batch_dim=0)

        return per_buffer
    if name == "reference":

        def reference() -> None:
            for b in buffers:
                reference_compact(b, result, prefix, 0)

        return reference

    def peer() -> None:
        # One plan for every buffer (each call plans once), a fancy-index copy per buffer.
        plan = numpy_plan(result, prefix)
        for b in buffers:
            numpy_apply(b, plan)

    return peer


@pytest.mark.parametrize("contender", LAYER_CONTENDERS)
def test_compact_kv_layers(benchmark, contender):
    buffers, result, prefix = layers_case()
    moves = len(ss.kv_compaction_plan(result, prefix)[-1])
    shape = "x".join(map(str, buffers[0].shape))
    benchmark.group = f"compact_kv {LAYERS} layers x (K, V) [{shape}] f16, {moves} moves each"
    run(benchmark, layers_fn(contender, buffers, result, prefix))


def test_layer_contenders_agree():
    buffers, result, prefix = layers_case(small=True)
    expected = [b.copy() for b in buffers]
    for b in expected:
        reference_compact(b, result, prefix, 0)
    assert not np.array_equal(expected[0], buffers[0])
    for name in ("rust", "rust_per_buffer", "numpy_peer"):
        got = [b.copy() for b in buffers]
        layers_fn(name, got, result, prefix)()
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e, err_msg=name)


def torch_layers_compact(buffers: list, index) -> None:
    """The torch peer: the move indices made once (host numpy from `accepted_nodes`, one copy
    to the device), then one gather/scatter per buffer."""
    req, src, dst = index
    for b in buffers:
        b[req, :, dst] = b[req, :, src]


DEVICES = ["cpu", "cuda"]


@pytest.mark.parametrize("contender", ["rust", "rust_per_buffer", "torch_peer"])
@pytest.mark.parametrize("device", DEVICES)
def test_compact_kv_layers_torch(benchmark, device, contender):
    """The layered cache as torch tensors: on the CPU through the host path, on a GPU (when
    there is one) with one plan and one copy of its indices for all 64 buffers."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    arrays, result, prefix = layers_case()
    buffers = [torch.from_numpy(a.copy()).to(device) for a in arrays]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    shape = "x".join(map(str, arrays[0].shape))
    benchmark.group = f"compact_kv {LAYERS} layers x (K, V) [{shape}] f16, torch on {device}"
    if contender == "rust":

        def fn() -> None:
            ss.compact_kv(buffers, result, prefix, SEQ_DIM, batch_dim=0)
            sync()

    elif contender == "rust_per_buffer":

        def fn() -> None:
            for b in buffers:
                ss.compact_kv(b, result, prefix, SEQ_DIM, batch_dim=0)
            sync()

    else:

        def fn() -> None:
            acc = result.accepted_nodes
            pos = np.arange(acc.shape[-1])
            req, j = np.nonzero((acc >= 0) & (acc != pos))
            index = torch.as_tensor(
                np.stack([req, prefix[req] + acc[req, j], prefix[req] + j]), device=device
            )
            torch_layers_compact(buffers, index)
            sync()

    # Checked once on fresh buffers before timing (a plan applied again moves the same bytes
    # between the same places, but its result is not the first application's).
    fn()
    for a, b in zip(arrays, buffers, strict=True):
        expected = a.copy()
        reference_compact(expected, result, prefix, 0)
        np.testing.assert_array_equal(b.cpu().numpy(), expected, err_msg=contender)
    run(benchmark, fn)
