"""KVQCache, the transformers Cache whose batch rows are sequences of kvq caches (see kvq.hf): update records
a layer's new keys and values, the attention function has _attend store and attend on them, and the batch
edits of generate (crop, beam reorder, repeat, select) act on every layer's sequences at once."""

from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from transformers.cache_utils import Cache

from .. import _core
from .._pairs import layer_pairs, split_pair
from ._attention import _PENDING, ATTN_IMPLEMENTATION
from ._config import _AttentionShape, _layer_pairs, _scale_and_softcap, split_key_spec
from ._layer import _Group, _KVQLayer
from ._tensors import _check_cpu, _to_numpy, _valid_new


def _key_scales(scales, n_layers: int, n_kv: int, d: int, g: int) -> list:
    """Per layer None, or s as a float32 array (n_kv, d) whose inverse is finite too (kvq.KVCache's rule for
    key_scales); ValueError on a bad entry."""
    out: list = [None] * n_layers
    if scales is None:
        return out
    items = scales.items() if isinstance(scales, Mapping) else enumerate(scales)
    for layer, s in items:
        layer = _integer("kvq.hf.KVQCache", "a key_scales layer", layer)
        if not 0 <= layer < n_layers:
            raise ValueError(f"kvq.hf.KVQCache: key_scales names layer {layer}; the model has {n_layers} layers")
        if s is None:
            continue
        if isinstance(s, torch.Tensor):  # any real dtype (numpy has no bfloat16): through float64 in torch
            if s.is_complex():
                raise ValueError(f"kvq.hf.KVQCache: key_scales[{layer}] must be real, got {s.dtype}")
            s = s.detach().cpu().to(torch.float64).numpy()
        a = np.array(s, dtype=np.float64)
        if a.shape != (n_kv, d):
            raise ValueError(f"kvq.hf.KVQCache: key_scales[{layer}] has shape {a.shape}; expected ({n_kv}, {d})")
        with np.errstate(all="ignore"):
            s32, inv32 = a.astype(np.float32), np.repeat(1.0 / a, g, axis=0).astype(np.float32)
        if not (np.all(np.isfinite(a)) and np.all(a > 0) and np.all(np.isfinite(s32)) and np.all(s32 > 0)
                and np.all(np.isfinite(inv32)) and np.all(inv32 > 0)):
            raise ValueError(f"kvq.hf.KVQCache: key_scales[{layer}] must be positive and finite in float32 (and so "
                             "its inverse)")
        out[layer] = s32
    return out


def _integer(where: str, name: str, x) -> int:
    """x as a count, as torch takes one: an int (a numpy integer, a 0-d integer tensor), not a bool or a float."""
    if not isinstance(x, bool):
        try:
            return operator.index(x)
        except TypeError:
            pass
    raise ValueError(f"{where}: {name} must be an integer, got {x!r}")


class KVQCache(Cache):
    """A transformers Cache stored in kvq (one kvq sequence per batch row); use with attn_implementation="kvq".

    Args:
        config: the model's config (``model.config``; the text config of a multimodal model is used).
        key_codec, value_codec: kvq codec names (``kvq.codecs()``); a key codec may end in ``+center``, or be
            ``chan2`` .. ``chan8`` (per-channel keys, sealed a block at a time); the '+center' of a layer's own
            key codec (layer_codecs) centers that layer's keys only.
        max_batch_size: the most batch rows (beams included) the cache accepts; None: at most MAX_ROWS
            (65536) through batch edits (batch_repeat_interleave, reorder_cache, batch_select_indices).
        layer_codecs: optional ``{layer: "K/V"}`` for layers stored with another pair.
        key_scales: optional per-layer channel weights folded into the keys: ``{layer: s}`` (or a list, one
            entry per layer, None for none), s of shape (n_kv_heads, head_dim), positive and finite. Layer l's
            keys are stored as k ⊙ s and its queries attend as q ⊘ s (s of the query head's kv head), so the
            scores are unchanged and the keys' rounding error lands where s is small: choose s large on the
            channels the queries weigh (kvq.hf.key_scales_from_norms). The values are untouched.
        **cache_config: any other ``kvq.KVCache`` keyword (block_tokens, seal, threads, max_blocks, scale,
            softcap, nan_policy, seed, ...). ``scale`` and ``softcap`` default to the model's.
    """

    MAX_ROWS = 1 << 16  # batch edits of a cache without max_batch_size: checked before a row list is made

    def __init__(self, config, key_codec: str = "q8_0", value_codec: str = "q4_0",
                 max_batch_size: int | None = None, *, layer_codecs: Mapping[int, Any] | None = None,
                 key_scales: Mapping[int, Any] | Sequence[Any] | None = None, **cache_config: Any):
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        for bad in ("n_layers", "n_kv_heads", "head_dim", "n_heads", "sliding_window", "center_keys"):
            if bad in cache_config:
                raise ValueError(f"kvq.hf.KVQCache: {bad} comes from the model config (or the key codec's "
                                 "'+center'); do not pass it")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"kvq.hf.KVQCache: max_batch_size must be >= 1 (or None), got {max_batch_size}")
        shape = _AttentionShape.of(text)
        scale, softcap = _scale_and_softcap(text, shape.head_dim, cache_config.pop("scale", None),
                                            cache_config.pop("softcap", None))
        pairs = _layer_pairs(key_codec, value_codec, layer_codecs, shape.n_layers)
        # One kvq.KVCache holds every layer, each with its own codecs (its layer_codecs; '+center' is a key
        # codec's suffix, so a layer's own). Key scales go down to kvq (KVCache(key_scales=...): k ⊙ s stored, q ⊘ s attending), ones on layers
        # without any.
        self._key_scales = _key_scales(key_scales, shape.n_layers, shape.n_kv_heads, shape.head_dim,
                                       shape.n_heads // shape.n_kv_heads)
        all_scales = None
        if any(s is not None for s in self._key_scales):
            all_scales = np.ones((shape.n_layers, shape.n_kv_heads, shape.head_dim), dtype=np.float32)
            for layer, s in enumerate(self._key_scales):
                if s is not None:
                    all_scales[layer] = s
        for _, v in pairs:
            if split_key_spec(v)[1]:
                raise ValueError(f"kvq.hf.KVQCache: '+center' applies to keys only, got value codec {v!r}")
        group = _Group(_core.KVCache(
            shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.n_heads, key_codec=pairs[0][0],
            value_codec=pairs[0][1], layer_codecs=pairs, scale=scale, softcap=softcap, sliding_window=shape.windows,
            key_scales=all_scales, **cache_config))
        self._config = config
        self._groups = [group]
        self._layer_group = [group] * shape.n_layers
        self._pairs = pairs
        self.max_batch_size = max_batch_size
        self.n_heads, self.n_kv_heads, self.head_dim = shape.n_heads, shape.n_kv_heads, shape.head_dim
        self.scale, self.softcap, self.windows = float(scale), float(softcap), shape.windows
        self.block_tokens = int(self._groups[0].cache.config["block_tokens"])
        self._failed = ""
        super().__init__(layers=[_KVQLayer(i, w) for i, w in enumerate(shape.windows)])

    @classmethod
    def from_spec(cls, config, spec: str, max_batch_size: int | None = None, **cache_config: Any) -> "KVQCache":
        """A cache from a pair spec as ``kvq eval --pairs`` takes it: 'K/V', 'K/V|K2/V2' (K2/V2 on the
        sliding-window layers) or a per-layer list 'P0;P1*3;...' (what ``kvq eval --budget`` proposes)."""
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        pairs = layer_pairs(spec, _AttentionShape.of(text).windows)
        k, v = split_pair(pairs[0])
        return cls(config, k, v, max_batch_size, layer_codecs=dict(enumerate(pairs)), **cache_config)

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
        """The kvq.KVCache objects with the data: one, with every layer (each with its own codecs)."""
        return [g.cache for g in self._groups]

    def bytes_per_token(self) -> float:
        """Bytes of one token over all layers as stored (each layer with its own pair)."""
        return sum(g.cache.bytes_per_token(layer=l) for l, g in enumerate(self._layer_group))

    def bits_per_value(self, layer: int | None = None, context: int | None = None) -> tuple[float, float]:
        """(key bits, value bits) per stored value of one layer, or averaged over the layers with every layer
        counted alike (each at its own pair; a sliding-window layer counts at its pair's bits however many
        tokens it keeps). Everything stored is counted, as bytes_per_token counts it: codes, block scales,
        '+center' means and per-channel parameters (both on the keys). With an exact tail
        (exact_tail_tokens=T) and a context of n tokens, the tail's min(T, m) tokens of the m a layer holds
        (m = n, or its window if shorter) count at the staging precision (32 or 16 bits), averaged over the
        m (kvq.KVCache.average_bytes_per_token); without a context, the sealed format alone. The float rows
        of a block not yet sealed beyond the tail are a working buffer, not counted."""
        layers = range(len(self._pairs)) if layer is None else [layer]
        values = len(layers) * self.n_kv_heads * self.head_dim
        key_bytes = value_bytes = 0.0
        for l in layers:
            cache = self._layer_group[l].cache
            # A value row is the value codec's row and nothing else; the keys are the rest.
            value = _core.codec_info(self._pairs[l][1], self.head_dim)["row_bytes"] * self.n_kv_heads
            key = cache.bytes_per_token(layer=l) - value
            tail = int(cache.config["exact_tail_tokens"])
            if context and tail:
                held = min(context, self.windows[l]) if self.windows[l] else context
                share = min(held, tail) / held
                exact = (4 if cache.config["staging"] == "f32" else 2) * self.head_dim * self.n_kv_heads
                key, value = (1 - share) * key + share * exact, (1 - share) * value + share * exact
            key_bytes += key
            value_bytes += value
        return 8 * key_bytes / values, 8 * value_bytes / values

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
        valid_new = _valid_new(layer, attention_mask, b, past, q)
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

    # ----------------------------------------------------------------------------------- batch edits
    def crop(self, tokens_to_remove: int) -> None:
        """Removes the last tokens (transformers' convention: crop(-n) removes n, crop(0) does nothing; a
        positive argument is refused as by DynamicCache). A windowed layer can go back at most
        block_tokens tokens past its window (kvq raises otherwise, changing nothing)."""
        tokens_to_remove = _integer("kvq.hf.KVQCache.crop", "tokens_to_remove", tokens_to_remove)
        if tokens_to_remove > 0:
            raise ValueError(f"kvq.hf.KVQCache.crop({tokens_to_remove}): pass a negative number of tokens to remove")
        n = -tokens_to_remove
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

    def _rows_of(self, fn: str, name: str, indices, *, torch_op: str, negative: bool, mask: bool) -> list[int]:
        """The old rows a batch index names, checked as torch checks the index of its batch edit (torch_op):
        a 1-D tensor (or list) of integers within the rows (negative ones counted from the end where torch
        takes them), or a bool mask of one entry per row where torch takes one; never empty."""
        where = f"kvq.hf.KVQCache.{fn}"
        try:
            idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(indices)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"{where}: {name} must be a 1-D integer tensor or list ({torch_op}); "
                             f"got {indices!r}") from e
        if idx.ndim != 1:
            raise ValueError(f"{where}: {name} must be 1-D ({torch_op}), got shape {tuple(idx.shape)}")
        if idx.numel() == 0:
            raise ValueError(f"{where}: {name} is empty; the cache would hold no rows")
        if idx.dtype == torch.bool and mask:
            if self.rows and idx.numel() != self.rows:
                raise ValueError(f"{where}: a bool mask of {idx.numel()} entries for {self.rows} rows")
            idx = idx.nonzero().reshape(-1)
            if idx.numel() == 0:
                raise ValueError(f"{where}: {name} selects no row; the cache would hold no rows")
        elif idx.dtype not in (torch.int64, torch.int32):  # what index_select and indexing take (int8, uint8: no)
            kinds = "integers or a bool mask (int64 or int32 integers)" if mask else "integers (int64 or int32)"
            raise ValueError(f"{where}: {name} must hold {kinds} ({torch_op}), got {idx.dtype}")
        if idx.numel() > self._row_limit():  # before a list of them is made
            raise ValueError(f"{where}: {idx.numel()} rows exceed {self._row_limit_name()}")
        order = [int(i) for i in idx.tolist()]
        if not self.rows:
            return order
        low = -self.rows if negative else 0
        for i in order:
            if not low <= i < self.rows:
                allowed = f"{low}..{self.rows - 1}"
                raise ValueError(f"{where}: row {i} out of range ({self.rows} rows: {allowed}, as {torch_op} takes)")
        return [i % self.rows for i in order]

    def _row_limit(self) -> int:
        return self.max_batch_size if self.max_batch_size is not None else self.MAX_ROWS

    def _row_limit_name(self) -> str:
        if self.max_batch_size is not None:
            return f"max_batch_size={self.max_batch_size}"
        return f"KVQCache.MAX_ROWS={self.MAX_ROWS} (the most rows a cache without max_batch_size takes)"

    def _rebuild_rows(self, order: list[int]) -> None:
        """Row i of the new batch is old row order[i]: forks share the full blocks; old sequences removed. The
        forks are all made before anything is removed, so a failure (PoolExhausted) changes nothing."""
        if any(l.pending is not None for l in self.layers):
            raise RuntimeError("kvq.hf.KVQCache: batch edit in the middle of a forward pass")
        if self.max_batch_size is not None and len(order) > self.max_batch_size:
            raise ValueError(f"kvq.hf.KVQCache: {len(order)} rows exceed max_batch_size={self.max_batch_size}")
        if not order or not all(0 <= i < self.rows for i in order):
            raise ValueError(f"kvq.hf.KVQCache: rows {order} out of range ({self.rows} rows)")
        made = []
        try:
            for g in self._groups:
                forks: list = []
                made.append((g, forks))
                for i in order:
                    forks.append(g.cache.fork(g.seqs[i]))
        except BaseException:
            for g, forks in made:
                for s in forks:
                    g.cache.remove(s)
            raise
        for g, forks in made:
            for s in g.seqs:
                g.cache.remove(s)
            g.seqs = forks
        index = torch.tensor(order, dtype=torch.long)
        for l in self.layers:
            if l.valid is not None:
                l.valid = l.valid.index_select(0, index)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i becomes old row beam_idx[i] (kvq fork: full blocks shared, not copied). beam_idx
        as torch's index_select takes it: 1-D integers in 0..rows-1; a failed reorder changes nothing."""
        order = self._rows_of("reorder_cache", "beam_idx", beam_idx, torch_op="index_select", negative=False,
                              mask=False)
        if self.rows:
            self._rebuild_rows(order)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row repeated `repeats` times in place (generate's expansion for beams or samples): repeats >= 1."""
        n = _integer("kvq.hf.KVQCache.batch_repeat_interleave", "repeats", repeats)
        if n < 1:
            raise ValueError(f"kvq.hf.KVQCache.batch_repeat_interleave: repeats must be >= 1, got {n} (the cache "
                             "would hold no rows)")
        # Bounded before the n × rows list is made: by max_batch_size, else by MAX_ROWS.
        if self.rows * n > self._row_limit():
            raise ValueError(f"kvq.hf.KVQCache.batch_repeat_interleave: {self.rows} rows repeated {n} times exceed "
                             f"{self._row_limit_name()}")
        if self.rows:
            self._rebuild_rows([i for i in range(self.rows) for _ in range(n)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keeps the rows `indices` names, as torch indexing takes it: 1-D integers (negative ones from the
        end) or a bool mask of one entry per row."""
        order = self._rows_of("batch_select_indices", "indices", indices, torch_op="torch indexing", negative=True,
                              mask=True)
        if self.rows:
            self._rebuild_rows(order)

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
