"""Sampled verification of a batch from host logits: B=8 trees of N=64 nodes, V in {32000,
128256}, float32 logits, temperature 0.8 with top-p 0.95 (a typical serving setting), and
temperature alone (where the peer needs no sort: its cheapest every-row formulation).

Contenders:
- `rust`: `ss.verify(batch, logits, temperature=0.8, top_p=0.95, seed=...)`: Rust processes
  (temperature → top-k → top-p) and samples only the rows the walk visits;
- `reference`: `reference.batch_verify_sampled`, pure Python over the visited rows (one round:
  seconds per call at these vocabularies); its tokens must equal Rust's (same counter-based RNG);
- `torch_peer`: the vectorized formulation serving code writes (vLLM's sampler style):
  softmax every row `[T, V]` at the temperature, top-p by a full descending sort, one draw per
  row by inverse CDF (cumsum + searchsorted: ~10x faster on CPU than `torch.multinomial` or
  the exponential race at these sizes), then the EAGLE-style path match of
  benches/test_verify.py. Its draws come from torch's generator, so
  it is checked for consistency (its path is the walk of its own choices), not for equality.
Inputs (trees, logits, path index) are built outside the timed call; torch runs on one
intra-op thread (see benches/test_verify.py for why).
"""

from __future__ import annotations

import pytest
import specsched as ss
import torch
from bench_inputs import run
from specsched import reference as ref
from test_verify import (
    TorchPaths,
    check_same,
    logits_case,
    rust_arrays,
    torch_threads,
    torch_verify,
)

VOCABS = [32000, 128256]
TEMPERATURE, SEED = 0.8, 1234
TOP_PS = [0.95, 1.0]
CONTENDERS = ["rust", "reference", "torch_peer"]


def torch_sample_every_row(
    logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator
) -> torch.Tensor:
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    # Inverse CDF: on CPU ~10x faster than torch.multinomial or the exponential race here.
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((len(cdf), 1), generator=gen, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)


# The reference (seconds per call) is timed with top-p only, its costlier case.
CASES = [
    (p, v, c)
    for p in TOP_PS
    for v in VOCABS
    for c in CONTENDERS
    if not (p == 1.0 and c == "reference")
]


@pytest.mark.parametrize(
    ("top_p", "vocab", "contender"), CASES, ids=[f"p{p}-V{v}-{c}" for p, v, c in CASES]
)
def test_verify_sampled(benchmark, top_p, vocab, contender):
    benchmark.group = f"verify sampled B=8 N=64 V={vocab} f32 T={TEMPERATURE} top_p={top_p}"
    batch, logits = logits_case(vocab)
    tree_batch = batch.tree_batch()
    kw = {"temperature": TEMPERATURE, "top_p": top_p, "seed": SEED}
    expected = ss.verify(tree_batch, logits, **kw)
    rounds = None
    if contender == "rust":

        def fn():
            return rust_arrays(ss.verify(tree_batch, logits, **kw))

    elif contender == "reference":
        lists = batch.lists()
        nb = len(lists["offsets"]) - 1
        rounds = 1

        def fn():
            return ref.batch_verify_sampled(
                lists["parents"],
                lists["tokens"],
                lists["offsets"],
                logits,  # rows are read (and converted) only where the walk goes
                [TEMPERATURE] * nb,
                [0] * nb,
                [top_p] * nb,
                SEED,
            )

    else:
        paths = TorchPaths(batch)
        tokens, logits_t = torch.from_numpy(batch.tokens), torch.from_numpy(logits)
        gen = torch.Generator().manual_seed(SEED)

        def fn():
            choice = torch_sample_every_row(logits_t, TEMPERATURE, top_p, gen)
            return (*torch_verify(paths, tokens, choice), choice)

    with torch_threads(1):
        got = run(benchmark, fn, rounds=rounds)
    if contender == "torch_peer":
        *arrays, choice = got
        check_same(arrays, ss.verify(tree_batch, target_tokens=choice.numpy()))
    else:
        check_same(got, expected)
