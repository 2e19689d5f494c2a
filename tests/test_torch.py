"""torch inputs: CPU logits in f32/f16/bf16 read in place, the on-device reduction (run here on
CPU tensors), torch target tokens and slots, compaction of torch caches, and CUDA when present."""

from __future__ import annotations

import itertools
import random
import tracemalloc
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import specsched as ss
from fresh import assert_read_in_place
from hypothesis import given, settings
from hypothesis import strategies as st
from specsched import _core, _torch
from specsched import reference as ref
from strategies import P5, T5, batches, children, trees

torch = pytest.importorskip("torch")

VOCAB = 8
SETTINGS = settings(deadline=None, max_examples=40)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REDUCES = ("auto", "host", "device")
LAYOUTS = ("C", "T", "cols", "rows")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# ------------------------------------------------------------------------------- helpers


def pairs(offsets):
    return list(itertools.pairwise(offsets))


def make_logits(rng: np.random.Generator, parents, tokens, vocab: int) -> np.ndarray:
    """float64 `[N, vocab]` of small integers (exact in bf16/f16, ties common) whose argmax is
    often a child's token; some -inf entries, -0.0 and all--inf rows."""
    n = len(parents)
    x = rng.integers(-3, 3, size=(n, vocab)).astype(np.float64)
    x[rng.random((n, vocab)) < 0.05] = -np.inf
    x[(x == 0) & (rng.random((n, vocab)) < 0.5)] = -0.0
    for v, kids in enumerate(children(parents)):
        u = rng.random()
        if kids and u < 0.8:
            y = tokens[rng.choice(kids)]
            x[v, y] = 3.0 if rng.random() < 0.9 else np.inf
            if rng.random() < 0.3:
                x[v, rng.integers(vocab)] = x[v, y]
        elif u < 0.85:
            x[v] = -np.inf
    return x


def tensor_in_layout(x: np.ndarray, dtype, kind: str):
    """A CPU tensor of `dtype` with the values of `x` in memory layout `kind`."""
    t = torch.from_numpy(x).to(dtype)
    if kind == "C":
        return t.contiguous()
    if kind == "T":  # column-major
        return t.T.contiguous().T
    if kind == "cols":
        big = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=dtype)
        big[:, ::2] = t
        return big[:, ::2]
    if kind == "rows":
        big = torch.zeros(2 * x.shape[0], x.shape[1], dtype=dtype)
        big[1::2] = t
        return big[1::2]
    raise AssertionError(kind)


class Rows:
    """Lazy float rows for `reference.verify_logits`."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __getitem__(self, v: int) -> list[float]:
        return self.x[v].tolist()


def as_f64(t) -> np.ndarray:
    """The tensor's values as float64 numpy (bf16 and f16 upcast exactly)."""
    return t.detach().cpu().double().numpy()


def check_single(r, acc, tok) -> None:
    assert isinstance(r, ss.VerifyResult)
    assert r.accepted_nodes.dtype == np.int32 and r.tokens.dtype == np.int64
    assert r.accepted_nodes.tolist() == acc
    assert r.tokens.tolist() == tok
    assert r.num_accepted == len(acc) - 1 and r.bonus_token == tok[-1]


def ref_batch(parents, tokens, offsets, x):
    width = max(max(ref.depths(parents[s:e])) for s, e in pairs(offsets)) + 1
    num, acc, tok = [], [], []
    for s, e in pairs(offsets):
        a, t = ref.verify_logits(parents[s:e], tokens[s:e], Rows(x[s:e]))
        num.append(len(a) - 1)
        acc.append(a + [-1] * (width - len(a)))
        tok.append(t + [-1] * (width - len(t)))
    return num, acc, tok


def chain_logits(n: int, vocab: int, dtype):
    """A chain 0 -> 1 -> ... (node i has token i) whose logits accept every node."""
    t = ss.Tree.chain(list(range(n)))
    x = torch.zeros(n, vocab, dtype=dtype)
    x[torch.arange(n), torch.arange(1, n + 1)] = 1
    return t, x


# --------------------------------------------------------------------- verify: CPU logits


@SETTINGS
@given(
    trees(1, 48, VOCAB),
    st.integers(0, 2**32 - 1),
    st.sampled_from(DTYPES),
    st.sampled_from(LAYOUTS),
    st.sampled_from(REDUCES),
    st.sampled_from([VOCAB, 1025]),
)
def test_torch_cpu_logits_match_reference(tree, seed, dtype, kind, reduce, vocab):
    parents, tokens = tree
    x = make_logits(np.random.default_rng(seed), parents, tokens, vocab)
    logits = tensor_in_layout(x, dtype, kind)
    want = ref.verify_logits(parents, tokens, Rows(as_f64(logits)))
    check_single(ss.verify(ss.Tree(parents, tokens), logits, reduce=reduce), *want)


@SETTINGS
@given(
    batches(6, 24, VOCAB),
    st.integers(0, 2**32 - 1),
    st.sampled_from(DTYPES),
    st.sampled_from(LAYOUTS),
    st.sampled_from(REDUCES),
    st.sampled_from([VOCAB, 2100]),
)
def test_torch_cpu_batch_logits_match_reference(batch, seed, dtype, kind, reduce, vocab):
    parents, tokens, offsets = batch
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [make_logits(rng, parents[s:e], tokens[s:e], vocab) for s, e in pairs(offsets)]
    )
    logits = tensor_in_layout(x, dtype, kind)
    num, acc, tok = ref_batch(parents, tokens, offsets, as_f64(logits))
    rb = ss.verify(ss.TreeBatch.from_flat(parents, tokens, offsets), logits, reduce=reduce)
    assert rb.num_accepted.tolist() == num
    assert rb.accepted_nodes.tolist() == acc
    assert rb.tokens.tolist() == tok


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_bf16_and_half_values_are_compared_as_floats(dtype, reduce):
    """Negative values, -0.0 vs 0.0 ties and values that differ only in low bits."""
    t = ss.Tree.chain([0, 5, 6])
    x = torch.full((3, 300), -1000.0, dtype=dtype)
    x[0, 5] = -1.5  # a negative maximum: as int16 bits it would compare as the smallest
    x[0, 7] = -2.0
    x[1, 4] = -0.0  # ties with 0.0 at a higher id
    x[1, 6] = 0.0
    x[2, 299] = 1.0 + 2**-7  # the smallest step above 1 in bfloat16
    x[2, 3] = 1.0
    r = ss.verify(t, x, reduce=reduce)
    check_single(r, [0, 1], [5, 4])
    x[1, 4] = -1.0
    check_single(ss.verify(t, x, reduce=reduce), [0, 1, 2], [5, 6, 299])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [4, 1024, 3000])
@pytest.mark.parametrize("reduce", REDUCES)
def test_ties_go_to_the_lowest_id(dtype, vocab, reduce):
    t = ss.Tree.chain([0, 1])
    for ids in ([1, vocab - 1], [vocab - 1, 2, 1], [0, vocab - 1]):
        x = torch.zeros(2, vocab, dtype=dtype)
        x[0, ids] = 2
        for kind in LAYOUTS:
            logits = tensor_in_layout(as_f64(x), dtype, kind)
            assert ss.verify(t, logits, reduce=reduce).tokens[0] == min(ids)
    x = torch.full((2, vocab), float("-inf"), dtype=dtype)
    assert ss.verify(t, x, reduce=reduce).tokens.tolist() == [0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("col", [0, 4, -1])
def test_nan_in_a_visited_row_names_the_row(dtype, reduce, col):
    for vocab in (10, 2100):
        t, x = chain_logits(6, vocab, dtype)
        x[3, col] = float("nan")
        for kind in LAYOUTS:
            logits = tensor_in_layout(as_f64(x), dtype, kind)
            with pytest.raises(ValueError, match=r"row 3\b"):
                ss.verify(t, logits, reduce=reduce)
    # NaN after a +inf maximum, and NaN in a row whose argmax stops the walk
    t, x = chain_logits(6, 50, dtype)
    x[3, 0] = float("inf")
    x[3, -1] = float("nan")
    with pytest.raises(ValueError, match=r"row 3\b"):
        ss.verify(t, x, reduce=reduce)


@pytest.mark.parametrize("reduce", REDUCES)
def test_nan_in_a_visited_row_of_a_batch_names_the_global_row(reduce):
    b = ss.TreeBatch([ss.Tree.chain([0, 1, 2]), ss.Tree.chain([0, 1, 2, 3])])
    x = torch.zeros(7, 2100, dtype=torch.bfloat16)
    x[[0, 1, 3, 4, 5], [1, 2, 1, 2, 3]] = 1
    assert ss.verify(b, x, reduce=reduce).num_accepted.tolist() == [2, 3]
    x[5, 1000] = float("nan")
    with pytest.raises(ValueError, match=r"row 5\b"):
        ss.verify(b, x, reduce=reduce)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_nan_in_an_unvisited_row_is_not_an_error(dtype, reduce):
    t = ss.Tree(P5, T5)
    x = torch.zeros(5, 20, dtype=dtype)
    x[0, 12] = 1  # root -> node 2, a leaf: rows 1, 3 and 4 are never read
    x[2, 7] = 1
    x[[1, 3, 4]] = float("nan")
    for kind in LAYOUTS:
        logits = tensor_in_layout(as_f64(x), dtype, kind)
        check_single(ss.verify(t, logits, reduce=reduce), [0, 2], [12, 7])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_requires_grad_logits(dtype, reduce):
    t, x = chain_logits(4, 30, dtype)
    leaf = x.clone().requires_grad_(True)
    check_single(ss.verify(t, leaf, reduce=reduce), [0, 1, 2, 3], [1, 2, 3, 4])
    nonleaf = leaf * 1  # part of a graph
    check_single(ss.verify(t, nonleaf, reduce=reduce), [0, 1, 2, 3], [1, 2, 3, 4])
    assert leaf.grad is None


def test_target_tokens_as_torch_tensors():
    t = ss.Tree(P5, T5)
    for dtype in (torch.int64, torch.int32):
        target = torch.tensor([11, 14, 0, 0, 77], dtype=dtype)
        check_single(ss.verify(t, target_tokens=target), [0, 1, 4], [11, 14, 77])
        strided = torch.tensor([11, -5, 14, -5, 0, -5, 0, -5, 77], dtype=dtype)[::2]
        check_single(ss.verify(t, target_tokens=strided), [0, 1, 4], [11, 14, 77])
    b = ss.TreeBatch([t, t])
    rb = ss.verify(b, target_tokens=torch.tensor([11, 14, 0, 0, 77, 12, 0, 3, 0, 0]))
    assert rb.accepted_nodes.tolist() == [[0, 1, 4], [0, 2, -1]]
    assert rb.tokens.tolist() == [[11, 14, 77], [12, 3, -1]]


def test_lazy_view_bits_on_host_tensors() -> None:
    # A negated view (`x.conj().imag`) holds the negation of its storage: verify reads its
    # values (materialised); compact_kv, which moves storage in place, refuses it by name.
    z = torch.tensor([[1 - 2j, 3 + 1j, 0 - 4j]] * 3, dtype=torch.complex64)
    neg = z.conj().imag  # [2, -1, 4] per row
    assert neg.is_neg()
    t = ss.Tree([-1, 0, 0], [0, 2, 5])
    assert ss.verify(t, neg).tokens.tolist() == ss.verify(t, neg.clone()).tokens.tolist() == [2, 2]
    r = ss.verify(ss.Tree(P5, T5), target_tokens=[11, 14, 0, 0, 77])
    with pytest.raises(TypeError, match=r"^cache: a lazily negated view"):
        ss.compact_kv(torch.zeros(8, 2, dtype=torch.complex64).conj().imag, r, 0, 0)
    with pytest.raises(TypeError, match=r"^cache\[1\]: expected a dense"):
        ss.compact_kv([torch.zeros(8, 2), torch.zeros(8, 2).to_sparse()], r, 0, 0)
    # A nested tensor reports a strided layout: refused by name, not torch's internal error.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "prototype stage" note
        nested = torch.nested.nested_tensor([torch.zeros(5, 2)] * 2)
    with pytest.raises(TypeError, match=r"^cache: a nested tensor has no single shape"):
        ss.compact_kv(nested, r, 0, 0)
    with pytest.raises(TypeError, match=r"^cache\[0\]: a nested tensor"):
        ss.compact_kv([nested], r, 0, 0)
    # The device path runs the same check on every buffer before any is moved.
    for bad in (nested, torch.zeros(8, 2, dtype=torch.complex64).conj().imag):
        with pytest.raises(TypeError, match=r"^cache: "):
            _torch.check_movable(bad, "cache")
    # A conjugate view's storage is moved as it is (a move permutes stored values).
    base = torch.arange(16.0).reshape(8, 2).to(torch.complex64)
    ss.compact_kv(base.conj(), r, 1, 0)
    assert base[3].tolist() == [10, 11] and base[2].tolist() == [4, 5]


def test_bad_torch_logits():
    t = ss.Tree(P5, T5)
    for reduce in REDUCES:
        with pytest.raises(TypeError, match="logits"):
            ss.verify(t, torch.zeros(5, 10, dtype=torch.int32), reduce=reduce)
        with pytest.raises(ValueError, match="logits"):
            ss.verify(t, torch.zeros(4, 10), reduce=reduce)
        with pytest.raises(ValueError, match="logits"):
            ss.verify(t, torch.zeros(5, 10, 1), reduce=reduce)
        with pytest.raises(ValueError, match="logits"):
            ss.verify(t, torch.zeros(5, 0), reduce=reduce)
        with pytest.raises(TypeError, match="tree"):
            ss.verify([-1, 0], torch.zeros(2, 10), reduce=reduce)
        with pytest.raises(TypeError):
            ss.verify(t, torch.zeros(5, 10), target_tokens=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="reduce"):
        ss.verify(t, torch.zeros(5, 10), reduce="cuda")


def test_int_arguments_name_the_dtype_they_came_as() -> None:
    # bfloat16 was widened to float32 before Rust checked it: "got float32", a dtype never
    # passed. A 0-d bool tensor indexed as 0 or 1 (an axis, a prefix) instead of a TypeError.
    rb = ss.verify(ss.TreeBatch([ss.Tree(P5, T5)] * 2), target_tokens=[11, 14, 0, 0, 77] * 2)
    cache = np.zeros((2, 12, 3), np.float32)
    bf16 = torch.tensor([1, 2], dtype=torch.bfloat16)
    for call, arg in (
        (lambda: ss.compact_kv(cache, rb, bf16, seq_dim=1), "prefix_lens"),
        (lambda: ss.kv_compaction_plan(rb, bf16), "prefix_lens"),
        (lambda: ss.commit_slots(bf16, rb), "slots"),
    ):
        with pytest.raises(TypeError, match=f"^{arg}: a torch.bfloat16 tensor"):
            call()
    flag = torch.tensor(True)
    batch = ss.TreeBatch([ss.Tree(P5, T5)] * 2)
    for call in (
        lambda: batch.positions(flag),
        lambda: batch.limit_depth(flag),
        lambda: ss.Tree(P5, T5).positions(flag),
        lambda: ss.compact_kv(cache, rb, 0, seq_dim=flag),
        lambda: ss.compact_kv(cache, rb, flag, seq_dim=1),
    ):
        with pytest.raises(TypeError):
            call()
    # A float argument's bfloat16 is widened, as before.
    logits = np.zeros((10, 8), np.float32)
    temps = torch.tensor([0.5, 1.0], dtype=torch.bfloat16)
    assert len(ss.verify(batch, logits, temperature=temps, seed=1)) == 2


def test_host_view_leaves_what_numpy_cannot_view_to_verify() -> None:
    # Its contract: a numpy view where numpy can hold the tensor, else the tensor itself
    # (verify reads those); float8 and a lazily negated view raised torch's own errors.
    tree = ss.Tree(P5, T5)
    f8 = torch.randn(5, 10).to(torch.float8_e4m3fn)
    assert _torch.host_view(f8) is f8
    negated = torch.randn(5, 10, dtype=torch.complex64).conj().imag
    assert negated.is_neg() and _torch.host_view(negated) is negated
    want = ss.verify(tree, negated.resolve_neg().numpy())
    assert ss.verify(tree, _torch.host_view(negated)).tokens.tolist() == want.tokens.tolist()
    plain = torch.randn(5, 10)
    assert np.shares_memory(_torch.host_view(plain), plain.numpy())


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_logits_without_strided_values_are_named_on_every_path() -> None:
    t = ss.Tree(P5, T5)
    dense = torch.randn(5, 10)
    layouts = [dense.to_sparse(), dense.bfloat16().to_sparse(), dense.to_sparse_csr()]
    for logits in layouts:
        for reduce in REDUCES:
            for options in ({}, {"temperature": 0.7, "seed": 1}):
                with pytest.raises(TypeError, match=r"^logits: expected a dense \(strided\)"):
                    ss.verify(t, logits, reduce=reduce, **options)


def test_float8_logits_are_widened_on_the_device_and_named_on_the_host() -> None:
    t = ss.Tree(P5, T5)
    logits = torch.randn(5, 10)
    logits[1, 3] = float("nan")  # a row the walk may reach: NaN survives the widening
    f8 = logits.to(torch.float8_e4m3fn)
    for options in ({}, {"temperature": 0.7, "seed": 1}):
        want = ss.verify(t, f8.float(), reduce="device", **options)
        got = ss.verify(t, f8, reduce="device", **options)
        assert got.tokens.tolist() == want.tokens.tolist()
        with pytest.raises(TypeError, match=r"^logits: dtype torch.float8_e4m3fn has no host"):
            ss.verify(t, f8, reduce="host", **options)


def test_per_request_arguments_are_counted_before_they_are_copied() -> None:
    batch = ss.TreeBatch([ss.Tree(P5, T5)] * 2)
    logits = np.zeros((10, 10), np.float32)
    claimed = 2**40  # a broadcast view: no memory behind it, nothing to copy
    for name, value in (
        ("temperature", np.broadcast_to(1.0, (claimed,))),
        ("top_k", np.broadcast_to(np.int64(3), (claimed,))),
        ("top_p", torch.ones(1).expand(claimed)),
    ):
        with pytest.raises(ValueError, match=f"^{name}: has {claimed} entries"):
            ss.verify(batch, logits, **{"temperature": 1.0, name: value})
    seeds = np.broadcast_to(np.uint64(1), (claimed,))
    for options in ({}, {"temperature": 1.0}):
        with pytest.raises(ValueError, match=f"^seed: has {claimed} per-request seeds"):
            ss.verify(batch, logits, seed=seeds, **options)
    # A wrong tree is named as such, not as the seeds' count mismatch against it.
    with pytest.raises(TypeError, match=r"^tree: expected a Tree or a TreeBatch, got tuple"):
        ss.verify((P5, T5), logits[:5], seed=[1, 2])


# --------------------------------------------------------------------------- zero copy


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_view_shares_memory(dtype):
    base = torch.randn(16, 300).to(dtype)
    for t in (base, base[3:11], base[:, 5:200:3], base.T, base[1::2, ::2]):
        arr, tag = _torch.cpu_view(t)
        assert tag == ("bfloat16" if dtype == torch.bfloat16 else None)
        assert arr.__array_interface__["data"][0] == t.data_ptr()
        assert arr.shape == tuple(t.shape)
        assert arr.strides == tuple(s * t.element_size() for s in t.stride())
        assert arr.itemsize == t.element_size()
        if dtype != torch.bfloat16:
            assert np.shares_memory(arr, base.numpy())
            assert np.array_equal(arr, t.numpy())
        else:
            assert np.shares_memory(arr, base.view(torch.int16).numpy())
            assert np.array_equal(arr, t.view(torch.int16).numpy())
    grad = base.float().requires_grad_(True)
    arr, _ = _torch.cpu_view(grad)
    assert arr.__array_interface__["data"][0] == grad.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["C", "T", "cols"])
def test_torch_logits_are_read_in_place(dtype, kind):
    n = 64 if dtype == torch.float32 else 128  # 32 MB
    t, x = chain_logits(n, 128256, dtype)
    logits = tensor_in_layout(as_f64(x), dtype, kind) if kind != "C" else x
    del x
    tracemalloc.start()
    try:
        r = ss.verify(t, logits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.num_accepted == n - 1
    assert peak < logits.nbytes / 64 if kind == "C" else peak < 32e6 / 64


LOGITS_IN_PLACE = """
import torch
vocab = 128256
# Resident logits of 64, 256 and 256 MB in three layouts and formats, each case's memory and
# a copy of its logits past the earlier peak (so a copy would show): the chain is accepted to
# its end, so every row is read.
cases = ((torch.bfloat16, 256, "T"), (torch.float32, 512, "C"), (torch.float32, 512, "cols"))
for dtype, n, kind in cases:
    base = torch.zeros((vocab, n) if kind == "T" else (n, 2 * vocab if kind == "cols" else vocab))
    x = base.T if kind == "T" else base[:, ::2] if kind == "cols" else base
    x = x.to(dtype) if dtype != torch.float32 else x
    x[:, 7] = 1
    verify_peak(kind, x, n * vocab * x.element_size())
    del base, x
"""


def test_torch_logits_allocate_nothing_of_their_size():
    """The peak resident size, which sees torch's and Rust's allocators as tracemalloc does
    not: verifying resident logits (bf16 transposed, f32 contiguous, f32 every other column)
    raises it by far less than a copy of them would. Fresh interpreter, as below."""
    assert_read_in_place(LOGITS_IN_PLACE, 3, 8)


EXPANDED_LOGITS = """
import torch
vocab = 128256
for dtype, n in ((torch.bfloat16, 1024), (torch.float16, 2048), (torch.float32, 4096)):
    row = torch.zeros(vocab, dtype=dtype)
    row[7] = 1
    x = row.expand(n, vocab)
    verify_peak(str(dtype), x, n * vocab * x.element_size())
"""


def test_expanded_torch_logits_are_never_materialised():
    """Zero-stride torch views of 0.25, 0.5 and 2 GB (one real row each): reading them in place
    costs nothing; a copy would raise the peak resident size by about its size (each view is
    twice the previous one, so a copy beats the earlier peak). Measured in a fresh interpreter,
    whose earlier peak is small."""
    assert_read_in_place(EXPANDED_LOGITS, 3, 4)


# -------------------------------------------------------------------------------- KV cache


def verified(parents, tokens, rnd):
    target = []
    for kids in children(parents):
        if kids and rnd.random() < 0.8:
            target.append(tokens[rnd.choice(kids)])
        else:
            target.append(rnd.randrange(VOCAB))
    return ss.verify(ss.Tree(parents, tokens), target_tokens=target), target


def cache_tensor(shape, dtype, kind: str, seed: int):
    """`(view, base)`: a CPU tensor of `shape` with distinct values, in layout `kind`."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    vals = (torch.randperm(n, generator=g) % 250 - 125).reshape(shape).to(dtype)
    if kind == "C":
        return vals, vals
    if kind == "T":
        base = vals.permute(*reversed(range(len(shape)))).contiguous()
        return base.permute(*reversed(range(len(shape)))), base
    if kind == "slice":
        base = torch.zeros([2 * s + 1 for s in shape], dtype=dtype)
        view = base[(slice(1, None, 2),) * len(shape)]
        view.copy_(vals)
        return view, base
    raise AssertionError(kind)


def f64(t):
    return t.to(torch.float64).numpy() if t.dtype.is_floating_point else t.numpy()


@SETTINGS
@given(
    trees(1, 32, VOCAB),
    st.randoms(use_true_random=False),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64]),
    st.sampled_from(["C", "T", "slice"]),
    st.sampled_from([0, 1, -1]),
    st.integers(0, 4),
    st.integers(0, 2**31),
)
def test_compact_kv_torch_cpu_matches_reference(tree, rnd, dtype, kind, seq, prefix, seed):
    parents, tokens = tree
    r, _ = verified(parents, tokens, rnd)
    shape = [2, 3, 2]
    shape[seq] = prefix + len(parents) + 1
    cache, base = cache_tensor(shape, dtype, kind, seed)
    expected = f64(cache).copy()
    ref.compact_kv(expected, ref.kv_compaction_plan(r.accepted_nodes.tolist(), prefix), seq)
    ptr, base_before = cache.data_ptr(), base.clone()
    assert ss.compact_kv(cache, r, prefix, seq) == prefix + r.num_accepted + 1
    assert cache.data_ptr() == ptr
    assert np.array_equal(f64(cache), expected)
    if kind == "slice":  # the elements of the base outside the view are untouched
        mask = torch.ones(base.shape, dtype=torch.bool)
        mask[(slice(1, None, 2),) * base.ndim] = False
        assert torch.equal(base[mask], base_before[mask])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool])
@pytest.mark.parametrize(("batch_dim", "seq_dim"), [(None, 2), (0, 1), (1, 0), (-1, 1), (2, -3)])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("active", [None, [False, True]])
def test_batch_compact_kv_torch_cpu(dtype, batch_dim, seq_dim, transposed, active):
    t1, t2 = ss.Tree(P5, T5), ss.Tree.chain([1, 2, 3, 4])
    rb = ss.verify(ss.TreeBatch([t1, t2]), target_tokens=[11, 14, 0, 0, 77, 2, 3, 9, 0])
    assert rb.accepted_nodes.tolist() == [[0, 1, 4, -1], [0, 1, 2, -1]]
    prefixes = [3, 1]
    bd = 0 if batch_dim is None else batch_dim % 3
    shape = [4, 4, 4]
    shape[bd] = 2
    shape[seq_dim % 3] = 9
    g = torch.Generator().manual_seed(5)
    cache = (torch.randperm(int(np.prod(shape)), generator=g) % 200).reshape(shape).to(dtype)
    if transposed:  # same values, axes stored in reverse order
        cache = cache.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    ptr = cache.data_ptr()
    expected = f64(cache).copy()
    plan = ref.batch_kv_compaction_plan(rb.accepted_nodes.tolist(), prefixes, active)
    ref.compact_kv(expected, plan, seq_dim, bd)
    kwargs: dict[str, Any] = {} if batch_dim is None else {"batch_dim": batch_dim}
    if active is not None:
        kwargs["active"] = torch.tensor(active)  # a torch bool tensor, read on the host
    committed = ss.compact_kv(cache, rb, torch.tensor(prefixes), seq_dim, **kwargs)
    commits = [True, True] if active is None else active
    assert committed.tolist() == [
        p + (k + 1 if c else 0)
        for p, k, c in zip(prefixes, rb.num_accepted.tolist(), commits, strict=True)
    ]
    assert cache.data_ptr() == ptr
    assert np.array_equal(f64(cache), expected)


def test_compact_kv_torch_raw_dtypes_and_bad_input():
    r = ss.verify(ss.Tree(P5, T5), target_tokens=[11, 14, 0, 0, 77])  # 0, 1, 4
    f8 = getattr(torch, "float8_e4m3fn", None)
    for dtype in [torch.complex64, torch.bool, torch.uint8] + ([f8] if f8 else []):
        cache = (torch.arange(16) % 7).to(torch.uint8).view(torch.uint8).reshape(8, 2)
        cache = cache.to(dtype) if dtype != f8 else cache.view(dtype)
        raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
        before = raw.clone()
        ss.compact_kv(cache, r, 1, 0)
        after = cache.view(torch.uint8) if cache.element_size() == 1 else cache
        assert torch.equal(after[3], before[5])
        assert torch.equal(after[[0, 1, 2, 4, 5, 6, 7]], before[[0, 1, 2, 4, 5, 6, 7]])
    # the moves reach a tensor that requires grad (through its detached storage)
    cache = torch.arange(8.0).requires_grad_(True)
    ss.compact_kv(cache, r, 0, 0)
    assert cache.detach().tolist() == [0, 1, 4, 3, 4, 5, 6, 7]
    # overlapping memory is refused and left alone
    base = torch.arange(8.0)
    with pytest.raises(ValueError, match="overlap"):
        ss.compact_kv(base[:, None].expand(8, 4), r, 0, 0)
    assert base.tolist() == list(range(8))
    with pytest.raises(ValueError, match="cache"):
        ss.compact_kv(torch.zeros(4, 2), r, 0, 0)
    with pytest.raises(TypeError, match="result"):
        ss.compact_kv(torch.zeros(8, 2), "nope", 0, 0)


def test_commit_slots_and_plans_with_torch():
    t = ss.Tree(P5, T5)
    r = ss.verify(t, target_tokens=[11, 14, 0, 0, 77])
    for dtype in (torch.int64, torch.int32):
        kept, freed = ss.commit_slots(torch.tensor([50, 51, 52, 53, 54], dtype=dtype), r)
        assert isinstance(kept, torch.Tensor) and isinstance(freed, torch.Tensor)
        assert kept.dtype == freed.dtype == torch.int64
        assert kept.device == freed.device == torch.device("cpu")
        assert (kept.tolist(), freed.tolist()) == ([50, 51, 54], [52, 53])
    rb = ss.verify(ss.TreeBatch([t, t]), target_tokens=[11, 14, 0, 0, 77, 12, 0, 0, 0, 0])
    slots = torch.arange(100, 120)[::2]
    kept, freed = ss.commit_slots(slots, rb)
    want = ref.batch_commit_slots(slots.tolist(), [0, 5, 10], rb.accepted_nodes.tolist())
    assert (kept.tolist(), freed.tolist()) == want
    req, src, dst = ss.kv_compaction_plan(rb, torch.tensor([3, 100]))
    assert (req.tolist(), src.tolist(), dst.tolist()) == ([0, 1], [7, 102], [5, 101])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch_dim", "seq_dim"), [(None, 1), (0, 2), (2, 0), (1, -1)])
def test_device_compaction_path_on_cpu(dtype, batch_dim, seq_dim):
    """The CUDA branch of compact_kv (checked moves from `cache_moves`, then one indexed copy on
    the tensor's device) run on a CPU tensor gives the host path's result."""
    trees_ = [ss.Tree.chain([1, 2, 3, 4, 5]), ss.Tree(P5, T5), ss.Tree([-1, 0, 0, 2], [0, 1, 2, 3])]
    rb = ss.verify(
        ss.TreeBatch(trees_), target_tokens=[2, 3, 4, 5, 0, 11, 14, 0, 0, 77, 2, 0, 3, 9]
    )
    assert rb.accepted_nodes.tolist() == [[0, 1, 2, 3, 4], [0, 1, 4, -1, -1], [0, 2, 3, -1, -1]]
    g = torch.Generator().manual_seed(11)
    shape = [3, 3, 3]
    shape[0 if batch_dim is None else batch_dim % 3] = 3
    shape[seq_dim % 3] = 12
    cases = [(rb, [2, 0, 7], batch_dim, None), (rb[1], 4, None, None), (rb[2], 0, None, None)]
    cases.append((rb, [2, 0, 7], batch_dim, np.array([False, True, True])))
    for result, prefix, bdim, active in cases:
        cache = (torch.randperm(27 * 4, generator=g)[: int(np.prod(shape))] % 250).to(dtype)
        cache = cache.reshape(shape)
        host = cache.clone()
        kwargs: dict[str, Any] = {} if bdim is None else {"batch_dim": bdim}
        if active is not None:
            kwargs["active"] = active
        committed = ss.compact_kv(host, result, prefix, seq_dim, **kwargs)
        assert not torch.equal(host, cache)  # every case moves something
        *moves, committed_elsewhere = _core.cache_moves(
            list(cache.shape), result, prefix, seq_dim, bdim, active
        )
        np.testing.assert_array_equal(committed_elsewhere, committed)
        # Two tensors of one shape (a layer's keys and values): one copy of the indices.
        dev = [cache.clone(), (cache + 1).clone()]
        _torch.compact_on_device(dev, tuple(moves))
        assert torch.equal(dev[0], host)
        host_plus = cache + 1
        ss.compact_kv(host_plus, result, prefix, seq_dim, **kwargs)
        assert torch.equal(dev[1], host_plus)


def test_compact_kv_of_a_list_of_cpu_tensors_and_arrays():
    """Torch CPU tensors of any dtype (bfloat16 included) and numpy arrays in one list, one
    plan: each ends as a call of its own leaves it, in place (no copy)."""
    t = ss.Tree(P5, T5)
    rb = ss.verify(ss.TreeBatch([t, t]), target_tokens=[11, 14, 0, 0, 77, 12, 0, 0, 0, 0])
    g = torch.Generator().manual_seed(3)
    shape = (2, 4, 9, 3)  # [B, H, S, D]
    base = torch.randn(shape, generator=g)
    buffers: list[Any] = [
        base.to(d).clone() for d in (torch.float32, torch.bfloat16, torch.float16)
    ]
    buffers += [base.to(torch.int8).transpose(1, 2).contiguous().transpose(1, 2)]  # strided
    buffers += [base.numpy().copy()]
    alone = [b.clone() if isinstance(b, torch.Tensor) else b.copy() for b in buffers]
    ptrs = [b.data_ptr() if isinstance(b, torch.Tensor) else b.ctypes.data for b in buffers]
    got = ss.compact_kv(buffers, rb, [1, 3], seq_dim=2, batch_dim=0)
    for one in alone:
        want = ss.compact_kv(one, rb, [1, 3], seq_dim=2, batch_dim=0)
        np.testing.assert_array_equal(got, want)
    for b, one, ptr in zip(buffers, alone, ptrs, strict=True):
        if isinstance(b, torch.Tensor):
            assert torch.equal(b, one) and b.data_ptr() == ptr
        else:
            assert np.array_equal(b, one) and b.ctypes.data == ptr


def test_cache_buffer_checks_on_tensor_descriptions():
    """What the device path checks before any move (`_core.check_cache_buffers` on
    `(address, shape, byte strides, itemsize)`), shown on CPU tensors."""
    x = torch.zeros(4, 10, 6)
    desc = _torch.buffer_description
    _core.check_cache_buffers([desc(x[:2]), desc(x[2:])])
    with pytest.raises(ValueError, match="entries 0 and 1 may share memory"):
        _core.check_cache_buffers([desc(x[:3]), desc(x[1:])])
    with pytest.raises(ValueError, match="entries 0 and 1 may share memory"):
        _core.check_cache_buffers([desc(x[:2, :, ::2]), desc(x[:2, :, 1::2])])
    with pytest.raises(ValueError, match=r"cache\[1\]: shape"):
        _core.check_cache_buffers([desc(x[:2]), desc(x[2:, :5])])
    with pytest.raises(ValueError, match="empty"):
        _core.check_cache_buffers([])
    # A broadcast buffer is refused before any move, by name (the device path writes the
    # buffers one after another, so the device's own refusal would come too late).
    wide = torch.zeros(2, 1, 6).expand(2, 10, 6)
    with pytest.raises(ValueError, match=r"cache\[1\]: has overlapping memory"):
        _core.check_cache_buffers([desc(x[:2]), desc(wide)])
    with pytest.raises(ValueError, match=r"^cache: has overlapping memory"):
        _core.check_cache_buffers([desc(wide)], listed=False)
    # A meta tensor has no memory to describe: refused by name before any check.
    rb = ss.verify(ss.Tree(P5, T5), target_tokens=[11, 14, 0, 0, 77])
    keys = torch.zeros(8, 3)
    with pytest.raises(ValueError, match=r"cache\[1\]: a tensor on the meta device"):
        ss.compact_kv([keys, torch.zeros(8, 3, device="meta")], rb, 0, 0)
    assert not keys.any()


@pytest.mark.parametrize(
    "call",
    [
        lambda b, m: b.positions(m),
        lambda b, m: b.attention_mask(m),
        lambda b, m: b.padded_layout(m),
        lambda b, m: b.limit_depth(m),
    ],
    ids=["positions", "attention_mask", "padded_layout", "limit_depth"],
)
def test_tree_layouts_refuse_meta_per_request_args(call: Callable[..., Any]) -> None:
    # docs/api.md "Hostile input": a meta tensor is a ValueError naming the argument, here
    # as in kv_compaction_plan (numpy's own refusal was a TypeError about conversion).
    b = ss.TreeBatch([ss.Tree.chain([1, 2]), ss.Tree.chain([3])])
    with pytest.raises(ValueError, match=r"^(prefix_lens|max_depth): a tensor on the meta"):
        call(b, torch.empty(2, dtype=torch.int64, device="meta"))


# ---------------------------------------------------------------------------------- CUDA


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_verify_and_compact_match_cpu(dtype):
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    rnd = random.Random(0)
    for _ in range(20):
        n_trees = rnd.randint(1, 6)
        parents, tokens, offsets = [], [], [0]
        for _ in range(n_trees):
            n = rnd.randint(1, 24)
            p = [-1] + [rnd.randrange(i) for i in range(1, n)]
            parents += p
            tokens += [rnd.randrange(VOCAB) for _ in p]
            offsets.append(len(parents))
        x = np.concatenate(
            [make_logits(rng, parents[s:e], tokens[s:e], 3000) for s, e in pairs(offsets)]
        )
        cpu = torch.from_numpy(x).to(dtype)
        b = ss.TreeBatch.from_flat(parents, tokens, offsets)
        want = ss.verify(b, cpu)
        num, acc, tok = ref_batch(parents, tokens, offsets, as_f64(cpu))
        assert want.accepted_nodes.tolist() == acc
        for reduce in ("auto", "device"):
            got = ss.verify(b, cpu.to(dev), reduce=reduce)
            assert got.num_accepted.tolist() == num
            assert got.accepted_nodes.tolist() == acc
            assert got.tokens.tolist() == tok
        s, e = offsets[0], offsets[1]
        one = ss.verify(b[0], cpu[s:e].to(dev))
        check_single(one, acc[0][: num[0] + 1], tok[0][: num[0] + 1])
        # strided CUDA logits
        wide = torch.zeros(cpu.shape[0], 2 * cpu.shape[1], dtype=dtype, device=dev)
        wide[:, ::2] = cpu.to(dev)
        assert ss.verify(b, wide[:, ::2]).tokens.tolist() == tok
        # target tokens on the device
        choice = cpu.to(dev).argmax(dim=-1)
        assert ss.verify(b, target_tokens=choice).tokens.tolist() == tok

        # compaction of a CUDA cache, batch axis 1, sequence axis 2
        shape = [3, n_trees, max(e - s for s, e in pairs(offsets)) + 4, 5]
        cache = torch.randn(shape).to(dtype)
        host = cache.clone()
        ss.compact_kv(host, want, 2, 2, batch_dim=1)
        on_dev = cache.to(dev)
        ptr = on_dev.data_ptr()
        ss.compact_kv(on_dev, want, 2, 2, batch_dim=1)
        assert on_dev.data_ptr() == ptr
        assert torch.equal(on_dev.cpu(), host)
        # every layer's keys and values in one call: one plan, one copy of its indices
        layers = [cache.clone() for _ in range(4)]
        on_dev_layers = [layer.to(dev) for layer in layers]
        ss.compact_kv(on_dev_layers, want, 2, 2, batch_dim=1)
        for layer, moved in zip(layers, on_dev_layers, strict=True):
            ss.compact_kv(layer, want, 2, 2, batch_dim=1)
            assert torch.equal(moved.cpu(), layer)
        with pytest.raises(ValueError, match="entries 0 and 1 may share memory"):
            ss.compact_kv([on_dev, on_dev], want, 2, 2, batch_dim=1)
        with pytest.raises(ValueError, match="host buffers"):
            ss.compact_kv([on_dev, np.zeros(shape)], want, 2, 2, batch_dim=1)
        # single result, sequence axis first
        single = cache[:, 0].transpose(0, 1).contiguous()
        host1 = single.clone()
        ss.compact_kv(host1, want[0], 1, 0)
        on_dev1 = single.to(dev)
        ss.compact_kv(on_dev1, want[0], 1, 0)
        assert torch.equal(on_dev1.cpu(), host1)
        # paged slots on the device
        slots = torch.arange(len(parents), device=dev) * 3
        kept, freed = ss.commit_slots(slots, want)
        assert kept.device.type == freed.device.type == "cuda"
        ref_kept, ref_freed = ss.commit_slots(slots.cpu(), want)
        assert torch.equal(kept.cpu(), ref_kept) and torch.equal(freed.cpu(), ref_freed)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_nan_and_errors(dtype):
    dev = torch.device("cuda")
    t, x = chain_logits(6, 3000, dtype)
    x[3, 1234] = float("nan")
    with pytest.raises(ValueError, match=r"row 3\b"):
        ss.verify(t, x.to(dev))
    x[3, 1234] = 0
    x[5, 17] = float("nan")  # row 5 is the last node: visited
    x[4] = float("nan")  # ... and so is row 4: the walk stops at the first NaN
    with pytest.raises(ValueError, match=r"row 4\b"):
        ss.verify(t, x.to(dev))
    tp = ss.Tree(P5, T5)
    y = torch.zeros(5, 20, dtype=dtype)
    y[0, 12] = 1
    y[2, 7] = 1
    y[[1, 3, 4]] = float("nan")
    check_single(ss.verify(tp, y.to(dev)), [0, 2], [12, 7])
    with pytest.raises(ValueError, match="reduce"):
        ss.verify(tp, y.to(dev), reduce="host")
    with pytest.raises(ValueError, match="logits"):
        ss.verify(tp, y[:4].to(dev))
    r = ss.verify(tp, target_tokens=[11, 14, 0, 0, 77])
    with pytest.raises(ValueError, match="cache"):
        ss.compact_kv(torch.zeros(4, 2, device=dev), r, 0, 0)
    with pytest.raises(ValueError, match="seq_dim"):
        ss.compact_kv(torch.zeros(8, 2, device=dev), r, 0, 2)


class _OffHost(torch.Tensor):
    """Stands in for an MPS / XPU tensor on this CPU-only machine: torch ops keep the type,
    and numpy cannot read it until `.cpu()` has copied it to the host."""

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise TypeError("can't convert an off-host tensor to numpy: use Tensor.cpu() first")

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return self.as_subclass(torch.Tensor)


def test_device_reduction_on_a_non_cuda_device() -> None:
    """Any non-CPU device takes the device path; its choices come back through .cpu()."""
    tree = ss.Tree([-1, 0, 0, 1], [5, 6, 7, 8])
    logits = torch.zeros(4, 10)
    for row, best in enumerate([6, 8, 0, 2]):
        logits[row, best] = 1.0
    logits[2] = float("nan")  # node 2 is not on the accepted path
    off_host = logits.as_subclass(_OffHost)
    with pytest.raises(TypeError, match=r"use Tensor\.cpu"):
        off_host.numpy()  # the stand-in has teeth
    choice, nan_rows = _torch.device_argmax(off_host)
    assert choice.tolist()[:2] == [6, 8] and choice.tolist()[3] == 2
    assert nan_rows.tolist() == [False, False, True, False]
    # The sampler's choices cross the same way (greedy rows and sampled ones).
    want = ss.verify(tree, logits, reduce="device", temperature=0.5, seed=3)
    got = ss.verify(tree, off_host, reduce="device", temperature=0.5, seed=3)
    assert got.tokens.tolist() == want.tokens.tolist()
    with pytest.raises(TypeError, match="logits"):
        ss.verify(tree, torch.zeros(4, 10, dtype=torch.float8_e4m3fn))


def test_host_views_of_a_tensor_are_keyed_by_its_storage() -> None:
    """rust-numpy's borrow registry tells buffers apart by a view's first base that is not an
    array: `t.numpy()`'s is the tensor object, a new one per `detach()` or slice, so two
    specsched calls on one tensor never saw each other (tests/test_concurrency.py races them).
    Every host view specsched makes of a CPU tensor is based on the tensor's storage object,
    one per storage, which keeps the memory alive."""
    t = torch.arange(12, dtype=torch.float32)
    storage = t.untyped_storage()
    views = [
        _torch.numpy_of(t),
        _torch.numpy_of(t[3:].detach()),
        _torch.cpu_view(t.view(3, 4).T, "logits")[0],
        _torch.raw_cpu_view(t.to(torch.bfloat16), "cache"),
        _torch.host_view(t),
    ]
    for v in views[:3] + views[4:]:
        assert v.base is storage
        assert np.shares_memory(v, views[0])
    assert views[3].base is not storage  # another tensor's storage (a converted copy)
    assert views[2].shape == (4, 3) and views[2].strides == (4, 16)
    assert views[2].flags.writeable
    frozen = np.arange(3.0)
    assert _core.key_by_storage(frozen, t) is frozen  # not in the storage: as it is
    kept = _torch.numpy_of(t[5:])
    del t, storage, views
    assert kept.tolist() == [float(x) for x in range(5, 12)]  # the storage outlives `t`
