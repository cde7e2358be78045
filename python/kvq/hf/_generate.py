"""generate() without an explicit cache: transformers (5.x) has no registry of cache implementations, so
kvq.hf wraps GenerationMixin._prepare_cache_for_generation, the one method where generate() makes its
default cache. Where the caller passed no cache, uses a cache (use_cache is not False) and either asks for
cache_implementation="kvq" or runs a model whose attention is kvq's with no cache_implementation, it makes
a KVQCache from generation_config.cache_config (a dict of KVQCache keywords, e.g. {"key_codec": "q4_0",
"value_codec": "q4_0", "block_tokens": 64}; none = q8_0/q4_0). Everything else goes to transformers' own
method unchanged (a cache passed together with cache_implementation="kvq" is refused there)."""

from __future__ import annotations

import copy
import functools
import inspect

from transformers import GenerationMixin
from transformers.generation import configuration_utils as _gen_config

from ._attention import ATTN_IMPLEMENTATION
from ._cache import KVQCache

CACHE_IMPLEMENTATION = "kvq"


def default_cache(model, generation_config) -> KVQCache:
    """The KVQCache generate() makes for ``model`` when none is passed: KVQCache(model.config,
    **generation_config.cache_config)."""
    options = generation_config.cache_config
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ValueError("kvq.hf: generation_config.cache_config must be a dict of kvq.hf.KVQCache keywords "
                         f"(e.g. {{'key_codec': 'q8_0', 'value_codec': 'q4_0'}}), got {type(options).__name__}")
    # Copied: generate() may run again with the same generation_config.
    return KVQCache(model.config, **copy.deepcopy(options))


def _wants_kvq(model, generation_config, model_kwargs) -> bool:
    if model_kwargs.get("cache") is not None or model_kwargs.get("past_key_values") is not None:
        return False
    if generation_config.use_cache is False or getattr(model.config, "is_encoder_decoder", False):
        return False
    impl = generation_config.cache_implementation
    if impl == CACHE_IMPLEMENTATION:
        return True
    return impl is None and getattr(model.config, "_attn_implementation", None) == ATTN_IMPLEMENTATION


def install() -> None:
    """Makes generate() accept cache_implementation="kvq" and use a KVQCache by default on kvq attention.
    Idempotent."""
    if CACHE_IMPLEMENTATION not in _gen_config.ALL_CACHE_IMPLEMENTATIONS:
        # GenerationConfig.validate() reads this module global when it checks cache_implementation.
        _gen_config.ALL_CACHE_IMPLEMENTATIONS = (*_gen_config.ALL_CACHE_IMPLEMENTATIONS, CACHE_IMPLEMENTATION)
    original = getattr(GenerationMixin, "_prepare_cache_for_generation", None)
    params = list(inspect.signature(original).parameters) if original else []
    if params[:3] != ["self", "generation_config", "model_kwargs"]:
        import transformers

        raise ImportError(f"kvq.hf: transformers {transformers.__version__} has no GenerationMixin."
                          "_prepare_cache_for_generation(self, generation_config, model_kwargs, ...), which kvq.hf "
                          "wraps to make generate()'s default cache; kvq.hf is tested with transformers 5.25.0 "
                          "(pip install 'transformers==5.25.0')")
    if getattr(original, "_kvq_wrapped", False):
        return

    @functools.wraps(original)
    def prepare(self, generation_config, model_kwargs, *args, **kwargs):
        if not _wants_kvq(self, generation_config, model_kwargs):
            return original(self, generation_config, model_kwargs, *args, **kwargs)
        model_kwargs["cache"] = default_cache(self, generation_config)
        if getattr(generation_config, "is_assistant", False):  # as transformers' own method does
            model_kwargs["cache"].activate_past_recording(recurrent_states_to_keep=generation_config.num_assistant_tokens)
        return None

    prepare._kvq_wrapped = True
    GenerationMixin._prepare_cache_for_generation = prepare
