"""kvq: a quantized attention KV cache, and attention computed on the quantized bytes.

Keys default to 8 bits (q8_0) and values to 4 bits (q4_0), byte-identical to ggml's blocks. Every codec's
attention error can be measured against an FP32 reference:

    >>> import numpy as np, kvq
    >>> x = np.random.randn(4, 128).astype(np.float32)
    >>> codes = kvq.quantize(x, "q8_0")            # (4, 136) uint8: ggml block_q8_0 rows
    >>> y = kvq.dequantize(codes, "q8_0", 128)     # (4, 128) float32
    >>> cache = kvq.KVCache(n_layers=1, n_kv_heads=2, head_dim=128, n_heads=8)
    >>> seq = cache.add_sequence()
    >>> cache.append(0, np.random.randn(16, 2, 128).astype(np.float32),
    ...              np.random.randn(16, 2, 128).astype(np.float32), seq=seq)
    >>> cache.attend(0, np.random.randn(8, 128).astype(np.float32), seq=seq).shape
    (8, 128)
"""

from ._core import (
    DEFAULT_SEED,
    BadCacheFile,
    BadHeadDim,
    BadParams,
    ConfigMismatch,
    Dataset,
    FileIOError,
    KVCache,
    NonFiniteInput,
    Plan,
    PoolExhausted,
    SweepResult,
    UnknownCodec,
    __version__,
    codec_info,
    codec_table,
    codecs,
    dataset,
    dataset_kinds,
    default_pairs,
    dequantize,
    model_presets,
    model_shape,
    plan,
    quantize,
    simd_level,
    simd_report,
    simd_kernel_table,
    selftest,
    available_simd_levels,
    force_simd_level,
    sweep,
)
from .attention import attention_error, reference_attention


def __getattr__(name):
    # torch and transformers are imported only when the Hugging Face parts are used: `import kvq` never needs them.
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    if name == "eval_model":
        from .model_eval import eval_model

        return eval_model
    raise AttributeError(f"module 'kvq' has no attribute {name!r}")


__all__ = [
    "DEFAULT_SEED",
    "BadCacheFile",
    "BadHeadDim",
    "BadParams",
    "ConfigMismatch",
    "Dataset",
    "FileIOError",
    "KVCache",
    "NonFiniteInput",
    "Plan",
    "PoolExhausted",
    "SweepResult",
    "UnknownCodec",
    "__version__",
    "attention_error",
    "codec_info",
    "codec_table",
    "codecs",
    "dataset",
    "dataset_kinds",
    "default_pairs",
    "dequantize",
    "eval_model",
    "model_presets",
    "model_shape",
    "plan",
    "quantize",
    "reference_attention",
    "simd_level",
    "simd_report",
    "simd_kernel_table",
    "selftest",
    "available_simd_levels",
    "force_simd_level",
    "sweep",
]
