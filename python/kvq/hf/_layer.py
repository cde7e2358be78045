"""The bookkeeping of a KVQCache: one kvq.KVCache per codec pair with each batch row's sequence, and per
layer the transformers-side length, which positions are real tokens and the keys not yet stored."""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from .. import _core


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
