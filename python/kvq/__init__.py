"""kvq: a quantized attention KV cache, and attention computed on the quantized bytes.

Keys default to 8 bits (q8_0) and values to 4 bits (q4_0), byte-identical to ggml's blocks. Every codec's
attention error can be measured against an FP32 reference:

    >>> import numpy as np, kvq
    >>> x = np.random.randn(4, 128).astype(np.float32)
    >>> codes = kvq.quantize(x, "q8_0")            # (4, 136) uint8: ggml block_q8_0 rows
    >>> y = kvq.dequantize(codes, "q8_0", 128)     # (4, 128) float32
"""

from ._core import (
    DEFAULT_SEED,
    __version__,
    attention_error,
    codec_info,
    codecs,
    dequantize,
    quantize,
    reference_attention,
    simd_level,
)

__all__ = [
    "DEFAULT_SEED",
    "__version__",
    "attention_error",
    "codec_info",
    "codecs",
    "dequantize",
    "quantize",
    "reference_attention",
    "simd_level",
]
