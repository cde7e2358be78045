"""Model-level evaluation of K/V codec pairs (``kvq eval``, ``kvq.eval_model``), as llama.cpp's
``llama-perplexity --kl-divergence`` reports it: perplexity of a text, the KL divergence of the next-token
distributions against the same model with an unquantized cache (mean ± standard error, median, p99, p99.9,
maximum, with llama.cpp's definitions: ``kl_stats``), how often the most likely next token is the same, and the
cache's bits per value with everything stored counted (``kvq.hf.KVQCache.bits_per_value``).

The text is cut into chunks of ``ctx`` tokens (the first token of each chunk is the tokenizer's BOS token
when it has one); each chunk is one forward pass on a fresh cache, so every query attends to the quantized
keys and values of the chunk as kvq stores them, and the second half of each chunk is scored (every scored
token has at least ctx/2 tokens of context; llama-perplexity does the same). The reference is the same model
on an f32/f32 kvq cache (``baseline="f32/f32"``, attention on float32 rows: the difference is the codecs
alone) or on transformers' own cache and sdpa attention (``baseline="hf"``).

A pair "K/V|K2/V2" stores the sliding-window layers with K2/V2 and the others with K/V (as ``kvq table``
and ``kvq plan`` read it). ``per_layer=True`` adds, for each pair and each layer, the KL when only that layer is quantized with the pair
and every other layer is kept in f32 (``KVQCache(layer_codecs=...)``).

Needs torch and transformers (``pip install '.[hf]' (distribution kvq-cache)``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

DEFAULT_EVAL_PAIRS = [
    "q8_0/q8_0", "q8_0/q4_0", "q4_0/q4_0", "q4_0+rot/q4_0", "q4_0+rot+center/q4_0",
    "turbo4/turbo4", "turbo3.5/turbo3.5", "polar/polar",
]


def _on_layer(pair: str, window: int) -> str:
    """The pair a layer uses: of "K/V|K2/V2", K2/V2 on a sliding-window layer (window > 0) and K/V on the
    others; a plain "K/V" everywhere."""
    full, _, windowed = pair.partition("|")
    return windowed if windowed and window else full


@contextlib.contextmanager
def _one_gguf_parse():
    """Within the block, every gguf.GGUFReader of one file is the same object. transformers parses a GGUF
    file's metadata three times for one model (tokenizer, config, weights), each a fresh GGUFReader: about
    27 s each for Gemma 3's 262k-token vocabulary on a 2 GHz core, most of loading. The reader is
    read-only (a memory map in mode "r") and transformers only reads it, so sharing it changes nothing
    but the time. gguf missing: the block does nothing (transformers then raises its own ImportError)."""
    try:
        import gguf
    except ImportError:
        yield
        return
    cls = gguf.GGUFReader
    readers: dict[tuple, Any] = {}

    def shared(path, mode="r"):
        st = os.stat(path)
        key = (os.path.realpath(path), mode, st.st_size, st.st_mtime_ns)
        if key not in readers:
            readers[key] = cls(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = cls


def load_model(spec: str | Path, dtype: str = "float32"):
    """A transformers causal LM and its tokenizer from a local directory or a GGUF file, with kvq attention.
    Nothing is downloaded (local files only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import hf  # noqa: F401  registers attn_implementation="kvq"

    path = Path(spec)
    if not path.exists():
        raise ValueError(f"kvq eval: {spec} is neither a model directory nor a GGUF file (nothing is downloaded)")
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"kvq eval: dtype must be float32, float16 or bfloat16, got {dtype!r}")
    kw: dict[str, Any] = dict(local_files_only=True)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"kvq eval: {spec} is a file but not a .gguf file")
        root, kw["gguf_file"] = path.parent, path.name
    else:
        root = path
    with _one_gguf_parse() if "gguf_file" in kw else contextlib.nullcontext():
        tokenizer = AutoTokenizer.from_pretrained(root, **kw)
        model = AutoModelForCausalLM.from_pretrained(root, attn_implementation="kvq", dtype=torch_dtype, **kw)
    model.eval()
    return model, tokenizer


def kl_stats(kl: np.ndarray) -> dict:
    """The statistics of per-token KL divergences that ``llama-perplexity --kl-divergence`` prints, computed as
    its tools/perplexity/perplexity.cpp does (llama.cpp as vendored in llama-cpp-python 0.3.36):

    - mean and its standard error, "Mean KLD: x ± se": llama.cpp's sqrt((Σx²/n − mean²) / (n − 1)), which is
      the sample standard deviation over sqrt(n) (llama.cpp prints 0 when n ≤ 10; so does this);
    - median (the middle value, or the mean of the two middle ones) and percentiles by linear interpolation
      between the sorted values at fraction × (n − 1): llama.cpp's ``percentile`` lambda, which is numpy's
      default ("linear") method, so the figures are comparable;
    - maximum and minimum.
    """
    kl = np.asarray(kl, dtype=np.float64)
    n = kl.size
    se = float(kl.std(ddof=1) / math.sqrt(n)) if n > 10 else 0.0
    p90, p95, p99, p99_9 = np.percentile(kl, [90, 95, 99, 99.9])  # method="linear", as llama.cpp
    return {"kl_mean": float(kl.mean()), "kl_mean_se": se, "kl_median": float(np.median(kl)),
            "kl_p90": float(p90), "kl_p95": float(p95), "kl_p99": float(p99), "kl_p99_9": float(p99_9),
            "kl_max": float(kl.max()), "kl_min": float(kl.min())}


@dataclass
class EvalResult:
    """Rows of the table (one per K/V pair, the baseline first) and, with per_layer, rows per (pair, layer).
    Markdown shows COLUMNS, CSV COLUMNS and CSV_EXTRA, JSON every field of the rows."""

    rows: list[dict]
    per_layer: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    COLUMNS = [("pair", "K/V"), ("bits_per_value", "bits/value"), ("ppl", "PPL"), ("ppl_ratio", "PPL ratio"),
               ("kl_mean", "KL mean"), ("kl_mean_se", "±"), ("kl_median", "KL median"), ("kl_p99", "KL p99"),
               ("kl_p99_9", "KL p99.9"), ("kl_max", "KL max"), ("same_top", "same top %"),
               ("kib_per_token", "KiB/token"), ("tokens_per_s", "tokens/s")]
    CSV_EXTRA = ["key_bits", "value_bits", "kl_p90", "kl_p95", "kl_min", "same_top_se", "scored"]
    LAYER_COLUMNS = [("pair", "K/V"), ("layer", "layer"), ("window", "window"), ("bits_per_value", "bits/value"),
                     ("kl_mean", "KL mean"), ("kl_mean_se", "±"), ("kl_median", "KL median"), ("kl_p99", "KL p99"),
                     ("kl_p99_9", "KL p99.9"), ("same_top", "same top %"), ("ppl", "PPL")]

    def format(self, fmt: str = "markdown", table: str = "pairs") -> str:
        rows, cols = (self.rows, self.COLUMNS) if table == "pairs" else (self.per_layer, self.LAYER_COLUMNS)
        if fmt == "json":
            return json.dumps({"info": self.info, "rows": self.rows, "per_layer": self.per_layer}, indent=1) + "\n"
        if fmt == "csv":
            cols = cols + [(k, k) for k in self.CSV_EXTRA if table == "pairs"]
            lines = [",".join(k for k, _ in cols)] + [",".join(_cell(r.get(k), k) for k, _ in cols) for r in rows]
            return "\n".join(lines) + "\n"
        if fmt != "markdown":
            raise ValueError(f"format must be markdown, csv or json, got {fmt!r}")
        head = "| " + " | ".join(h for _, h in cols) + " |"
        sep = "|" + "|".join("---" if i == 0 else "--:" for i in range(len(cols))) + "|"
        cells = [[_cell(r.get(k), k).replace("|", "\\|") for k, _ in cols] for r in rows]  # "K/V|K2/V2"
        return "\n".join([head, sep] + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"


def _cell(v, key: str) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    if key.startswith("kl_"):
        return "0" if not v else f"{v:.1e}" if key == "kl_mean_se" else f"{v:.2e}"
    if key in ("same_top", "kib_per_token", "bits_per_value"):
        return f"{v:.2f}"
    if key in ("ppl", "ppl_ratio"):
        return f"{v:.4f}"
    if key == "tokens_per_s":
        return f"{v:.0f}"
    return str(v)


class _Stats:
    def __init__(self):
        self.nll, self.kl, self.same, self.seconds, self.tokens = [], [], 0, 0.0, 0
        self.bpt, self.bits = None, None

    def measure(self, cache, layer: int | None = None, context: int | None = None) -> None:
        """Bytes per token of the whole cache (the sealed format) and (key, value) bits per value of it, or
        of one layer, an exact tail counted over the context."""
        if cache is not None:
            self.bpt, self.bits = cache.bytes_per_token(), cache.bits_per_value(layer, context=context)

    def row(self, label: str, baseline_ppl: float | None) -> dict:
        nll = np.concatenate(self.nll)
        kl = np.concatenate(self.kl) if self.kl else np.zeros_like(nll)
        ppl = float(math.exp(nll.mean()))
        same = self.same / nll.size
        key_bits, value_bits = self.bits or (None, None)
        return {
            "pair": label, "bits_per_value": (key_bits + value_bits) / 2 if self.bits else None,
            "key_bits": key_bits, "value_bits": value_bits,
            "ppl": ppl, "ppl_ratio": ppl / baseline_ppl if baseline_ppl else 1.0, **kl_stats(kl),
            # llama.cpp's "Same top p: x ± se %"
            "same_top": 100.0 * same, "same_top_se": 100.0 * math.sqrt(same * (1 - same) / max(nll.size - 1, 1)),
            "kib_per_token": self.bpt / 1024 if self.bpt else None,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else None, "scored": int(nll.size),
        }


def eval_model(model, tokenizer=None, *, text: str | None = None, tokens: Sequence[int] | None = None,
               pairs: Sequence[str] | None = None, ctx: int = 1024, max_chunks: int | None = None,
               baseline: str = "f32/f32", per_layer: bool = False, per_layer_pairs: Sequence[str] | None = None,
               progress: Callable[[int, int], None] | None = None, **cache_config) -> EvalResult:
    """Perplexity, KL statistics against the baseline, same-top-token % and bits per value per K/V pair (see
    the module docstring). ``model``: a transformers causal LM (loaded with attn_implementation="kvq", or it is
    switched);
    ``text`` (with ``tokenizer``) or ``tokens``; ``cache_config``: kvq.KVCache keywords for every cache."""
    import torch

    from . import hf

    if (text is None) == (tokens is None):
        raise ValueError("eval_model: give text (with a tokenizer) or tokens")
    if ctx < 8:
        raise ValueError(f"eval_model: ctx must be at least 8 tokens, got {ctx}")
    pairs = list(pairs) if pairs is not None else list(DEFAULT_EVAL_PAIRS)
    for p in pairs + ([] if baseline == "hf" else [baseline]):
        hf._pair(p)
    if text is not None:
        if tokenizer is None:
            raise ValueError("eval_model: text needs the tokenizer")
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens = [int(t) for t in tokens]
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    body = ctx - 1 if bos is not None else ctx
    n_chunks = len(tokens) // body
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        raise ValueError(f"eval_model: {len(tokens)} tokens are fewer than one chunk of {ctx}")
    first = ctx // 2  # positions first .. ctx-2 predict tokens first+1 .. ctx-1
    keep = ctx - first

    config = model.config
    n_layers = config.get_text_config(decoder=True).num_hidden_layers
    windows = hf._layer_windows(config.get_text_config(decoder=True))
    layer_pairs = list(per_layer_pairs) if per_layer_pairs is not None else pairs
    runs: list[tuple[str, str | None, dict | None, int | None]] = [(p, p, None, None) for p in pairs]
    if per_layer:
        runs += [(p, "f32/f32", {l: _on_layer(p, windows[l])}, l) for p in layer_pairs for l in range(n_layers)]
    stats = {i: _Stats() for i in range(len(runs))}
    base = _Stats()
    total, done = n_chunks * (1 + len(runs)), 0

    def forward(ids, pair: str | None, layer_codecs):
        if pair is None:  # transformers' own cache and attention
            model.set_attn_implementation("sdpa")
            try:
                t0 = time.perf_counter()
                logits = model(ids, use_cache=True, logits_to_keep=keep).logits[0, :-1]
                return logits, time.perf_counter() - t0, None
            finally:
                model.set_attn_implementation(hf.ATTN_IMPLEMENTATION)
        if "|" in pair:  # "K/V|K2/V2": K2/V2 on the sliding-window layers
            layer_codecs = {l: _on_layer(pair, w) for l, w in enumerate(windows) if w} | (layer_codecs or {})
        k, v = hf._pair(_on_layer(pair, 0))
        cache = hf.KVQCache(config, k, v, max_batch_size=1, layer_codecs=layer_codecs, **cache_config)
        t0 = time.perf_counter()
        logits = model(ids, use_cache=True, logits_to_keep=keep, **{cache_kw: cache}).logits[0, :-1]
        return logits, time.perf_counter() - t0, cache

    cache_kw = hf.cache_keyword(model)
    if getattr(config, "_attn_implementation", None) != hf.ATTN_IMPLEMENTATION:
        model.set_attn_implementation(hf.ATTN_IMPLEMENTATION)
    slice_rows = 64
    with torch.no_grad():
        for c in range(n_chunks):
            chunk = tokens[c * body:(c + 1) * body]
            ids = torch.tensor([([bos] if bos is not None else []) + chunk], dtype=torch.long)
            targets = ids[0, first + 1:]
            logits, secs, cache = forward(ids, None if baseline == "hf" else baseline, None)
            base_logp = torch.log_softmax(logits.float(), dim=-1)
            del logits
            base.nll.append((-base_logp.gather(1, targets[:, None])[:, 0]).numpy().astype(np.float64))
            base.seconds += secs
            base.tokens += ctx
            base.measure(cache, context=ctx)
            del cache
            base_top = base_logp.argmax(dim=-1)
            done += 1
            if progress:
                progress(done, total)
            for i, (_, pair, layer_codecs, layer) in enumerate(runs):
                logits, secs, cache = forward(ids, pair, layer_codecs)
                st = stats[i]
                st.seconds += secs
                st.tokens += ctx
                st.measure(cache, layer, context=ctx)  # with one layer quantized: that layer's bits
                del cache
                kl = np.empty(targets.numel(), dtype=np.float64)
                nll = np.empty_like(kl)
                for s in range(0, targets.numel(), slice_rows):
                    lp = torch.log_softmax(logits[s:s + slice_rows].float(), dim=-1)
                    bp = base_logp[s:s + slice_rows]
                    kl[s:s + slice_rows] = (bp.exp() * (bp - lp)).sum(dim=-1).clamp_min(0).numpy()
                    nll[s:s + slice_rows] = (-lp.gather(1, targets[s:s + slice_rows, None])[:, 0]).numpy()
                    st.same += int((lp.argmax(dim=-1) == base_top[s:s + slice_rows]).sum())
                del logits
                st.kl.append(kl)
                st.nll.append(nll)
                done += 1
                if progress:
                    progress(done, total)
    base_label = "baseline (transformers cache)" if baseline == "hf" else f"{baseline} (baseline)"
    base_row = base.row(base_label, None)
    base_row["same_top"], base_row["same_top_se"] = 100.0, 0.0  # its KL statistics are those of zeros
    rows = [base_row] + [stats[i].row(r[0], base_row["ppl"]) for i, r in enumerate(runs) if r[3] is None]
    layer_rows = []
    for i, (label, _, _, layer) in enumerate(runs):
        if layer is None:
            continue
        r = stats[i].row(label, base_row["ppl"])
        layer_rows.append({"pair": label, "layer": layer, "window": windows[layer] or "full"}
                          | {k: r[k] for k, _ in EvalResult.LAYER_COLUMNS[3:]})
    info = {"ctx": ctx, "chunks": n_chunks, "scored_tokens": int(base_row["scored"]), "tokens": n_chunks * ctx,
            "baseline": baseline, "model": getattr(config, "_name_or_path", "") or config.model_type,
            "cache_config": {k: v for k, v in cache_config.items()}}
    return EvalResult(rows, layer_rows, info)


def plot_per_layer(rows: list[dict], path: str, title: str = "") -> None:
    """KL (mean) against the layer, one line per pair, full-attention layers marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("kvq eval --plot needs matplotlib: pip install matplotlib") from e
    from ._plot import MARKERS, family

    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    # One line and marker per pair, coloured by codec family (two pairs of a family: solid and dashed).
    seen: dict[str, int] = {}
    for i, p in enumerate(pairs):
        name, colour = family(p)
        style = ["-", "--", ":", "-."][seen.get(name, 0) % 4]
        seen[name] = seen.get(name, 0) + 1
        pts = sorted((r["layer"], max(r["kl_mean"], 1e-9)) for r in rows if r["pair"] == p)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=MARKERS[i % len(MARKERS)], ms=5, color=colour,
                ls=style, label=f"{p} ({name})")
    full = sorted({r["layer"] for r in rows if r["window"] == "full"})
    for i, l in enumerate(full):
        ax.axvline(l, color="grey", alpha=0.3, lw=6, label="full-attention layer" if i == 0 else None)
    layers = sorted({r["layer"] for r in rows})
    ax.set_xticks(layers)
    ax.set_yscale("log")
    ax.set_xlabel("layer quantized (all others f32)")
    ax.set_ylabel("KL(f32 ‖ quantized) of next-token distribution, mean")
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
