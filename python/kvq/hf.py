"""Hugging Face transformers on a kvq cache: attention computed on the stored codes.

    import kvq.hf                                   # registers attn_implementation="kvq"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvq")
    cache = kvq.hf.KVQCache(model.config, key_codec="q8_0", value_codec="q4_0", max_batch_size=4)
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64)

How it works. ``KVQCache`` is a ``transformers.Cache`` whose layers hold no tensors: every batch row is one
sequence of a ``kvq.KVCache`` (all layers). ``update`` only records the new keys and values of a layer; the
attention function registered as ``"kvq"`` then appends them to each row's sequence and computes attention on
the stored bytes with ``KVCache.attend_prefill`` (several new tokens) or ``KVCache.attend`` (one), so the
attention a model runs is the attention of the quantized cache, the open block (the last < block_tokens
tokens) excepted: with the default seal policy those rows stay float32 until their block fills.

Padding. A padding token is never appended: the attention function reads, from the 4-D boolean mask
transformers builds, which new tokens attend to themselves (a real token always does, a padding token never),
appends only those to the row's sequence, and computes attention for them only (padding queries get zeros).
It then checks that the whole mask is exactly what kvq computes over the real tokens (causal, the layer's
sliding window counted in real tokens); any other mask (bidirectional or prefix-LM masks, packed sequences,
padding between real tokens under a sliding window, additive biases) raises a ValueError. Left padding, as
``generate`` uses it, passes the check.

Scaling, soft-capping and windows are taken from the model config when the cache is made (Gemma's
``query_pre_attn_scalar``, Gemma 2's ``attn_logit_softcapping``, ``layer_types``/``sliding_window``) and every
call checks that the model asks for the same (a clear error otherwise; ``scale=``/``softcap=`` override).
Tensors may be float32, float16 or bfloat16 (converted to float32 at the boundary, the output converted
back); they must be on the CPU. Chunked attention (Llama 4), attention sinks, linear-attention layers and
training (dropout, gradients through the cache) are refused with the reason.

Errors inside a forward pass (an unsupported mask, a scale that differs, a full pool) leave the earlier
layers holding the step's tokens and the others not: the cache then refuses further use, and a new one is
needed. Errors found before anything is stored (shapes, devices, the attention implementation) change
nothing.

Key codecs may end in ``+center`` (per-block key centering, ``center_keys=True``), as in ``kvq table``.
``layer_codecs={layer: "K/V"}`` stores some layers with another pair (a second kvq cache holds them): the
per-layer sensitivity runs of ``kvq eval --per-layer`` quantize one layer and keep the others in f32.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Iterable, Mapping

import numpy as np

try:
    import torch
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kvq.hf needs torch and transformers: pip install '.[hf]' (distribution kvq-cache) (or pip install torch transformers)"
    ) from e

from . import _core

ATTN_IMPLEMENTATION = "kvq"

__all__ = ["ATTN_IMPLEMENTATION", "KVQCache", "cache_keyword", "kvq_attention", "split_key_spec"]


def split_key_spec(spec: str) -> tuple[str, bool]:
    """'q4_0+rot+center' -> ('q4_0+rot', True): the codec name and whether keys are centered."""
    parts = spec.split("+")
    center = "center" in parts[1:]
    name = "+".join([parts[0]] + [p for p in parts[1:] if p != "center"])
    return name, center


def _pair(spec: str | tuple[str, str]) -> tuple[str, str]:
    if isinstance(spec, str):
        k, sep, v = spec.partition("/")
        if not sep or not k or not v:
            raise ValueError(f"a codec pair is 'KEY/VALUE', e.g. 'q8_0/q4_0'; got {spec!r}")
        return k, v
    k, v = spec
    return str(k), str(v)


def _layer_windows(text_config) -> list[int]:
    """Per layer: 0 (full attention) or the sliding window in tokens, from layer_types/sliding_window."""
    n = text_config.num_hidden_layers
    types = getattr(text_config, "layer_types", None)
    window = getattr(text_config, "sliding_window", None)
    if getattr(text_config, "attention_chunk_size", None):
        raise ValueError("kvq.hf: chunked attention (attention_chunk_size) is not supported: kvq windows slide")
    if types is None:
        # Mistral and Qwen2 style: one sliding_window for all layers (None = full), Qwen2 only below
        # max_window_layers when use_sliding_window is set.
        if not window:
            return [0] * n
        if hasattr(text_config, "use_sliding_window") and not text_config.use_sliding_window:
            return [0] * n
        return [int(window)] * n
    if len(types) != n:
        raise ValueError(f"kvq.hf: config has {len(types)} layer_types for {n} layers")
    out = []
    for i, t in enumerate(types):
        if t == "full_attention":
            out.append(0)
        elif t == "sliding_attention":
            if not window:
                raise ValueError(f"kvq.hf: layer {i} is sliding_attention but the config has no sliding_window")
            out.append(int(window))
        else:
            raise ValueError(f"kvq.hf: layer {i} is of type {t!r}; kvq handles full_attention and sliding_attention")
    return out


class _Group:
    """One kvq.KVCache for the layers stored with one codec pair; seqs[b] is batch row b's sequence."""

    def __init__(self, cache: _core.KVCache):
        self.cache = cache
        self.seqs: list[int] = []


class _KVQLayer(CacheLayerMixin):
    """Bookkeeping of one layer: the length in transformers' positions (padding included), which of those
    positions hold real tokens (valid, per batch row), and the keys/values of the last update until the
    attention function stores them. The data live in the owner's kvq caches."""

    is_compileable = False
    is_croppable = True

    def __init__(self, index: int, window: int):
        super().__init__()
        self.index, self.window = index, window
        self.is_sliding = window > 0
        self.length = 0
        self.valid: torch.Tensor | None = None  # (batch, length) bool
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):  # pragma: no cover - KVQCache.update is used
        raise RuntimeError("kvq.hf: layers are updated through KVQCache.update")

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        return self.length + int(query_length), 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length, self.valid, self.pending = 0, None, None

    # Batch operations act on the whole cache at once (KVQCache overrides them).
    def crop(self, tokens_to_remove: int) -> None:  # pragma: no cover
        raise RuntimeError("kvq.hf: crop the KVQCache, not a layer")

    def reorder_cache(self, beam_idx) -> None:  # pragma: no cover
        raise RuntimeError("kvq.hf: reorder the KVQCache, not a layer")

    def batch_repeat_interleave(self, repeats: int) -> None:  # pragma: no cover
        raise RuntimeError("kvq.hf: repeat the KVQCache, not a layer")

    def batch_select_indices(self, indices) -> None:  # pragma: no cover
        raise RuntimeError("kvq.hf: select from the KVQCache, not a layer")


# update() hands a layer's new keys to the attention function through this table, keyed by the id of the
# key tensor the model passes on (it stays alive, so the id is unique until the entry is taken).
_PENDING: dict[int, tuple[Any, int, torch.Tensor]] = {}


def _check_cpu(name: str, t: torch.Tensor) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"kvq.hf: {name} is on {t.device}; kvq computes on the CPU: move the model to 'cpu'")
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"kvq.hf: {name} is {t.dtype}; float32, float16 or bfloat16 expected")


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """(batch, heads, tokens, head_dim) torch -> (batch, tokens, heads, head_dim) float32 numpy, C order."""
    return t.detach().to(torch.float32).transpose(1, 2).contiguous().numpy()


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """The boolean 'may attend' of a mask: bool as is; float masks must be 0 (attend) or very negative."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(f"kvq.hf: an attention mask of dtype {mask.dtype} is not supported (bool or float)")
    allow = mask == 0
    blocked = mask <= -1e4
    if not bool((allow | blocked).all()):
        raise ValueError("kvq.hf: the attention mask adds a bias (values other than 0 and -inf); kvq attention "
                         "takes masks that only allow or forbid")
    return allow


class KVQCache(Cache):
    """A transformers Cache stored in kvq (one kvq sequence per batch row); use with attn_implementation="kvq".

    Args:
        config: the model's config (``model.config``; the text config of a multimodal model is used).
        key_codec, value_codec: kvq codec names (``kvq.codecs()``); a key codec may end in ``+center``.
        max_batch_size: the most batch rows (beams included) the cache accepts; None = no limit.
        layer_codecs: optional ``{layer: "K/V"}`` for layers stored with another pair.
        **cache_config: any other ``kvq.KVCache`` keyword (block_tokens, seal, threads, max_blocks, scale,
            softcap, nan_policy, seed, ...). ``scale`` and ``softcap`` default to the model's.
    """

    def __init__(self, config, key_codec: str = "q8_0", value_codec: str = "q4_0",
                 max_batch_size: int | None = None, *, layer_codecs: Mapping[int, Any] | None = None,
                 **cache_config: Any):
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        for bad in ("n_layers", "n_kv_heads", "head_dim", "n_heads", "sliding_window", "center_keys"):
            if bad in cache_config:
                raise ValueError(f"kvq.hf.KVQCache: {bad} comes from the model config (or the key codec's "
                                 "'+center'); do not pass it")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"kvq.hf.KVQCache: max_batch_size must be >= 1 (or None), got {max_batch_size}")
        n_layers = int(text.num_hidden_layers)
        n_heads = int(text.num_attention_heads)
        n_kv = int(getattr(text, "num_key_value_heads", None) or n_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // n_heads)
        windows = _layer_windows(text)
        if getattr(text, "kv_sharing_modes", None) or getattr(text, "num_kv_shared_layers", 0):
            raise ValueError("kvq.hf: models that share KV between layers are not supported")
        scale = cache_config.pop("scale", None)
        if scale is None:
            pre = getattr(text, "query_pre_attn_scalar", None)
            scale = float(pre) ** -0.5 if pre else head_dim ** -0.5
        softcap = cache_config.pop("softcap", None)
        if softcap is None:
            softcap = float(getattr(text, "attn_logit_softcapping", None) or 0.0)

        overrides = {int(l): _pair(p) for l, p in (layer_codecs or {}).items()}
        for l in overrides:
            if not 0 <= l < n_layers:
                raise ValueError(f"kvq.hf.KVQCache: layer_codecs names layer {l}; the model has {n_layers} layers")
        pairs = [overrides.get(l, (key_codec, value_codec)) for l in range(n_layers)]
        groups: dict[tuple[str, str], _Group] = {}
        for pair in dict.fromkeys(pairs):
            k_name, center = split_key_spec(pair[0])
            if split_key_spec(pair[1])[1]:
                raise ValueError(f"kvq.hf.KVQCache: '+center' applies to keys only, got value codec {pair[1]!r}")
            groups[pair] = _Group(_core.KVCache(
                n_layers, n_kv, head_dim, n_heads, k_name, pair[1], scale=scale, softcap=softcap,
                sliding_window=windows, center_keys=center, **cache_config))
        self._config = config
        self._groups = list(groups.values())
        self._layer_group = [groups[p] for p in pairs]
        self._pairs = pairs
        self.max_batch_size = max_batch_size
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv, head_dim
        self.scale, self.softcap, self.windows = float(scale), float(softcap), windows
        self.block_tokens = int(self._groups[0].cache.config["block_tokens"])
        self._failed = ""
        super().__init__(layers=[_KVQLayer(i, w) for i, w in enumerate(windows)])

    # ----------------------------------------------------------------------------------- information
    @property
    def key_codec(self) -> str:
        return self._pairs[0][0]

    @property
    def value_codec(self) -> str:
        return self._pairs[0][1]

    @property
    def rows(self) -> int:
        """Batch rows held (0 before the first forward)."""
        return len(self._groups[0].seqs)

    @property
    def kvq_caches(self) -> list:
        """The kvq.KVCache objects (one per distinct codec pair) with the data."""
        return [g.cache for g in self._groups]

    def bytes_per_token(self) -> float:
        """Bytes of one token over all layers as stored (each layer with its own pair)."""
        total = 0.0
        for g in self._groups:
            share = sum(1 for x in self._layer_group if x is g) / len(self._layer_group)
            total += g.cache.bytes_per_token() * share
        return total

    def bytes_used(self) -> int:
        return sum(g.cache.bytes_used() for g in self._groups)

    def n_tokens(self, row: int, layer: int = 0) -> int:
        """Real (non-padding) tokens of a batch row stored in a layer (a windowed layer may have released
        the oldest blocks; kvq still counts them)."""
        return self._layer_group[layer].cache.n_tokens(self._layer_group[layer].seqs[row], layer)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if layer_idx >= len(self.layers):
            return 0
        return self.layers[layer_idx].length

    def __repr__(self) -> str:
        return (f"KVQCache(key_codec={self.key_codec!r}, value_codec={self.value_codec!r}, layers={len(self.layers)}, "
                f"rows={self.rows}, length={self.get_seq_length()})")

    # ----------------------------------------------------------------------------------- update
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        impl = getattr(self._config, "_attn_implementation", None)
        if impl != ATTN_IMPLEMENTATION:
            raise ValueError(f"kvq.hf.KVQCache needs the model's attention to be kvq's: load it with "
                             f"attn_implementation='kvq' (or model.set_attn_implementation('kvq')); it is {impl!r}")
        if not 0 <= layer_idx < len(self.layers):
            raise ValueError(f"kvq.hf.KVQCache: layer {layer_idx} out of range ({len(self.layers)} layers)")
        _check_cpu("key_states", key_states)
        _check_cpu("value_states", value_states)
        if key_states.requires_grad or value_states.requires_grad:
            raise ValueError("kvq.hf: no gradients flow through a kvq cache; run under torch.no_grad()")
        b, h, q, d = key_states.shape
        if h != self.n_kv_heads or d != self.head_dim or value_states.shape != key_states.shape:
            raise ValueError(f"kvq.hf.KVQCache: keys {tuple(key_states.shape)}, values {tuple(value_states.shape)}; "
                             f"expected (batch, {self.n_kv_heads}, tokens, {self.head_dim}) both")
        if self._failed:
            raise RuntimeError(f"kvq.hf.KVQCache: an earlier forward failed inside the cache ({self._failed}); its "
                               "rows may hold part of that step: make a new KVQCache")
        layer = self.layers[layer_idx]
        if layer.pending is not None:
            for key in [k for k, e in _PENDING.items() if e[0] is self]:
                del _PENDING[key]
            raise RuntimeError(f"kvq.hf: layer {layer_idx}'s last keys never reached kvq attention; the model must "
                               "use attn_implementation='kvq' on every layer")
        self._ensure_rows(b)
        layer.pending = (key_states, value_states)
        layer.length += q
        layer.is_initialized = True
        _PENDING[id(key_states)] = (self, layer_idx, key_states)
        return key_states, value_states

    def _ensure_rows(self, batch: int) -> None:
        if self.rows == batch:
            return
        if self.rows:
            raise ValueError(f"kvq.hf.KVQCache holds {self.rows} rows; a forward of batch {batch} needs a new cache "
                             "(or reorder_cache / batch_select_indices)")
        if self.max_batch_size is not None and batch > self.max_batch_size:
            raise ValueError(f"kvq.hf.KVQCache: batch of {batch} rows (beams included) exceeds max_batch_size="
                             f"{self.max_batch_size}")
        for g in self._groups:
            g.seqs = [g.cache.add_sequence() for _ in range(batch)]

    # ----------------------------------------------------------------------------------- attention
    def _attend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None) -> torch.Tensor:
        layer = self.layers[layer_idx]
        group = self._layer_group[layer_idx]
        layer.pending = None
        b, h, q, d = query.shape
        _check_cpu("query", query)
        if h != self.n_heads or d != self.head_dim or query.shape[0] != key.shape[0] or query.shape[2] != key.shape[2]:
            raise ValueError(f"kvq.hf: query {tuple(query.shape)} does not match keys {tuple(key.shape)} "
                             f"({self.n_heads} heads of {self.head_dim})")
        past = layer.length - q
        valid_new = self._valid_new(layer, attention_mask, b, past, q)
        qn, kn, vn = _to_numpy(query), _to_numpy(key), _to_numpy(value)
        out = self._append_and_attend(layer, group, qn, kn, vn, valid_new)
        new = torch.from_numpy(valid_new)
        layer.valid = new if layer.valid is None else torch.cat([layer.valid, new], dim=1)
        return torch.from_numpy(out).to(query.dtype)

    def _append_and_attend(self, layer: _KVQLayer, group: _Group, qn: np.ndarray, kn: np.ndarray, vn: np.ndarray,
                           valid_new: np.ndarray) -> np.ndarray:
        layer_idx = layer.index
        b, q, h, d = qn.shape
        out = np.zeros((b, q, h, d), dtype=np.float32)
        for row in range(b):
            idx = np.flatnonzero(valid_new[row])
            if idx.size == 0:
                continue
            seq = group.seqs[row]
            contiguous = idx[-1] - idx[0] + 1 == idx.size
            ks = kn[row, idx[0]:idx[-1] + 1] if contiguous else np.ascontiguousarray(kn[row, idx])
            vs = vn[row, idx[0]:idx[-1] + 1] if contiguous else np.ascontiguousarray(vn[row, idx])
            qs = qn[row, idx[0]:idx[-1] + 1] if contiguous else np.ascontiguousarray(qn[row, idx])
            if idx.size == 1:
                group.cache.append(layer_idx, ks, vs, seq=seq)
                out[row, idx[0]] = group.cache.attend(layer_idx, qs[0], seq=seq)
                continue
            # One append: a windowed layer releases blocks by the window of the append's first token, so
            # every query of the piece still sees its whole window (lib/cache/cache_append.cpp).
            group.cache.append(layer_idx, ks, vs, seq=seq)
            out[row, idx] = group.cache.attend_prefill(layer_idx, qs, seq=seq)
        return out

    def _valid_new(self, layer: _KVQLayer, mask: torch.Tensor | None, b: int, past: int, q: int) -> np.ndarray:
        """Which of the q new tokens of each row are real, from the mask's diagonal; then checks that the mask
        is what kvq computes over the real tokens (causal, window in real tokens)."""
        if mask is None:
            if layer.valid is not None and not bool(layer.valid.all()):
                raise ValueError("kvq.hf: no attention mask, but the cache holds padding; pass the attention_mask")
            return np.ones((b, q), dtype=bool)
        if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
            raise ValueError(f"kvq.hf: unsupported attention mask {type(mask).__name__}"
                             f"{tuple(mask.shape) if hasattr(mask, 'shape') else ''}; a 4-D tensor (batch, 1, q, kv) "
                             "is expected")
        kv = past + q
        if mask.shape[0] not in (1, b) or mask.shape[2] != q or mask.shape[3] != kv:
            raise ValueError(f"kvq.hf: attention mask of shape {tuple(mask.shape)}; expected ({b}, 1, {q}, {kv})")
        allow = _allowed(mask.to("cpu")).expand(b, -1, -1, -1)
        if allow.shape[1] != 1 and not bool((allow == allow[:, :1]).all()):
            raise ValueError("kvq.hf: per-head attention masks are not supported")
        allow = allow[:, 0]  # (b, q, kv)
        qpos = torch.arange(past, kv)
        valid_new = allow[:, torch.arange(q), qpos]  # a real token attends to itself
        old = layer.valid if layer.valid is not None else torch.zeros((b, 0), dtype=torch.bool)
        if old.shape != (b, past):
            raise ValueError(f"kvq.hf: cache bookkeeping holds {tuple(old.shape)} positions, the mask {past}")
        valid = torch.cat([old, valid_new], dim=1)  # (b, kv)
        real = torch.cumsum(valid, dim=1) - 1
        expected = valid[:, None, :] & (torch.arange(kv)[None, None, :] <= qpos[None, :, None])
        if layer.window:
            expected &= (real[:, qpos][:, :, None] - real[:, None, :]) < layer.window
        wrong = (allow != expected) & valid_new[:, :, None]
        if bool(wrong.any()):
            r, i, j = (int(x) for x in wrong.nonzero()[0])
            raise ValueError(
                f"kvq.hf: unsupported attention mask on layer {layer.index}: query {past + i} of row {r} "
                f"{'may' if bool(allow[r, i, j]) else 'may not'} attend position {j}, but kvq attention "
                "over the real tokens is causal" + (f" with a window of {layer.window}" if layer.window else "") +
                " (left padding is supported; bidirectional, packed or custom masks are not)")
        return valid_new.numpy().copy()

    # ----------------------------------------------------------------------------------- batch edits
    def crop(self, tokens_to_remove: int) -> None:
        """Removes the last tokens (transformers' convention: crop(-n) removes n, crop(0) does nothing; a
        positive argument is refused as by DynamicCache). A windowed layer can go back at most
        block_tokens tokens past its window (kvq raises otherwise, changing nothing)."""
        if tokens_to_remove > 0:
            raise ValueError(f"kvq.hf.KVQCache.crop({tokens_to_remove}): pass a negative number of tokens to remove")
        n = -int(tokens_to_remove)
        if n == 0 or not self.rows:
            return
        length = self.get_seq_length()
        if any(l.length != length or l.pending is not None for l in self.layers):
            raise RuntimeError("kvq.hf.KVQCache.crop in the middle of a forward pass")
        if n > length:
            raise ValueError(f"kvq.hf.KVQCache.crop: cannot remove {n} of {length} tokens")
        valid = self.layers[0].valid
        keep = valid[:, : length - n].sum(dim=1).tolist()
        # Check every row first (truncate raises when a window has released what is needed).
        for g in self._groups:
            for row, seq in enumerate(g.seqs):
                if keep[row] > g.cache.n_tokens(seq, 0):
                    raise RuntimeError("kvq.hf.KVQCache: bookkeeping out of step with the kvq cache")
        snapshots = []
        try:
            for g in self._groups:
                for row, seq in enumerate(g.seqs):
                    snapshots.append((g, row, g.cache.fork(seq)))
            for g in self._groups:
                for row, seq in enumerate(g.seqs):
                    g.cache.truncate(keep[row], seq=seq)
        except Exception:
            # Put back what was truncated: the forks hold the old tokens.
            for g, row, backup in snapshots:
                g.cache.remove(g.seqs[row])
                g.seqs[row] = backup
            raise
        for g, _, backup in snapshots:
            g.cache.remove(backup)
        for l in self.layers:
            l.length -= n
            l.valid = l.valid[:, : l.length]

    def _rebuild_rows(self, order: list[int]) -> None:
        """Row i of the new batch is old row order[i]: forks share the full blocks; old sequences removed."""
        if self.layers[0].pending is not None or any(l.pending is not None for l in self.layers):
            raise RuntimeError("kvq.hf.KVQCache: batch edit in the middle of a forward pass")
        if self.max_batch_size is not None and len(order) > self.max_batch_size:
            raise ValueError(f"kvq.hf.KVQCache: {len(order)} rows exceed max_batch_size={self.max_batch_size}")
        for i in order:
            if not 0 <= i < self.rows:
                raise ValueError(f"kvq.hf.KVQCache: row {i} out of range ({self.rows} rows)")
        for g in self._groups:
            new = [g.cache.fork(g.seqs[i]) for i in order]
            for s in g.seqs:
                g.cache.remove(s)
            g.seqs = new
        index = torch.tensor(order, dtype=torch.long)
        for l in self.layers:
            if l.valid is not None:
                l.valid = l.valid.index_select(0, index)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i becomes old row beam_idx[i] (kvq fork: full blocks shared, not copied)."""
        if self.rows:
            self._rebuild_rows([int(i) for i in beam_idx.reshape(-1).tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.rows:
            self._rebuild_rows([i for i in range(self.rows) for _ in range(int(repeats))])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.rows:
            idx = torch.as_tensor(indices).reshape(-1)
            if idx.dtype == torch.bool:
                idx = idx.nonzero().reshape(-1)
            self._rebuild_rows([int(i) for i in idx.tolist()])

    def reset(self) -> None:
        for g in self._groups:
            for s in g.seqs:
                g.cache.remove(s)
            g.seqs = []
        for l in self.layers:
            l.reset()

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return self.rows if self.rows else -1


def kvq_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers attention function "kvq": stores the layer's new keys/values in the KVQCache that
    received them and computes attention on the stored codes. Returns (output (batch, q, heads, head_dim),
    None)."""
    entry = _PENDING.pop(id(key), None)
    if entry is None or entry[2] is not key:
        raise ValueError("kvq attention: these keys did not come from a kvq.hf.KVQCache; pass "
                         "past_key_values=kvq.hf.KVQCache(model.config, ...) (with use_cache=True)")
    cache, layer_idx, _ = entry
    if getattr(module, "layer_idx", layer_idx) != layer_idx:
        raise ValueError(f"kvq attention: module of layer {module.layer_idx} got the keys of layer {layer_idx}")
    try:
        if dropout and getattr(module, "training", False):
            raise ValueError("kvq attention: dropout / training is not supported (call model.eval())")
        if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
            raise ValueError("kvq attention: attention sinks (s_aux) are not supported")
        want = scaling if scaling is not None else cache.head_dim ** -0.5
        if not math.isclose(float(want), cache.scale, rel_tol=1e-6):
            raise ValueError(f"kvq attention: layer {layer_idx} asks for scaling {want}, the KVQCache was made with "
                             f"scale {cache.scale}; pass scale={want} to KVQCache")
        cap = float(softcap or 0.0)
        if not math.isclose(cap, cache.softcap, rel_tol=1e-6):
            raise ValueError(f"kvq attention: layer {layer_idx} asks for softcap {softcap}, the KVQCache has "
                             f"{cache.softcap}; pass softcap= to KVQCache")
        w = int(sliding_window or 0)
        if w != cache.windows[layer_idx]:
            raise ValueError(f"kvq attention: layer {layer_idx} asks for a sliding window of {sliding_window}, the "
                             f"KVQCache has {cache.windows[layer_idx] or None} from the config")
        out = cache._attend(layer_idx, query, key, value, attention_mask)
    except Exception as e:
        # This forward's earlier layers have stored their tokens, this one has not: the cache is out of step.
        cache._failed = cache._failed or f"{type(e).__name__}: {e}"
        raise
    finally:
        cache.layers[layer_idx].pending = None
    return out, None


def cache_keyword(model) -> str:
    """The name under which this transformers version's forward/generate take a cache: ``cache`` (5.x; the old
    ``past_key_values`` is deprecated) or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvq_attention)
    # The boolean (batch, 1, q, kv) masks of sdpa; None when attention is plainly causal without padding.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


_register()
