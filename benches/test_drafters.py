"""Model-free drafters: suffix-drafter proposals and appends, n-gram proposals.

Inputs are the standard library's source at byte level (text nobody here wrote), built once
outside the timed calls.
- `propose-*`: one 32-node tree (budget 31, min_prob 0.01, max_spec_factor 32) for a request
  whose own index holds N tokens (`own`), or from a global cache of N tokens (`global`).
  Contenders: `rust` (`SuffixDrafter.propose`) and `reference` (the plain-Python twin, which
  counts by brute force; 10^4 tokens only).
- `append-*`: indexing 10^5 / 10^6 tokens at max_depth 64 as a request's prompt (`rust`
  only; the reference just stores the list): source bytes are repetitive, so the index is
  built from the sorted suffixes (see `SuffixIndex::index_sorted`). Tokens/s and bytes per
  indexed token are in `extra_info`.
- `ngram-*`: vLLM's prompt lookup over an N-token context: `rust` (`NgramDrafter`),
  `reference` (the definition, brute force; 10^4 only) and `numpy_peer` (sliding windows, the
  vectorized matcher a peer would write).
- `propose-batch`: 64 requests, `propose_batch` (parallel, GIL released) vs a loop of `propose`.
- `evict-wide-160k`: `finish_request` of a 500-token response into a full global cache of
  160k tokens whose root has ~160k children (unique tokens), so each finish evicts the oldest
  response (`rust` only). A child leaves its wide parent's list in O(1): scanning the root's
  children per freed node took 438 ms a finish here (0.3 ms now).
"""

from __future__ import annotations

import functools
import itertools
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import specsched as ss
from specsched import reference as ref

BUDGET = 31  # + root = 32 nodes


@functools.cache
def stdlib_bytes(n: int) -> np.ndarray:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for p in sorted(root.rglob("*.py")):
        if "test" in p.parts:
            continue
        out += p.read_bytes()
        if len(out) >= n:
            break
    return np.frombuffer(bytes(out[:n]), dtype=np.uint8).astype(np.int64)


@functools.cache
def own_drafter(n: int) -> ss.SuffixDrafter:
    d = ss.SuffixDrafter(max_depth=64)
    d.start_request(0, stdlib_bytes(n))
    return d


@functools.cache
def global_drafter(n: int) -> ss.SuffixDrafter:
    d = ss.SuffixDrafter(max_depth=64, max_global_tokens=2 * n)
    toks = stdlib_bytes(n)
    d.start_request(1, toks[:1])
    d.append(1, toks[1:])
    d.finish_request(1)
    # The request's context: a passage that occurs in the cache.
    d.start_request(0, toks[n // 2 : n // 2 + 200])
    return d


@pytest.mark.parametrize("contender", ["rust", "reference"])
@pytest.mark.parametrize("n", [10_000, 1_000_000])
@pytest.mark.parametrize("where", ["own", "global"])
def test_propose(benchmark, where: str, n: int, contender: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"propose-{where}-{n}"
    d = own_drafter(n) if where == "own" else global_drafter(n)
    want = d.propose(0, BUDGET, 0.01, 32.0)
    if contender == "rust":
        got = benchmark(d.propose, 0, BUDGET, 0.01, 32.0)
        assert got.tree == want.tree
        benchmark.extra_info["nodes"] = got.tree.num_nodes
        return
    if n > 10_000:
        pytest.skip("brute-force reference: 10^4 tokens only")
    toks = stdlib_bytes(n).tolist()
    r = ref.ReferenceSuffixDrafter(max_depth=64, max_global_tokens=2 * n)
    if where == "own":
        r.start_request(0, toks)
    else:
        r.start_request(1, toks[:1])
        r.append(1, toks[1:])
        r.finish_request(1)
        r.start_request(0, toks[n // 2 : n // 2 + 200])
    got_ref = benchmark.pedantic(r.propose, (0, BUDGET, 0.01, 32.0), rounds=1, iterations=1)
    assert got_ref[1] == want.tree.tokens.tolist()


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_append(benchmark, n: int) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"append-{n}"
    toks = stdlib_bytes(n)

    def index() -> ss.SuffixDrafter:
        d = ss.SuffixDrafter(max_depth=64)
        d.start_request(0, toks)
        return d

    d = benchmark(index)
    assert d.num_indexed_tokens == toks.size
    benchmark.extra_info["bytes_per_token"] = d.memory_bytes / toks.size
    if benchmark.stats is not None:
        benchmark.extra_info["tokens_per_s"] = toks.size / benchmark.stats.stats.median


def numpy_ngram(context: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The vectorized prompt lookup a peer would write: for n from max_n down, compare every
    earlier window to the last n tokens at once, take the earliest hit."""
    total = context.size
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[: total - 1], n)
        hits = np.flatnonzero((windows == context[total - n :]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return context[start : min(start + k, total)]
    return context[:0]


@pytest.mark.parametrize("contender", ["rust", "reference", "numpy_peer"])
@pytest.mark.parametrize("n", [10_000, 1_000_000])
def test_ngram(benchmark, n: int, contender: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"ngram-{n}"
    ctx = stdlib_bytes(n)
    d = ss.NgramDrafter(1, 4, 8)
    want = d.propose_tokens(ctx).tolist()
    if contender == "rust":
        got = benchmark(d.propose_tokens, ctx)
    elif contender == "numpy_peer":
        got = benchmark(numpy_ngram, ctx, 1, 4, 8)
    else:
        if n > 10_000:
            pytest.skip("brute-force reference: 10^4 tokens only")
        lst = ctx.tolist()
        got = benchmark.pedantic(ref.ngram_propose, (lst, 1, 4, 8), rounds=1, iterations=1)
    assert list(got) == want


@pytest.mark.parametrize("contender", ["rust_batch", "rust_loop"])
def test_propose_batch(benchmark, contender: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = "propose-batch-64"
    toks = stdlib_bytes(64 * 2000)
    d = ss.SuffixDrafter(max_depth=64)
    for i in range(64):
        d.start_request(i, toks[i * 2000 : (i + 1) * 2000])
    ids = np.arange(64)
    want = d.propose_batch(ids, BUDGET, 0.01, 32.0)
    if contender == "rust_batch":
        got = benchmark(d.propose_batch, ids, BUDGET, 0.01, 32.0)
        assert got == want
    else:
        trees = benchmark(lambda: [d.propose(int(i), BUDGET, 0.01, 32.0).tree for i in ids])
        assert ss.TreeBatch(trees) == want


def test_evict_wide(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = "evict-wide-160k"
    cap, size = 160_000, 500
    d = ss.SuffixDrafter(max_depth=64, max_global_tokens=cap)
    ids = itertools.count()
    fresh = itertools.count(1_000_000, size)

    def respond() -> int:
        """A live request whose response is `size` tokens never seen before."""
        rid, first = next(ids), next(fresh)
        d.start_request(rid, np.array([0]))
        d.append(rid, np.arange(first, first + size))
        return rid

    for _ in range(cap // size + 2):
        d.finish_request(respond())
    assert d.num_global_tokens <= cap
    benchmark.pedantic(d.finish_request, setup=lambda: ((respond(),), {}), rounds=30)
    assert d.num_global_tokens <= cap and d.num_requests == 0
