"""`specsched.integrations.hf.HFTarget`: transformers causal LMs in the decode loop.

Random tiny Llama (GQA, rotary; eager and sdpa attention) and GPT-2 (absolute positions)
models, built from configs here (no weights are downloaded), in float64 so a greedy tie cannot
flip between a tree forward and a one-token forward. For batch 1 and 4 (prompts of different
lengths, so the cache has padded and gapped columns):

- autoregressive decoding through the loop equals HF's own `generate` (greedy), per prompt;
- speculative greedy output equals autoregressive output for an oracle drafter (random trees
  hiding the true continuation: deep, non-contiguous acceptance), a suffix-tree drafter and an
  n-gram chain drafter;
- each row's committed KV after speculative decoding equals what autoregressive decoding built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specsched as ss  # noqa: E402
from specsched.drafting import NgramChainDrafter, SuffixTreeDrafter  # noqa: E402
from specsched.generate import generate, root_only  # noqa: E402
from specsched.integrations.hf import HFTarget, kv_tensors  # noqa: E402
from specsched.testing import OracleDrafter  # noqa: E402

VOCAB = 256
NEW = 16
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8, 9],
    [40, 41],
    [200, 17, 99, 3, 250, 8],
    [7],
]


def llama(attn: str) -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,  # a sharper random model: less repetitive continuations
        attn_implementation=attn,
    )
    return transformers.LlamaForCausalLM(config).double().eval()


def gpt2() -> Any:
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=256,
        initializer_range=0.5,
    )
    return transformers.GPT2LMHeadModel(config).double().eval()


MODELS = {"llama-eager": lambda: llama("eager"), "llama-sdpa": lambda: llama("sdpa"), "gpt2": gpt2}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request: pytest.FixtureRequest) -> Any:
    return MODELS[request.param]()


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        eos_token_id=None,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


def assert_same_committed_kv(
    spec: HFTarget, ar: HFTarget, prompts: list[list[int]], tokens: list[list[int]]
) -> None:
    """Row b's first `len(prompt) + emitted - 1` committed entries (the prompt and every
    emitted token but the next root), every layer, keys and values."""
    # HF's eager attention takes its softmax in float32 (even for a float64 model), so rows
    # that differ only in their masked columns agree to ~1e-6 there; sdpa stays in float64.
    tol = 1e-5 if ar.model.config._attn_implementation == "eager" else 1e-9
    layers = len(kv_tensors(ar.cache))
    for b, prompt in enumerate(prompts):
        committed = len(prompt) + len(tokens[b]) - 1
        for layer in range(layers):
            for got, want in zip(
                spec.committed_kv(b, layer), ar.committed_kv(b, layer), strict=True
            ):
                torch.testing.assert_close(
                    got[:, :committed], want[:, :committed], rtol=tol, atol=tol
                )


def test_finished_rows_stop_advancing() -> None:
    # GPT-2's learned positions end at n_positions: the long-prompt request ends at its first
    # token (EOS), and its retired row no longer advances while the short one runs on.
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=36
    )
    model = transformers.GPT2LMHeadModel(config).double().eval()
    # The long prompt takes every position: a retired row one past its last would be past
    # n_positions.
    long, short = [7] * 28 + [1, 2, 3, 4, 5, 6, 7, 8], [5]
    assert len(long) == config.n_positions
    eos = generate(HFTarget(model), None, [long], 1).tokens[0][0]
    alone = [
        generate(HFTarget(model), None, [p], 10, eos_token_id=eos).tokens[0] for p in (long, short)
    ]
    target = HFTarget(model)
    both = generate(target, NgramChainDrafter(3), [long, short], 10, eos_token_id=eos)
    assert both.tokens == alone
    assert target.lengths.tolist()[0] == len(long)


class TruthChain:
    """Drafts the known continuation of one request as a chain `depth` deep (token 0 past
    its end)."""

    def __init__(self, truth: list[int], depth: int) -> None:
        self.truth, self.depth, self.done = truth, depth, 1

    def start(self, input_ids: Any, first_tokens: np.ndarray, prefill: Any) -> None:
        self.done = 1

    def propose(self, roots: np.ndarray, active: np.ndarray) -> ss.TreeBatch:
        rest = self.truth[self.done :] + [0] * self.depth
        return ss.TreeBatch([ss.Tree.chain([int(roots[0]), *rest[: self.depth]])])

    def commit(self, trees: Any, result: Any, step: Any, kept: np.ndarray) -> None:
        self.done += int(kept[0])


def test_trees_stop_below_the_models_last_position() -> None:
    # A request that ends on EOS 8 tokens into a 32-position model after a 20-token prompt:
    # its autoregressive decoding stays below position 28, and so must its drafts (a chain
    # 12 deep from the first root reached position 32: the run was refused).
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, initializer_range=0.5
    )
    model = transformers.GPT2LMHeadModel(config).double().eval()
    prompt = [13, 11, 11, 6, 14, 2, 9, 11, 13, 8, 6, 4, 6, 7, 11, 14, 1, 14, 8, 5]
    free = generate(HFTarget(model), None, [prompt], 8).tokens[0]
    assert free == hf_greedy(model, prompt, 8) and free[-1] not in free[:-1]
    got = generate(HFTarget(model), TruthChain(free, 12), [prompt], 30, eos_token_id=free[-1])
    assert got.tokens == [free] and got.steps == 1  # one tree, cut to depth 11, holds all 8


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculative_equals_autoregressive_equals_hf(model: Any, batch: int) -> None:
    prompts = PROMPTS[:batch]
    ar_target = HFTarget(model)
    ar = generate(ar_target, None, prompts, NEW)
    assert ar.tokens_per_forward == pytest.approx(1.0)
    for b, prompt in enumerate(prompts):
        assert ar.tokens[b] == hf_greedy(model, prompt, NEW), b

    spec_target = HFTarget(model)
    spec = generate(spec_target, OracleDrafter(ar.tokens, seed=batch, vocab=VOCAB), prompts, NEW)
    assert spec.tokens == ar.tokens
    assert spec.mean_accepted > 0.5  # deep, non-contiguous paths were accepted and compacted
    assert spec.layout_s > 0  # the target's tree layout, counted as specsched's
    assert_same_committed_kv(spec_target, ar_target, prompts, ar.tokens)

    for drafter in (SuffixTreeDrafter(16), NgramChainDrafter(5)):
        target = HFTarget(model, features=False)
        got = generate(target, drafter, prompts, NEW)
        assert got.tokens == ar.tokens, type(drafter).__name__
        assert_same_committed_kv(target, ar_target, prompts, ar.tokens)


def test_a_path_cut_at_eos_commits_only_the_emitted_tokens(model: Any) -> None:
    # The oracle drafts the true continuation, so an EOS inside an accepted path cuts it:
    # the cache keeps the tokens up to the EOS, as HF's own loop would (docs/api.md).
    free = generate(HFTarget(model), None, PROMPTS, NEW).tokens
    eos = next(t for t in free[0][4:] if t not in free[0][:4])
    ar_target = HFTarget(model)
    ar = generate(ar_target, None, PROMPTS, NEW, eos_token_id=eos)
    assert len(ar.tokens[0]) < NEW
    spec_target = HFTarget(model)
    drafter = OracleDrafter(free, seed=3, vocab=VOCAB)
    spec = generate(spec_target, drafter, PROMPTS, NEW, eos_token_id=eos)
    assert spec.tokens == ar.tokens
    assert spec_target.lengths.tolist() == ar_target.lengths.tolist()
    assert_same_committed_kv(spec_target, ar_target, PROMPTS, ar.tokens)


def test_layout_and_features() -> None:
    model = llama("sdpa")
    target = HFTarget(model)
    step = target.prefill(PROMPTS)
    width = max(len(p) for p in PROMPTS)
    assert tuple(step.logits.shape) == (4, VOCAB)
    assert tuple(step.features.shape) == (4, width, 64)
    assert target.valid.sum(1).tolist() == [len(p) for p in PROMPTS]
    trees = ss.TreeBatch(
        [ss.Tree(np.array([-1, 0, 0, 1], np.int32), np.array([5, 6, 7, 8]))] * 2
        + [ss.Tree.chain([9, 10])] * 2
    )
    step = target.forward_tree(trees)
    assert tuple(step.logits.shape) == (trees.num_nodes, VOCAB)
    assert tuple(step.features.shape) == (trees.num_nodes, 64)
    result = ss.verify(trees, target_tokens=np.array([6, 8, 0, 0, 0, 0, 0, 0, 10, 0, 3, 4]))
    assert isinstance(result, ss.BatchVerifyResult)
    target.accept(result)
    # rows accepted 2, 0, 1, 0 draft tokens: the cache grew by 3, the gaps stay masked
    assert target.cache.get_seq_length() == width + 3
    assert target.valid[:, width:].tolist() == [
        [True, True, True],
        [True, False, False],
        [True, True, False],
        [True, False, False],
    ]
    assert target.lengths.tolist() == [
        len(p) + k + 1 for p, k in zip(PROMPTS, [2, 0, 1, 0], strict=True)
    ]
    assert HFTarget(model, features=False).prefill(PROMPTS[:1]).features is None


def test_bad_arguments() -> None:
    model = gpt2()
    with pytest.raises(TypeError, match="model"):
        HFTarget(object())

    class NoCache(torch.nn.Module):
        config = model.config

        def forward(self, input_ids: Any, position_ids: Any = None) -> Any:
            return input_ids

    with pytest.raises(ValueError, match=r"model: NoCache\.forward takes no KV cache"):
        HFTarget(NoCache())
    with pytest.raises(ValueError, match="training mode"):
        HFTarget(gpt2().train())
    target = HFTarget(model)
    with pytest.raises(RuntimeError, match="prefill first"):
        target.forward_tree(root_only(np.array([1])))
    with pytest.raises(ValueError, match="input_ids"):
        target.prefill([[1], []])
    # Named before the embedding lookup (torch's IndexError names nothing).
    with pytest.raises(ValueError, match=r"^input_ids\[1\]: token id 256 is outside"):
        target.prefill([[1], [3, 256]])
    target.prefill([[1, 2], [3]])
    for b, layer, exc, match in (
        (0, 2, IndexError, "^layer: 2 is out of range for a cache of 2 layers"),
        (0, -1, IndexError, "^layer: -1 is out of range"),
        (2, 0, IndexError, "^b: 2 is out of range for a batch of 2"),
        (True, 0, TypeError, "^b: expected an int, got bool"),
        (0, 0.0, TypeError, "^layer: expected an int, got float"),
    ):
        with pytest.raises(exc, match=match):
            target.committed_kv(b, layer)
    with pytest.raises(ValueError, match="trees: 1 trees for a batch of 2"):
        target.forward_tree(root_only(np.array([1])))
    with pytest.raises(TypeError, match="trees"):
        target.forward_tree([[1], [2]])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no forward_tree"):
        target.accept(ss.verify(root_only(np.array([1, 2])), target_tokens=np.array([0, 0])))
    with pytest.raises(TypeError, match="cache"):
        kv_tensors(transformers.StaticCache(config=model.config, max_cache_len=8))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        long = HFTarget(model)
        long.prefill([[1] * 250])
        long.forward_tree(ss.TreeBatch([ss.Tree.chain(list(range(10)))]))


def phi3_longrope() -> Any:
    torch.manual_seed(0)
    head_dim = 8
    config = transformers.Phi3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        original_max_position_embeddings=16,
        pad_token_id=0,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * (head_dim // 2),
            "long_factor": [1.0 + 7.0 * i for i in range(head_dim // 2)],
            "original_max_position_embeddings": 16,
        },
    )
    return transformers.Phi3ForCausalLM(config).double().eval()


def test_models_whose_positions_or_mask_a_tree_would_change_are_refused() -> None:
    # longrope switches its frequencies for the whole forward once the forward's largest
    # position passes its original context: a tree (and the batch's other rows) would switch
    # them at other steps than autoregressive decoding. Below it, the loop is lossless.
    model = phi3_longrope()
    target = HFTarget(model)
    assert target.max_positions == 16
    prompt = [[5, 9, 3, 7]]
    ar = generate(HFTarget(model), None, prompt, 10)
    spec = generate(target, OracleDrafter(ar.tokens, seed=1, vocab=VOCAB), prompt, 10)
    assert spec.tokens == ar.tokens
    with pytest.raises(ValueError, match="longrope original_max_position_embeddings"):
        generate(HFTarget(model), None, prompt, 14)
    # The tree mask is a float 4-D additive mask: other attention kernels cannot take it.
    torch.manual_seed(0)
    flex = llama("eager")
    flex.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="model: attn_implementation 'flex_attention'"):
        HFTarget(flex)
    alibi = transformers.FalconForCausalLM(
        transformers.FalconConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, alibi=True
        )
    ).eval()
    with pytest.raises(ValueError, match="model: uses ALiBi"):
        HFTarget(alibi)
    # GPT-Neo slices its own causal buffer (a sliding window on local layers) by cache
    # column: on the tree's padded cache its tokens came out wrong, with no error.
    neo = transformers.GPTNeoForCausalLM(
        transformers.GPTNeoConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            max_position_embeddings=64,
            attention_types=[[["global", "local"], 1]],
            window_size=3,
        )
    ).eval()
    with pytest.raises(ValueError, match=r"model: transformer\.h\.0\.attn\.attention\.bias masks"):
        HFTarget(neo)
    # GPT-2 keeps its eager reorder_and_upcast_attn path (transformers 5 masks it with the
    # given mask alone; 4.x with a causal buffer, refused there).
    reordered = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, reorder_and_upcast_attn=True
        )
    ).eval()
    has_buffer = isinstance(getattr(reordered.transformer.h[0].attn, "bias", None), torch.Tensor)
    if has_buffer:
        with pytest.raises(ValueError, match="masks its attention with its own causal buffer"):
            HFTarget(reordered)
    else:
        HFTarget(reordered)
