"""What crosses the torch/kvq boundary: device and dtype checks, the float32 numpy layout kvq takes, and the
attention mask transformers builds, read as which new tokens are real and checked against kvq's attention."""

from __future__ import annotations

import numpy as np
import torch

from ._layer import _KVQLayer


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


def _valid_new(layer: _KVQLayer, mask: torch.Tensor | None, b: int, past: int, q: int) -> np.ndarray:
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
