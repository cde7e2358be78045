"""Types of kvq._core, the compiled module (re-exported by kvq)."""

import os
from typing import Any, Callable, Literal, TypedDict, overload

import numpy as np
import numpy.typing as npt

__version__: str
DEFAULT_SEED: int
MAX_BLOCK_TOKENS: int
MAX_EXACT_TAIL_TOKENS: int

# float32 is read in place; float16, float64, strided arrays and torch tensors are converted once.
FloatArray = npt.NDArray[np.float32] | npt.NDArray[np.float16] | npt.NDArray[np.float64] | Any

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
    ggml_type: int
    rotates: bool
    plain: bool
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
def quantize(
    x: FloatArray, codec: str, *, seed: int = ..., nan_policy: Literal["reject", "propagate"] = "reject"
) -> npt.NDArray[np.uint8]: ...
def dequantize(codes: npt.NDArray[np.uint8], codec: str, head_dim: int, *, seed: int = ...) -> npt.NDArray[np.float32]: ...
def simd_level() -> str: ...
def available_simd_levels() -> list[str]: ...
def force_simd_level(name: str) -> None: ...
def simd_report() -> dict[str, Any]: ...
def selftest(on_line: Callable[[str], None] | None = None) -> dict[str, Any]: ...
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

class PoolExhausted(MemoryError):
    """No free block is left in a pool with max_blocks set; the operation changed nothing."""

class FileIOError(OSError):
    """A cache file could not be opened, read, written or renamed; an existing file was left as it was."""

class BadCacheFile(ValueError):
    """Not a cache file this kvq reads: wrong magic, unsupported version, truncated or corrupted."""

class ConfigMismatch(ValueError):
    """load_into: the file was saved by a cache of another configuration (the message names the field)."""

class UnknownCodec(ValueError):
    """A codec spec names no codec of the table (the message lists the known names)."""

class BadHeadDim(ValueError):
    """A head size the codec cannot take (not a multiple of its block, or outside 1..65536)."""

class BadParams(ValueError):
    """A codec spec's parameters, or cache parameters, that are invalid or contradict each other."""

class NonFiniteInput(ValueError):
    """NaN or Inf in keys, values, rows or queries under nan_policy='reject'; nothing was stored."""

class PoolStats(TypedDict):
    block_bytes: int
    blocks_total: int
    blocks_used: int
    blocks_shared: int
    max_blocks: int
    blocks_reserved: int
    bytes_total: int
    bytes_used: int
    bytes_reserved: int
    max_bytes: int

class KVCache:
    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        n_heads: int | None = None,
        key_codec: str = "q8_0",
        value_codec: str = "q4_0",
        *,
        block_tokens: int = 32,
        max_blocks: int = 0,
        initial_blocks: int = 0,
        grow_blocks: int = 64,
        scale: float | None = None,
        softcap: float = 0.0,
        sliding_window: int | list[int] | None = None,
        seal: Literal["on_block_full", "on_append"] = "on_block_full",
        center_keys: bool = False,  # deprecated: "+center" on every key codec
        nan_policy: Literal["reject", "propagate"] = "reject",
        threads: int = 1,
        seed: int = ...,
        staging: Literal["f32", "f16"] = "f32",
        layer_codecs: list[tuple[str | None, str | None] | None] | None = None,
        max_bytes: int = 0,
        int8_value_weights: bool = False,
        exact_tail_tokens: int = 0,
        key_scales: npt.ArrayLike | None = None,
        head_dim_v: int | None = None,
        latent_values: bool = False,
    ) -> None: ...
    @property
    def config(self) -> dict[str, object]: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def head_dim_v(self) -> int: ...
    @property
    def latent_values(self) -> bool: ...
    @property
    def key_codec(self) -> str: ...
    @property
    def value_codec(self) -> str: ...
    def layer_codecs(self) -> list[tuple[str, str]]: ...
    def add_sequence(self) -> int: ...
    def fork(self, seq: int | None = None) -> int: ...
    def truncate(self, n_tokens: int, *, seq: int | None = None) -> None: ...
    def remove(self, seq: int) -> None: ...
    def append(self, layer: int, k: FloatArray, v: FloatArray | None, seq: int | None = None) -> None: ...
    def attend(self, layer: int, q: FloatArray, seq: int | None = None) -> npt.NDArray[np.float32]: ...
    def attend_prefill(self, layer: int, q: FloatArray, seq: int | None = None) -> npt.NDArray[np.float32]: ...
    def attend_batch(self, layer: int, q: FloatArray, *, seqs: list[int]) -> npt.NDArray[np.float32]: ...
    def save(self, path: str | bytes | os.PathLike[str] | os.PathLike[bytes], seq: int | None = None) -> None: ...
    @staticmethod
    def load(
        path: str | bytes | os.PathLike[str] | os.PathLike[bytes], *, max_blocks: int = 0, max_bytes: int = 0, grow_blocks: int = 64,
        threads: int = 1, int8_value_weights: bool = False
    ) -> KVCache: ...
    def load_into(self, path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> list[int]: ...
    def n_tokens(self, seq: int | None = None, layer: int = 0) -> int: ...
    def sequences(self) -> list[int]: ...
    def __contains__(self, seq: int) -> bool: ...
    def bytes_used(self) -> int: ...
    def metadata_bytes(self) -> int: ...
    def bytes_per_token(self, layer: int | None = None) -> float: ...
    def average_bytes_per_token(self, layer: int, n_tokens: int) -> float: ...
    def pool_stats(self) -> PoolStats: ...
    def dump(self) -> str: ...
    def _time_attend(self, layer: int, q: FloatArray, seq: int | None = None, calls: int = 1) -> float: ...

# Data sets, the accuracy sweep and the memory planner (python/src/bind_eval.cpp, lib/eval).

TableFormat = Literal["markdown", "csv", "json"]

class DataStats(TypedDict):
    outlier_channel_ratio: float
    key_bias_ratio: float
    sink_weight: float
    entropy_min: float
    entropy_median: float
    entropy_max: float
    entropy_log_context: float
    sharp_fraction: float
    diffuse_fraction: float
    value_outlier_fraction: float

class Dataset:
    name: str
    layers: int
    tokens: int
    kv_heads: int
    q_heads: int
    head_dim: int
    head_dim_v: int  # of the values: head_dim unless they differ (a latent's)
    latent: bool  # the values are the keys' first head_dim_v values (DeepSeek's MLA latent)
    query_positions: list[int]
    windows: list[int]  # sliding window per layer in tokens (0 = full); empty = every layer full
    @property
    def k(self) -> npt.NDArray[np.float32]: ...
    @property
    def v(self) -> npt.NDArray[np.float32]: ...
    @property
    def q(self) -> npt.NDArray[np.float32]: ...
    def stats(self) -> DataStats: ...

def dataset(spec: str, seed: int = 0) -> Dataset: ...
def dataset_kinds() -> list[tuple[str, str]]: ...

class ModelShape(TypedDict):
    name: str
    source: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    mla_latent_dim: int
    mla_rope_dim: int
    sliding_window: list[int]
    description: str

class SweepResult:
    @property
    def rows(self) -> list[dict[str, object]]: ...
    @property
    def model(self) -> ModelShape: ...
    @property
    def latent_model(self) -> ModelShape | None: ...
    timing: str
    def format(self, format: TableFormat = "markdown") -> str: ...

def sweep(
    datasets: list[str | Dataset],
    pairs: list[str] | None = None,
    model: str | None = None,
    timing: bool = True,
    repeats: int = 10,
    data_seed: int = 0,
    seed: int = ...,
    block_tokens: int = 32,
    top_k: int = 8,
    int8_value_weights: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult: ...

class Plan:
    @property
    def rows(self) -> list[dict[str, object]]: ...
    @property
    def model(self) -> ModelShape: ...
    @property
    def context(self) -> int: ...
    @property
    def batch(self) -> int: ...
    def format(self, format: TableFormat = "markdown") -> str: ...

def plan(
    model: str = "llama-3-8b",
    pairs: list[str] | None = None,
    context: int = 8192,
    batch: int = 1,
    block_tokens: int = 32,
    staging: Literal["f32", "f16"] = "f32",
) -> Plan: ...
def model_presets() -> list[ModelShape]: ...
def model_shape(name_or_path: str) -> ModelShape: ...
def default_pairs(latent: bool = False) -> list[str]: ...
def codec_table(format: TableFormat = "markdown", head_dim: int = 128) -> str: ...
