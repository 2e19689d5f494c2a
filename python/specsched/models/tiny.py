"""A tiny byte-level decoder-only transformer that scores draft trees over a KV cache, and an
EAGLE-style draft head for it.

The target (`TinyLM`) is a pre-norm transformer (RMSNorm, rotary positions, SwiGLU, tied
embeddings) over the 256 byte values. Every attention call takes explicit positions and a
boolean mask, so the same code runs training (causal), prefill (causal per row), tree
verification (each tree token sees the committed prefix and its own ancestors) and drafting.

The KV cache is ONE tensor `[layers, 2, batch, heads, seq, head_dim]`, so a single
`specsched.compact_kv(cache, result, lengths, seq_dim=4, batch_dim=2)` call keeps the accepted
path of every request in every layer. Keys are stored after the rotary embedding, at the
position of the token they belong to; a move therefore needs no re-rotation (an accepted node
at depth j sits at position `length + j`, exactly where compaction puts it).

The draft head (`EagleHead`, EAGLE-1/2 style) is one decoder layer over `fc([feature, embedding
of the next token])`, where `feature` is the target's final hidden state. It reuses the target's
embedding and LM head, so its own weights are only `fc` and the layer. It predicts the next
feature; the LM head turns that into the draft distribution.

`scripts/train_tiny.py` trains both on the Python standard library's source (bytes) and writes
`tiny_stdlib/` (float16 `.npz` weights, the config and the measured losses).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specsched._args import int_arg
from specsched._kv import compact_kv
from specsched._torch import host_view, raw_cpu_view, synchronizer
from specsched.generate import RetiredRows

WEIGHTS_DIR = Path(__file__).parent / "tiny_stdlib"


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the tiny target (and of its draft head's layer)."""

    vocab_size: int = 256
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    max_positions: int = 8192
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Rotary(nn.Module):
    """cos/sin tables, indexed by explicit positions (tree positions are not `arange`)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        half = cfg.head_dim // 2
        inv = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.arange(cfg.max_positions, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """`(cos, sin)` `[B, 1, n, head_dim/2]` for int64 `positions [B, n]`."""
        if int(positions.max()) >= self.cos.shape[0]:
            raise ValueError(
                f"positions: {int(positions.max())} is beyond the model's "
                f"max_positions {self.cos.shape[0]}"
            )
        return self.cos[positions][:, None].to(dtype), self.sin[positions][:, None].to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class CacheSlot:
    """Where a forward writes its keys/values: `kv[2, B, H, S, D]` at sequence indices
    `write_at [B, n]`; it then attends over the first `span` entries."""

    def __init__(self, kv: torch.Tensor, write_at: torch.Tensor, span: int) -> None:
        self.kv = kv
        self.rows = torch.arange(kv.shape[1], device=kv.device)[:, None]
        self.write_at = write_at
        self.span = span


class Block(nn.Module):
    """Pre-norm attention + SwiGLU block."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, ...],
        mask: torch.Tensor | None,
        slot: CacheSlot | None = None,
    ) -> torch.Tensor:
        """`x [B, n, d]`; `mask` bool `[B, 1, n, keys]` (True = attend) or None for causal;
        with `slot`, keys are the cache's first `slot.span` entries after this call's writes."""
        b, n, d = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(b, n, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, n, D]
        q, k = rotate(q, *rope), rotate(k, *rope)
        if slot is not None:
            # Advanced indices (rows, write_at) around a slice put [B, n] first: [B, n, H, D].
            slot.kv[0][slot.rows, :, slot.write_at] = k.transpose(1, 2).to(slot.kv.dtype)
            slot.kv[1][slot.rows, :, slot.write_at] = v.transpose(1, 2).to(slot.kv.dtype)
            k = slot.kv[0, :, :, : slot.span].to(q.dtype)
            v = slot.kv[1, :, :, : slot.span].to(q.dtype)
        if mask is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(att.transpose(1, 2).reshape(b, n, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLM(nn.Module):
    """The target: `forward` for training, `step` for cached inference."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.rotary = Rotary(cfg)
        nn.init.normal_(self.embed.weight, std=0.02)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embed.weight.T

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal pass over `tokens [B, L]`: `(logits [B, L, V], features [B, L, d])`; the
        features are the final normed hidden states the LM head reads (EAGLE's input)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.embed(tokens)
        rope = self.rotary.tables(positions, x.dtype)
        for block in self.blocks:
            x = block(x, rope, None)
        features = self.norm(x)
        return self.logits(features), features

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        write_at: torch.Tensor,
        mask: torch.Tensor,
        cache: torch.Tensor,
    ) -> torch.Tensor:
        """Cached pass: `tokens`, rotary `positions` and cache indices `write_at`, all
        `[B, n]`; `mask` bool `[B, n, span]` over the cache's first `span` entries (after
        this call's writes); `cache [layers, 2, B, H, S, D]`. Returns the features `[B, n, d]`:
        callers apply `logits` to the rows they need (the LM head is the widest matmul, and
        padding or prompt rows need none)."""
        x = self.embed(tokens)
        rope = self.rotary.tables(positions, x.dtype)
        span = mask.shape[-1]
        for layer, block in enumerate(self.blocks):
            x = block(x, rope, mask[:, None], CacheSlot(cache[layer], write_at, span))
        return self.norm(x)


class EagleHead(nn.Module):
    """EAGLE-style draft head: one decoder layer over `fc([feature_t, embed(token_{t+1})])`
    predicting feature_{t+1}; the target's LM head turns it into draft logits."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=True)
        self.block = Block(cfg)
        self.rotary = Rotary(cfg)

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """Causal pass for training: `features`, `next_embeds` `[B, L, d]` -> predicted
        features `[B, L, d]`."""
        b, length, _ = features.shape
        positions = torch.arange(length, device=features.device).expand(b, length)
        x = self.fc(torch.cat((features, next_embeds), dim=-1))
        return self.block(x, self.rotary.tables(positions, x.dtype), None)

    def step(
        self,
        features: torch.Tensor,
        next_embeds: torch.Tensor,
        positions: torch.Tensor,
        write_at: torch.Tensor,
        mask: torch.Tensor,
        cache: torch.Tensor,
    ) -> torch.Tensor:
        """Cached pass, as `TinyLM.step` with one layer (cache `[2, B, H, S, D]`)."""
        x = self.fc(torch.cat((features, next_embeds), dim=-1))
        rope = self.rotary.tables(positions, x.dtype)
        slot = CacheSlot(cache, write_at, mask.shape[-1])
        return self.block(x, rope, mask[:, None], slot)


# --- weights ---------------------------------------------------------------------------------


def save_weights(module: nn.Module, path: Path) -> None:
    """float16 `.npz` of the module's parameters (no pickle)."""
    arrays = {
        name: p.detach().to(torch.float16).cpu().numpy() for name, p in module.named_parameters()
    }
    np.savez(path, **arrays)  # type: ignore[arg-type]


def load_weights(module: nn.Module, path: Path) -> None:
    with np.load(path, allow_pickle=False) as arrays:
        state = {name: torch.from_numpy(arrays[name].astype(np.float32)) for name in arrays.files}
    missing = set(dict(module.named_parameters())) - set(state)
    if missing:
        raise ValueError(f"{path}: missing weights {sorted(missing)}")
    module.load_state_dict(state, strict=False)


def load_tiny(
    directory: Path | str | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[TinyLM, EagleHead]:
    """The shipped target and draft head (no network), in eval mode on `device`."""
    directory = WEIGHTS_DIR if directory is None else Path(directory)
    cfg = TinyConfig(**json.loads((directory / "config.json").read_text())["model"])
    target, head = TinyLM(cfg), EagleHead(cfg)
    load_weights(target, directory / "target.npz")
    load_weights(head, directory / "draft_head.npz")
    target.to(device=device, dtype=dtype).eval()
    head.to(device=device, dtype=dtype).eval()
    # The rotary tables stay float32 on the device; tables() casts per call.
    for rot in (target.rotary, head.rotary):
        rot.cos, rot.sin = rot.cos.float(), rot.sin.float()
    return target, head


def config_dict(cfg: TinyConfig) -> dict[str, Any]:
    return asdict(cfg)


# --- the target in the decode loop -----------------------------------------------------------


def grow_seq(cache: torch.Tensor, seq_dim: int, needed: int, headroom: int) -> torch.Tensor:
    """`cache` with room for at least `needed` entries along `seq_dim`: itself when it has
    them, else a zeroed copy of `max(needed + headroom, 2 * held)` entries (amortized
    doubling). Always a normal tensor, even under inference mode: compaction writes it outside
    (on CUDA with `index_copy_`, which an inference tensor refuses)."""
    held = cache.shape[seq_dim]
    if held >= needed:
        return cache
    shape = list(cache.shape)
    shape[seq_dim] = max(needed + headroom, 2 * held)
    with torch.inference_mode(False):
        grown = cache.new_zeros(shape)
        grown.narrow(seq_dim, 0, held).copy_(cache)
    return grown


def cache_mask(lengths: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """bool `[B, n, span]`: query i of row b sees cache entries `< lengths[b]` (committed) and
    the new entries `lengths[b] + j` with `tree_mask[b, i, j]` (`tree_mask` bool `[B, n, m]`);
    `span = max(lengths) + m`."""
    b, n, m = tree_mask.shape
    span = int(lengths.max()) + m
    cols = torch.arange(span, device=tree_mask.device)
    mask = (cols[None, :] < lengths[:, None])[:, None, :].expand(b, n, span).clone()
    where = (lengths[:, None] + torch.arange(m, device=tree_mask.device))[:, None, :]
    return mask.scatter_(2, where.expand(b, n, m), tree_mask)


def check_headroom(headroom: Any, max_positions: int) -> int:
    """Cache columns grown ahead of need: an int >= 0, at most `max_positions` (a cache
    never needs more columns than the model has positions; 2**70 failed in torch mid-run)."""
    return min(int_arg(headroom, "headroom", 0), max_positions)


class TinyTarget:
    """`TinyLM` as a `specsched.generate.TargetModel`: one cache tensor
    `[layers, 2, B, H, S, D]`, compacted by one `specsched.compact_kv` call per step.

    On the CPU it hands specsched numpy views of its logits (`_torch.host_view`) and of its
    cache (`_torch.raw_cpu_view`, the view `compact_kv` would make, bfloat16 included), made
    right after the forward while torch's code is still in the CPU caches.
    """

    def __init__(self, model: TinyLM, *, headroom: int = 256) -> None:
        if not isinstance(model, TinyLM):
            raise TypeError(f"model: expected a TinyLM, got {type(model).__name__}")
        self.model = model
        self.headroom = check_headroom(headroom, model.cfg.max_positions)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = torch.empty(0)
        self.cache_host: Any = None  # numpy view of `cache` (CPU), or the tensor itself
        self.lengths = np.zeros(0, dtype=np.int64)
        self.retired = RetiredRows()
        self.synchronize = synchronizer(self.device)
        self.layout_seconds = 0.0  # in its tree layouts: specsched's time (`generate`'s layout_s)

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def max_positions(self) -> int:
        """Positions the model encodes (`generate` cuts trees that would pass them)."""
        return self.model.cfg.max_positions

    SEQ_DIM, BATCH_DIM = 4, 2  # of the cache [layers, 2, B, H, S, D]

    @torch.inference_mode()
    def prefill(self, input_ids: Any) -> Any:
        from specsched.generate import TargetStep

        lens = np.array([len(p) for p in input_ids], dtype=np.int64)
        b, width = len(lens), int(lens.max())
        tokens = torch.zeros((b, width), dtype=torch.int64)
        for i, prompt in enumerate(input_ids):
            tokens[i, : len(prompt)] = torch.as_tensor(prompt)
        cfg = self.model.cfg
        empty = torch.zeros(
            (cfg.n_layers, 2, b, cfg.n_heads, 0, cfg.head_dim), dtype=self.dtype, device=self.device
        )
        self._set_cache(grow_seq(empty, self.SEQ_DIM, width, self.headroom))
        positions = torch.arange(width).expand(b, width).to(self.device)
        causal = torch.ones((width, width), dtype=torch.bool).tril().expand(b, width, width)
        features = self.model.step(
            tokens.to(self.device), positions, positions, causal.to(self.device), self.cache
        )
        last = torch.as_tensor(lens - 1, device=self.device)
        rows = torch.arange(b, device=self.device)
        self.lengths = lens
        self.retired = RetiredRows(b)
        return TargetStep(host_view(self.model.logits(features[rows, last])), features)

    @torch.inference_mode()
    def forward_tree(self, trees: Any) -> Any:
        from specsched.generate import TargetStep

        n = trees.max_nodes
        if trees.num_trees != self.lengths.shape[0]:
            raise ValueError(
                f"trees: {trees.num_trees} trees for a batch of {self.lengths.shape[0]} rows"
            )
        cache = grow_seq(self.cache, self.SEQ_DIM, int(self.lengths.max()) + n, self.headroom)
        if cache is not self.cache:
            self._set_cache(cache)
        # A retired row's tree is still written past its committed entries, which stay.
        at = self.retired.tree_lengths(self.lengths)
        # `pad_trees`' layout, unnamed: the one specsched call, with no wrapper around it
        # (a Python frame and a named tuple cost µs each right after the previous forward).
        t0 = time.perf_counter()
        tokens, positions, tree_mask, slot_rows, slot_cols = trees.padded_layout(at)
        self.layout_seconds += time.perf_counter() - t0
        dev = self.device
        lengths = torch.as_tensor(self.lengths, device=dev)
        write_at = lengths[:, None] + torch.arange(n, device=dev)  # node i at L_b + i
        mask = cache_mask(lengths, torch.as_tensor(tree_mask, device=dev))
        features = self.model.step(
            torch.as_tensor(tokens, device=dev),
            torch.as_tensor(positions, device=dev),
            write_at,
            mask,
            self.cache,
        )
        rows = torch.as_tensor(slot_rows, device=dev)
        cols = torch.as_tensor(slot_cols, device=dev)
        features = features[rows, cols]  # tree order, padding dropped before the LM head
        return TargetStep(host_view(self.model.logits(features)), features)

    def _set_cache(self, cache: torch.Tensor) -> None:
        """A new cache tensor and its host view (made once per allocation, not per step)."""
        self.cache = cache
        self.cache_host = raw_cpu_view(cache) if cache.device.type == "cpu" else cache

    def accept(self, result: Any) -> None:
        # compact_kv returns the committed lengths: no array arithmetic here (each numpy op
        # costs ~8 µs right after a forward evicted numpy's code from the CPU caches).
        # A retired row's root-only tree commits nothing (`active`): its length stays, so the
        # next one is written and scored at the same slot and position again.
        self.lengths = compact_kv(
            self.cache_host,
            result,
            self.lengths,
            seq_dim=self.SEQ_DIM,
            batch_dim=self.BATCH_DIM,
            active=self.retired.running if self.retired.any else None,
        )

    def retire(self, rows: np.ndarray) -> None:
        """Rows whose requests finished (`generate` still feeds them root-only trees): their
        length stops growing, and their trees sit at the last position the request used."""
        self.retired.add(rows)
