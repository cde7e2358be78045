"""Hugging Face transformers on a kvq cache: attention computed on the stored codes.

    import kvq.hf                                   # registers attn_implementation="kvq"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvq")
    out = model.generate(**inputs, max_new_tokens=64)           # a q8_0/q4_0 KVQCache made by generate()
    model.generation_config.cache_config = {"key_codec": "q4_0+rot", "value_codec": "q4_0"}  # its codecs
    cache = kvq.hf.KVQCache(model.config, key_codec="q8_0", value_codec="q4_0", max_batch_size=4)
    out = model.generate(**inputs, cache=cache, max_new_tokens=64)  # or a cache of your own

Default cache. Without a cache argument, generate() (and so pipeline()) on a model whose attention is kvq's
makes KVQCache(model.config, **generation_config.cache_config); cache_implementation="kvq" asks for the same
on any call. transformers has no registry of cache implementations: importing kvq.hf wraps
GenerationMixin._prepare_cache_for_generation for this (_generate.py); other models and caches are
untouched.

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

Key codecs may end in ``+center`` (per-block key centering), as in ``kvq table``; a layer's own key codec
(``layer_codecs``) with it centers that layer alone.
``KVQCache.from_spec(config, "q8_0/q4_0;chan3/polar:budget=3*17")`` takes a pair spec as ``kvq eval --pairs``
does ('K/V', 'K/V|K2/V2', or one pair per layer separated by ';', a run as 'PAIR*n': kvq._pairs), e.g. a
proposal of ``kvq eval --budget``. ``layer_codecs={layer: "K/V"}`` stores some layers with another pair (kvq's own per-layer codecs in the
same cache): the
per-layer sensitivity runs of ``kvq eval --per-layer`` quantize one layer and keep the others in f32.

Layout: _config.py reads the model (layer shapes, windows, scale, the cache keyword), _layer.py holds the
per-layer bookkeeping, _tensors.py what crosses the torch boundary (device and dtype checks, the attention
mask read as real tokens), _cache.py the Cache class, _attention.py the attention function and _generate.py
generate()'s default cache, _scales.py key channel weights from the model's q_norm and k_norm
(``KVQCache(key_scales=key_scales_from_norms(model))``: keys stored as k ⊙ s, queries attend as q ⊘ s) and
_calibrate.py the same weights from one prefill of a calibration prompt
(``KVQCache(key_scales=calibrate_key_scales(model, ids, centered=True))``: s_j = (E[q_j²] / E[k_j²])^¼).
"""

from __future__ import annotations

try:
    # The names the modules below use, imported here first so that a missing or too old transformers
    # gets this message.
    import torch  # noqa: F401
    from transformers import AttentionInterface  # noqa: F401
    from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: F401
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kvq.hf needs torch and transformers: pip install '.[hf]' (distribution kvq-cache) (or pip install torch transformers)"
    ) from e

from ._attention import ATTN_IMPLEMENTATION, kvq_attention, register as _register
from ._cache import KVQCache
from ._config import _layer_windows, _pair, cache_keyword, split_key_spec  # the first two for kvq.model_eval
from ._generate import CACHE_IMPLEMENTATION, default_cache, install as _install_generate
from ._calibrate import KeyMoments, KeyScalesByFormat, calibrate_key_scales, key_moments
from ._scales import key_scales_from_norms

__all__ = ["ATTN_IMPLEMENTATION", "CACHE_IMPLEMENTATION", "KVQCache", "KeyMoments", "KeyScalesByFormat",
           "cache_keyword", "calibrate_key_scales", "default_cache", "key_moments", "key_scales_from_norms",
           "kvq_attention", "split_key_spec"]

_register()
_install_generate()
