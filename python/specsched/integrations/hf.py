"""HF transformers causal LMs as a `specsched.generate.TargetModel`.

`HFTarget(model)` scores draft trees with any decoder-only `transformers` model that takes
`position_ids`, a custom 4-D attention mask and a `DynamicCache` (Llama, Mistral, Qwen2, GPT-2,
...), and keeps each request's accepted path in that cache with `specsched.compact_kv`.

Cache layout. HF's `DynamicCache` has one sequence length `S` for the whole batch and appends
new keys at its end, so the adapter keeps a per-row validity mask over the cache columns:

- prefill: the prompts are right-padded to `P_max`; row b's columns `0..len_b-1` are valid.
- `forward_tree`: the padded trees `[B, n]` are appended at `S..S+n-1` for every row, with
  `position_ids = L_b + depth` (`L_b`: row b's committed token count) and a float additive mask
  `[B, 1, n, S + n]` (0 / dtype min): the row's valid columns, then the tree's
  ancestor-or-self mask.
- `accept`: every row's "prefix length" is `S`, so `compact_kv` moves node `a_j` from `S + a_j`
  to `S + j` (every layer's keys and values, in one call); the cache is cropped to
  `S + max_b(k_b) + 1` and the columns `S..S+k_b` become valid for row b. The rest of the gap
  stays masked for ever.

Positions are stored with the keys (rotary keys are rotated before caching; absolute position
embeddings are added to the input), so gaps in the columns change nothing: row b's valid
columns are exactly the keys autoregressive decoding of row b alone would hold.

Supported: transformers 4.56 and later, where a `DynamicCache` holds `layers[i].keys/values`
(verified on 5.x); the older `key_cache`/`value_cache` lists are read too. Sliding-window,
static, quantized, offloaded and encoder-decoder caches are refused with a TypeError.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specsched._args import int_arg
from specsched._core import BatchVerifyResult, TreeBatch
from specsched._kv import compact_kv
from specsched._torch import host_view, synchronizer
from specsched.generate import RetiredRows, TargetStep


def _cache_classes() -> tuple[Any, Any]:
    from transformers import cache_utils

    return cache_utils.DynamicCache, getattr(cache_utils, "DynamicLayer", None)


def kv_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The `(keys, values)` tensors `[B, H, S, D]` of every layer of a full-attention
    `DynamicCache` (both the `layers[i].keys` and the older `key_cache[i]` layouts).

    Raises TypeError for any other cache (sliding window, static, quantized, ...).
    """
    dynamic_cache, dynamic_layer = _cache_classes()
    if not isinstance(cache, dynamic_cache):
        raise TypeError(
            f"cache: expected a transformers DynamicCache, got {type(cache).__name__}; "
            "HFTarget edits the cache's key/value tensors in place and supports only that type"
        )
    layers = getattr(cache, "layers", None)
    if layers is not None:
        pairs = []
        for i, layer in enumerate(layers):
            if dynamic_layer is None or type(layer) is not dynamic_layer:
                raise TypeError(
                    f"cache: layer {i} is a {type(layer).__name__}; HFTarget supports "
                    "full-attention DynamicLayer layers only (no sliding window, offloading "
                    "or linear attention)"
                )
            if not getattr(layer, "is_initialized", True) or layer.keys is None:
                raise TypeError(f"cache: layer {i} holds no keys (a KV-sharing layer?)")
            pairs.append((layer.keys, layer.values))
        return pairs
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if isinstance(keys, list) and isinstance(values, list):
        return list(zip(keys, values, strict=True))
    raise TypeError(
        f"cache: {type(cache).__name__} has neither `layers` nor `key_cache`/`value_cache`; "
        "this transformers version's cache layout is not supported"
    )


def crop_cache(cache: Any, length: int) -> None:
    """Drops the cache's columns from `length` on (every layer, every row)."""
    current = int(cache.get_seq_length())
    if current > length:
        # A negative argument removes that many columns in every transformers version with
        # `crop` (4.x also reads a positive one as the new length; 5.x refuses it).
        cache.crop(length - current)
    got = int(cache.get_seq_length())
    if got != min(current, length):
        raise RuntimeError(f"cache: crop to {length} columns left {got}")


def _rope_parameter_sets(config: Any) -> list[dict[str, Any]]:
    """The rotary settings of `config`: one dict, or one per layer type (transformers 5's
    `rope_parameters`, 4.x's `rope_scaling`)."""
    sets: list[dict[str, Any]] = []
    for attr in ("rope_parameters", "rope_scaling"):
        value = getattr(config, attr, None)
        if not isinstance(value, dict):
            continue
        if "rope_type" in value or "type" in value:
            sets.append(value)
        else:
            sets.extend(v for v in value.values() if isinstance(v, dict))
    return sets


def _position_limit(config: Any) -> tuple[int | None, str]:
    """The first position a forward may not reach, and its name in the refusal. Past
    `max_position_embeddings` the model has no positions (and dynamic rotary types rescale).
    longrope (Phi-3 and later) picks its short or long frequencies once per forward from the
    forward's largest position: a tree, reaching past its accepted path, and the other rows of
    the batch would switch them for every row at a different step than autoregressive
    decoding, so the loop stays below `original_max_position_embeddings`, where the
    frequencies never switch."""
    limit: int | None = getattr(config, "max_position_embeddings", None)
    name = "max_position_embeddings"
    for params in _rope_parameter_sets(config):
        if params.get("rope_type", params.get("type")) != "longrope":
            continue
        original = params.get(
            "original_max_position_embeddings",
            getattr(config, "original_max_position_embeddings", None),
        )
        if not isinstance(original, int):
            raise ValueError(
                "model: longrope without original_max_position_embeddings: the positions "
                "where its frequencies switch are unknown"
            )
        if limit is None or original < limit:
            limit = original
            name = "longrope original_max_position_embeddings (its frequencies switch past it)"
    return limit, name


def _own_causal_mask(model: torch.nn.Module) -> str | None:
    """The attention module that applies its own causal mask, a bool `[1, 1, P, P]` buffer
    it slices by cache length on top of the mask it is given (GPT-Neo's `bias`, with a
    sliding window on its local layers; ImageGPT's; GPT-2's in transformers 4.x when
    `reorder_and_upcast_attn` takes its eager path), or None. GPT-2 4.x keeps the buffer
    on every layer but reads it only on that path, so the buffer alone does not decide."""
    config: Any = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    reordered = (
        kind == "gpt2"
        and getattr(config, "reorder_and_upcast_attn", False)
        and getattr(config, "_attn_implementation", None) in (None, "eager")
    )
    if kind not in ("gpt_neo", "imagegpt") and not reordered:
        return None
    for name, module in model.named_modules():
        buffer = getattr(module, "bias", None)
        if (
            isinstance(buffer, torch.Tensor)
            and buffer.dtype == torch.bool
            and buffer.ndim == 4
            and buffer.shape[:2] == (1, 1)
        ):
            return f"{name}.bias"
    return None


class HFTarget:
    """A transformers causal LM as a `specsched.generate.TargetModel` (module docstring: the
    cache layout).

    `model`: a decoder-only transformers model (`...ForCausalLM`) in eval mode; its dtype and
    device are used as they are. `features=True` returns the last hidden states (the input of
    EAGLE-style drafters) with every step; False skips them.

    After each step, `cache` is the `DynamicCache`, `valid` the bool `[B, S]` mask of the
    columns each row attends to, `lengths` the committed tokens per row (int64 `[B]`), and
    `committed_kv(b, layer)` row b's committed keys and values.
    """

    def __init__(self, model: Any, *, features: bool = True) -> None:
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"model: expected a transformers PreTrainedModel, got {type(model).__name__}"
            )
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("model: encoder-decoder models are not supported (decoder-only)")
        params = inspect.signature(model.forward).parameters
        if "cache" in params:
            self._cache_kw = "cache"  # transformers 5.x
        elif "past_key_values" in params:
            self._cache_kw = "past_key_values"
        else:
            raise ValueError(
                f"model: {type(model).__name__}.forward takes no KV cache "
                "(neither `cache` nor `past_key_values`)"
            )
        if "position_ids" not in params:
            raise ValueError(f"model: {type(model).__name__}.forward takes no `position_ids`")
        if model.training:
            # Dropout would make every forward random: verification against it is not the
            # model's greedy or sampled output (a model built from a config starts in training).
            raise ValueError("model: is in training mode (dropout active); call model.eval()")
        attn = getattr(config, "_attn_implementation", None)
        if attn not in (None, "eager", "sdpa"):
            # The tree mask goes in as a float 4-D additive mask, which only these two take
            # (flex_attention aborted the process on it).
            raise ValueError(
                f"model: attn_implementation {attn!r} is not supported: the tree mask is a 4-D "
                "additive mask; load the model with attn_implementation='sdpa' or 'eager'"
            )
        if getattr(config, "alibi", False):
            raise ValueError(
                "model: uses ALiBi, whose biases transformers builds from a 2-D padding mask; "
                "a tree needs the 4-D mask"
            )
        own_mask = _own_causal_mask(model)
        if own_mask is not None:
            raise ValueError(
                f"model: {own_mask} masks its attention with its own causal buffer, indexed by "
                "cache column (GPT-Neo, ImageGPT), which the tree's padded and gapped cache "
                "columns break: the 4-D tree mask would not be the only mask applied"
            )
        self.model = model
        self.features = features
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_positions, self._positions_limit = _position_limit(config)
        self.cache: Any = None
        self.valid = torch.zeros((0, 0), dtype=torch.bool)
        self.lengths = np.zeros(0, dtype=np.int64)
        self.retired = RetiredRows()
        self.synchronize = synchronizer(self.device)
        self.layout_seconds = 0.0  # in its tree layouts: specsched's time (`generate`'s layout_s)
        self._pending: int | None = None  # S of the forward_tree awaiting accept

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding (a resized embedding included): `generate` refuses
        prompt tokens outside it."""
        model: Any = self.model  # a PreTrainedModel; typed as the nn.Module it is checked as
        return int(model.get_input_embeddings().weight.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    def retire(self, rows: np.ndarray) -> None:
        """Rows whose requests finished (`generate` still feeds them root-only trees): their
        entries stop being kept, so their length stops growing, and their trees sit at the
        last position the request used."""
        self.retired.add(rows)

    def committed_kv(self, b: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row b's committed keys and values in `layer`, `[H, L_b, D]` each (valid columns)."""
        b, layer = int_arg(b, "b"), int_arg(layer, "layer")
        if not 0 <= b < self.batch_size:
            raise IndexError(f"b: {b} is out of range for a batch of {self.batch_size}")
        layers = kv_tensors(self.cache)
        if not 0 <= layer < len(layers):
            raise IndexError(f"layer: {layer} is out of range for a cache of {len(layers)} layers")
        keys, values = layers[layer]
        cols = torch.nonzero(self.valid[b]).squeeze(1).to(keys.device)
        return keys[b][:, cols], values[b][:, cols]

    def _new_cache(self) -> Any:
        dynamic_cache, _ = _cache_classes()
        try:
            return dynamic_cache(config=self.model.config)
        except TypeError:  # transformers < 4.56: no config argument
            return dynamic_cache()

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """bool `[B, q, kv]` (True = attend) -> the float additive `[B, 1, q, kv]` mask that
        eager attention adds to its scores and sdpa accepts as `attn_mask`."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed.to(self.device), torch.finfo(self.dtype).min)
        return mask[:, None]

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> Any:
        if self.max_positions is not None and int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"positions: {int(positions.max())} is beyond the model's "
                f"{self._positions_limit} {self.max_positions}"
            )
        kwargs: dict[str, Any] = {
            self._cache_kw: self.cache,
            "attention_mask": self._mask(allowed),
            "position_ids": positions.to(self.device),
            "use_cache": True,
            "output_hidden_states": self.features,
            "return_dict": True,
        }
        return self.model(input_ids=tokens.to(self.device), **kwargs)

    def _features(self, out: Any) -> torch.Tensor | None:
        return out.hidden_states[-1] if self.features else None

    @torch.no_grad()
    def prefill(self, input_ids: Sequence[Sequence[int]]) -> TargetStep:
        if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
            raise TypeError("input_ids: expected a sequence of token sequences")
        prompts = [[int(t) for t in p] for p in input_ids]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("input_ids: expected at least one prompt, none of them empty")
        vocab = self.vocab_size
        for i, prompt in enumerate(prompts):
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                # Before the embedding lookup (torch's IndexError names nothing; on a GPU
                # it is a device-side assert).
                raise ValueError(
                    f"input_ids[{i}]: token id {bad} is outside the vocabulary [0, {vocab})"
                )
        lens = np.array([len(p) for p in prompts], dtype=np.int64)
        b, width = len(prompts), int(lens.max())
        tokens = torch.zeros((b, width), dtype=torch.int64)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.as_tensor(prompt)
        positions = torch.arange(width).expand(b, width)
        keep = positions < torch.as_tensor(lens)[:, None]  # right padding is masked
        allowed = torch.ones((width, width), dtype=torch.bool).tril()[None] & keep[:, None, :]
        self.cache = self._new_cache()
        self._pending = None
        out = self._run(tokens, positions, allowed)
        kv_tensors(self.cache)  # the model filled a cache this adapter can edit
        if int(self.cache.get_seq_length()) != width:
            raise ValueError(
                f"model: wrote {self.cache.get_seq_length()} cache columns for a "
                f"{width}-token prefill; its cache is not a plain append-only DynamicCache"
            )
        self.valid = keep.to(self.device)
        self.lengths = lens
        self.retired = RetiredRows(lens.shape[0])
        rows = torch.arange(b, device=out.logits.device)
        last = torch.as_tensor(lens - 1, device=out.logits.device)
        return TargetStep(host_view(out.logits[rows, last]), self._features(out))

    @torch.no_grad()
    def forward_tree(self, trees: TreeBatch) -> TargetStep:
        if not isinstance(trees, TreeBatch):
            raise TypeError(f"trees: expected a specsched.TreeBatch, got {type(trees).__name__}")
        if self.cache is None:
            raise RuntimeError("forward_tree: call prefill first")
        if self._pending is not None:
            raise RuntimeError("forward_tree: the previous tree forward was not accepted")
        b, n = trees.num_trees, trees.max_nodes
        if b != self.batch_size:
            raise ValueError(f"trees: {b} trees for a batch of {self.batch_size} rows")
        # A retired row's tree entry is never kept.
        at = self.retired.tree_lengths(self.lengths)
        # `pad_trees`' layout, unnamed: the one specsched call, with no wrapper around it.
        t0 = time.perf_counter()
        tokens, positions, tree_mask, slot_rows, slot_cols = trees.padded_layout(at)
        self.layout_seconds += time.perf_counter() - t0
        s = int(self.cache.get_seq_length())
        allowed = torch.cat(
            (self.valid.cpu()[:, None, :].expand(b, n, s), torch.from_numpy(tree_mask)),
            dim=2,
        )  # [B, n, S + n]
        out = self._run(torch.from_numpy(tokens), torch.from_numpy(positions), allowed)
        self._pending = s
        rows = torch.as_tensor(slot_rows, device=out.logits.device)
        cols = torch.as_tensor(slot_cols, device=out.logits.device)
        features = self._features(out)
        return TargetStep(
            host_view(out.logits[rows, cols]), None if features is None else features[rows, cols]
        )

    @torch.no_grad()
    def accept(self, result: BatchVerifyResult) -> None:
        if not isinstance(result, BatchVerifyResult):
            raise TypeError(
                f"result: expected a specsched.BatchVerifyResult, got {type(result).__name__}"
            )
        if self._pending is None:
            raise RuntimeError("accept: no forward_tree to accept")
        k = np.asarray(result.num_accepted, dtype=np.int64)
        if k.shape != (self.batch_size,):
            raise ValueError(f"result: {k.shape[0]} rows for a batch of {self.batch_size} rows")
        s = self._pending
        prefix = np.full(self.batch_size, s, dtype=np.int64)
        # Every layer's keys and values in one call: one plan, and on a GPU one copy of its
        # indices (two calls per layer made 2·layers plans and index copies a step).
        buffers = [t for pair in kv_tensors(self.cache) for t in pair]
        compact_kv(buffers, result, prefix, seq_dim=2, batch_dim=0)
        keep = int(k.max()) + 1
        crop_cache(self.cache, s + keep)
        kept = torch.arange(keep)[None, :] <= torch.from_numpy(k)[:, None]
        advance = k + 1
        if self.retired.any:
            # A retired row's root-only entry is not kept: its length (and position) stays.
            kept[torch.from_numpy(self.retired.rows)] = False
            advance[self.retired.rows] = 0
        self.valid = torch.cat((self.valid, kept.to(self.valid.device)), dim=1)
        self.lengths = self.lengths + advance
        self._pending = None
