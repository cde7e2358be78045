"""Types of kvq._core, the compiled module (re-exported by kvq)."""

from typing import Literal, TypedDict, overload

import numpy as np
import numpy.typing as npt

__version__: str
DEFAULT_SEED: int

FloatArray = npt.NDArray[np.float32] | npt.NDArray[np.float16]

class CodecInfo(TypedDict):
    name: str
    base: str
    block: int
    bytes_per_block: int
    head_dim: int
    row_bytes: int
    bits_per_value: float
    rotated: bool
    ggml_layout: bool
    layout: str

class Summary(TypedDict):
    mean: float
    worst: float

class AttentionErrors(TypedDict):
    kl: Summary
    score_rmse: Summary
    topk: Summary
    output_l2: Summary
    cosine: Summary
    queries: int
    top_k: int
    key_bits_per_value: float
    value_bits_per_value: float

def codecs() -> list[str]: ...
def codec_info(codec: str, head_dim: int = 128, *, seed: int = ...) -> CodecInfo: ...
def quantize(x: FloatArray, codec: str, *, seed: int = ...) -> npt.NDArray[np.uint8]: ...
def dequantize(codes: npt.NDArray[np.uint8], codec: str, head_dim: int, *, seed: int = ...) -> npt.NDArray[np.float32]: ...
def simd_level() -> str: ...
@overload
def reference_attention(
    q: FloatArray, k: FloatArray, v: FloatArray, scale: float | None = None, *, return_weights: Literal[False] = False
) -> npt.NDArray[np.float32]: ...
@overload
def reference_attention(
    q: FloatArray, k: FloatArray, v: FloatArray, scale: float | None = None, *, return_weights: Literal[True]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def attention_error(
    q: FloatArray,
    k: FloatArray,
    v: FloatArray,
    key_codec: str = "q8_0",
    value_codec: str = "q4_0",
    scale: float | None = None,
    top_k: int = 8,
    *,
    seed: int = ...,
) -> AttentionErrors: ...
