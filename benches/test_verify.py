"""Greedy verification of a batch: from the target's tokens, and from host logits.

Contenders return the same three arrays (`num_accepted [B]`, `accepted_nodes [B, D+1]`,
`tokens [B, D+1]`, -1 padded), checked against Rust's after timing:
- `rust`: `ss.verify(batch, target_tokens=...)` / `ss.verify(batch, logits)` (numpy logits:
  Rust reduces only the rows the walk visits);
- `reference`: `reference.batch_verify_walk` over lists / `reference.verify_logits` per tree;
- `torch_peer`: the EAGLE-style tensor code: gather tokens and choices along every root-to-leaf
  path (`[B, L, D+1]`, precomputed once per tree shape like EAGLE's `retrieve_indices`), match
  each draft token against the parent's choice, cumprod along depth, take the longest path.
  From logits it first argmaxes every row (`[T, V]` -> `[T]`) with `torch.argmax`;
- `numpy_argmax_peer` (logits only): the same walk after `np.argmax` over every row, which is
  several times faster than torch's CPU argmax here: the strongest full reduction we found.
The trees, the batch and the path index are built outside the timed call.

The torch peers run with one intra-op thread. On a small shared host (CI, a 2-core VM) an
OpenMP barrier waits for whichever thread another process has descheduled, and the 2-thread
timings of `B=256` swung between 5 and 35 ms where one thread held a steady 2.5 ms; the
tensors here are too small for threads to pay off anyway. Rust keeps its rayon pool, which
it only uses above 64k units of work (a large-vocabulary logits batch).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import specsched as ss
import torch
from bench_inputs import Batch, make_batch, run, uniform_batch
from specsched import reference as ref

CONTENDERS = ["rust", "reference", "torch_peer"]


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TorchPaths:
    """What the torch peer precomputes per batch shape: the root-to-leaf path index."""

    def __init__(self, batch: Batch) -> None:
        paths = torch.from_numpy(batch.tree_batch().paths().astype(np.int64))  # [B, L, D+1]
        self.paths = paths
        # A copy: the batch's offsets may be a read-only view (torch warns on those).
        starts = torch.tensor(batch.offsets[:-1])[:, None, None]
        self.flat = paths.clamp(min=0) + starts  # flat node index, padding -> the tree's root
        self.real_child = paths[..., 1:] >= 0  # [B, L, D]: path position j+1 holds a node
        self.width = paths.shape[-1]
        self.rows = torch.arange(paths.shape[0])


def torch_verify(
    p: TorchPaths, tokens: torch.Tensor, choice: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-style greedy acceptance from the target's choice per node (`[T]`)."""
    draft = tokens[p.flat]  # [B, L, D+1]
    target = choice[p.flat]  # [B, L, D+1]
    match = (draft[..., 1:] == target[..., :-1]) & p.real_child
    length = match.to(torch.int32).cumprod(dim=-1).sum(dim=-1)  # [B, L]
    best = length.argmax(dim=-1)  # [B]; ties: the lowest leaf, same path prefix
    k = length[p.rows, best]
    keep = torch.arange(p.width) <= k[:, None]
    nodes = torch.where(keep, p.paths[p.rows, best], -1)
    emitted = torch.where(keep, target[p.rows, best], -1)  # choice at each accepted node
    return k, nodes, emitted


def check_same(got: Any, expected: ss.BatchVerifyResult) -> None:
    num_accepted, nodes, tokens = (np.asarray(x) for x in got)
    np.testing.assert_array_equal(num_accepted, expected.num_accepted)
    np.testing.assert_array_equal(nodes, expected.accepted_nodes)
    np.testing.assert_array_equal(tokens, expected.tokens)


def rust_arrays(result: ss.BatchVerifyResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return result.num_accepted, result.accepted_nodes, result.tokens


# --------------------------------------------------------------------------------------------
# from the target's tokens
# --------------------------------------------------------------------------------------------

TOKEN_SIZES = [(b, n) for b in (1, 32, 256) for n in (8, 64)]


@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize(
    ("num_trees", "num_nodes"), TOKEN_SIZES, ids=[f"B{b}-N{n}" for b, n in TOKEN_SIZES]
)
def test_verify_tokens(benchmark, num_trees, num_nodes, contender):
    benchmark.group = f"verify tokens B={num_trees} N={num_nodes}"
    batch = uniform_batch(num_trees, num_nodes)
    tree_batch = batch.tree_batch()
    if contender == "rust":
        choices = batch.choices

        def fn():
            return rust_arrays(ss.verify(tree_batch, target_tokens=choices))

    elif contender == "reference":
        lists = batch.lists()
        args = (lists["parents"], lists["tokens"], lists["offsets"], lists["choices"])

        def fn():
            return ref.batch_verify_walk(*args)

    else:
        paths = TorchPaths(batch)
        tokens, choices = torch.from_numpy(batch.tokens), torch.from_numpy(batch.choices)

        def fn():
            return torch_verify(paths, tokens, choices)

    with torch_threads(1):
        got = run(benchmark, fn)
    check_same(got, ss.verify(tree_batch, target_tokens=batch.choices))


# --------------------------------------------------------------------------------------------
# from host logits
# --------------------------------------------------------------------------------------------

LOGIT_TREES, LOGIT_NODES = 8, 64
VOCABS = [32000, 128256]


@functools.cache
def logits_case(vocab: int) -> tuple[Batch, np.ndarray]:
    """A batch over `vocab` and float32 logits `[T, vocab]` whose argmax at each node is
    `batch.choices` (the first child's token with probability 0.7), margins well above noise."""
    batch = make_batch([LOGIT_NODES] * LOGIT_TREES, seed=vocab, vocab=vocab)
    rng = np.random.default_rng(vocab + 1)
    logits = rng.standard_normal((len(batch.parents), vocab), dtype=np.float32)
    logits[np.arange(len(batch.parents)), batch.choices] = 10.0
    return batch, logits


class LazyRows:
    """`rows[i]` -> row `start + i` of the logits as a list, converted only when asked."""

    def __init__(self, logits: np.ndarray, start: int) -> None:
        self.logits, self.start = logits, start

    def __getitem__(self, i: int) -> list[float]:
        return self.logits[self.start + i].tolist()


def reference_verify_logits(lists: dict[str, list[int]], logits: np.ndarray):
    """`reference.verify_logits` per tree, padded like `batch_verify_walk`."""
    parents, tokens, offsets = lists["parents"], lists["tokens"], lists["offsets"]
    spans = list(itertools.pairwise(offsets))
    width = max(max(ref.depths(parents[s:e])) for s, e in spans) + 1
    num_acc, nodes_out, tokens_out = [], [], []
    for s, e in spans:
        nodes, emitted = ref.verify_logits(parents[s:e], tokens[s:e], LazyRows(logits, s))
        num_acc.append(len(nodes) - 1)
        nodes_out.append(nodes + [-1] * (width - len(nodes)))
        tokens_out.append(emitted + [-1] * (width - len(emitted)))
    return num_acc, nodes_out, tokens_out


DTYPES = ["float32", "float16", "bfloat16"]


@functools.cache
def typed_logits_case(vocab: int, dtype: str) -> tuple[Batch, Any]:
    """`logits_case` as a model hands it over: float32 as numpy, float16 and bfloat16 rounded
    into a torch CPU tensor (the 10.0 at each node's choice stays its unique maximum)."""
    batch, logits = logits_case(vocab)
    if dtype == "float32":
        return batch, logits
    return batch, torch.from_numpy(logits).to(getattr(torch, dtype))


@pytest.mark.parametrize("contender", [*CONTENDERS, "numpy_argmax_peer"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS, ids=[f"V{v}" for v in VOCABS])
def test_verify_logits(benchmark, vocab, dtype, contender):
    """Host logits read in place: Rust reduces only the visited rows (float16 widened a block
    at a time with F16C, bfloat16 by a shift). numpy has no bfloat16, so no numpy peer there."""
    if contender == "numpy_argmax_peer" and dtype == "bfloat16":
        pytest.skip("numpy has no bfloat16")
    short = {"float32": "f32"}.get(dtype, dtype)
    benchmark.group = f"verify logits B={LOGIT_TREES} N={LOGIT_NODES} V={vocab} {short}"
    batch, logits = typed_logits_case(vocab, dtype)
    host = logits if isinstance(logits, np.ndarray) else None
    tree_batch = batch.tree_batch()
    rounds = None
    if contender == "rust":

        def fn():
            return rust_arrays(ss.verify(tree_batch, logits))

    elif contender == "reference":
        lists = batch.lists()
        wide = host if host is not None else logits.float().numpy()  # widened untimed
        rounds = 3 if vocab <= 32000 else 1  # pure-Python argmax: 50 ms / 0.3 s per call

        def fn():
            return reference_verify_logits(lists, wide)

    elif contender == "torch_peer":
        paths = TorchPaths(batch)
        tokens = torch.from_numpy(batch.tokens)
        logits_t = torch.from_numpy(host) if host is not None else logits

        def fn():
            return torch_verify(paths, tokens, logits_t.argmax(dim=-1))

    else:
        paths = TorchPaths(batch)
        tokens = torch.from_numpy(batch.tokens)
        array = host if host is not None else logits.numpy()

        def fn():
            return torch_verify(paths, tokens, torch.from_numpy(array.argmax(axis=-1)))

    with torch_threads(1):
        got = run(benchmark, fn, rounds=rounds)
    check_same(got, ss.verify(tree_batch, logits))
    # The logits were built to make the target's choice `batch.choices`.
    check_same(got, ss.verify(tree_batch, target_tokens=batch.choices))
