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
and ``kvq plan`` read it); "P0;P1*3;..." gives one pair per layer (a run of n layers as PAIR*n; kvq._pairs
parses every form). ``per_layer=True`` adds, for each pair and each layer, the KL when only that layer is
quantized with the pair and every other layer is kept in f32 (``KVQCache(layer_codecs=...)``).

``budget=B`` (bits per value, or a list of budgets) proposes one pair per layer from candidate pairs: the
per-layer KLs are measured (or given as ``sensitivity``, the per_layer rows of an earlier run), the pairs
minimizing their sum with mean bits per value ≤ B are chosen (``allocate_budget``, exact) and evaluated
next to the candidates as uniform pairs (``propose_budget``; ``EvalResult.budget``).

The allocation lives in kvq.budget, the statistics and tables in kvq.eval_result (both re-exported here).

Needs torch and transformers (``pip install '.[hf]' (distribution kvq-cache)``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._pairs import check_spec, layer_pairs
from .budget import allocate_budget, propose_budget, side_pair_rows  # noqa: F401 (re-exported)
from .eval_result import EvalResult, kl_stats  # noqa: F401 (re-exported)

DEFAULT_EVAL_PAIRS = [
    "q8_0/q8_0", "q8_0/q4_0", "q4_0/q4_0", "q4_0+rot/q4_0", "q4_0+rot+center/q4_0",
    "turbo4/turbo4", "turbo3.5/turbo3.5", "polar/polar",
]


# The candidates of kvq eval --budget, cheap to dear (bits per value at head_dim 256, blocks of 32): 3.0,
# 3.5, 4.5, 4.75, 5.25, 6.5, 8.5.
# The --budget candidates when none are given: every key codec with every value codec, measured per layer
# as their sides (K/f32 and f32/V): the rungs of docs/eval.md's best proposals (issue 39), 2.6 to 8.5 bits.
DEFAULT_BUDGET_KEYS = ["tcq2+center", "tcq3+center", "turbo4+center", "iq4_nls+rot", "iq4_nls+rot+center",
                       "q5_0+rot+center", "q8_0"]
DEFAULT_BUDGET_VALUES = ["tcq2", "tcq3", "turbo4", "iq4_nls+rot", "q8_0"]
# The candidate pairs of the first --budget runs (docs/eval.md, "Bits where they matter"), for --budget-pairs.
LADDER_BUDGET_PAIRS = [
    "chan2/polar:budget=3", "chan3/polar:budget=3", "q5_0+rot+center/polar:budget=3", "q4_0+rot+center/q4_0",
    "q5_0+rot+center/q4_0", "q8_0/q4_0", "q8_0/q8_0",
]


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


def _json_value(v):
    """A cache keyword as the result's info records it: arrays (key_scales) as nested lists."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if callable(v):  # key_scales chosen per key format (kvq eval --key-scales calib): what it was made from
        return getattr(v, "description", repr(v))
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return v


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


def _token_ids(tokenizer, text: str | None, tokens: Sequence[int] | None) -> list[int]:
    if text is not None:
        if tokenizer is None:
            raise ValueError("eval_model: text needs the tokenizer")
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(t) for t in tokens]


def _chunks(n_tokens: int, ctx: int, bos, max_chunks: int | None) -> int:
    n = n_tokens // (ctx - 1 if bos is not None else ctx)
    return n if max_chunks is None else min(n, max_chunks)


def eval_model(model, tokenizer=None, *, text: str | None = None, tokens: Sequence[int] | None = None,
               pairs: Sequence[str] | None = None, ctx: int = 1024, max_chunks: int | None = None,
               baseline: str = "f32/f32", per_layer: bool = False, per_layer_pairs: Sequence[str] | None = None,
               budget: float | Sequence[float] | None = None, budget_pairs: Sequence[str] | None = None,
               budget_keys: Sequence[str] | None = None, budget_values: Sequence[str] | None = None,
               sensitivity: Sequence[dict] | None = None, sensitivity_chunks: int | None = None,
               progress: Callable[[int, int], None] | None = None, **cache_config) -> EvalResult:
    """Perplexity, KL statistics against the baseline, same-top-token % and bits per value per K/V pair (see
    the module docstring). ``model``: a transformers causal LM (loaded with attn_implementation="kvq", or it is
    switched);
    ``text`` (with ``tokenizer``) or ``tokens``; ``cache_config``: kvq.KVCache keywords for every cache.

    ``budget``: bits per value (one or a list): propose per-layer pairs from ``budget_pairs`` and evaluate
    them after ``pairs`` (default: the candidates, as uniform pairs). The
    sensitivity is measured first (per-layer runs of the candidates on ``sensitivity_chunks`` chunks, default
    ``max_chunks``; they become ``per_layer`` of the result, followed by those of ``per_layer_pairs`` if
    given) unless ``sensitivity`` gives per-layer rows. ``budget_keys`` and ``budget_values`` (instead of
    ``budget_pairs``): the candidates are every key codec with every value codec, measured per layer as
    K/f32 and f32/V (n + m runs per layer for n·m pairs; ``side_pair_rows``); ``pairs`` then defaults to
    none (only the proposals are evaluated). With none of the three and no ``sensitivity``, the candidates
    are DEFAULT_BUDGET_KEYS with DEFAULT_BUDGET_VALUES."""
    if (text is None) == (tokens is None):
        raise ValueError("eval_model: give text (with a tokenizer) or tokens")
    if (budget_keys is None) != (budget_values is None) or (budget_keys is not None and budget is None):
        raise ValueError("eval_model: budget_keys and budget_values go together, with a budget")
    if budget is not None:
        sides = None if budget_keys is None else (list(budget_keys), list(budget_values))
        if sides is None and budget_pairs is None and sensitivity is None:
            sides = (list(DEFAULT_BUDGET_KEYS), list(DEFAULT_BUDGET_VALUES))
        return _eval_budget(model, tokenizer, text, tokens, pairs, ctx, max_chunks, baseline, per_layer,
                            per_layer_pairs, budget, budget_pairs, sensitivity, sensitivity_chunks, progress,
                            cache_config, budget_sides=sides)
    import torch

    from . import hf

    if ctx < 8:
        raise ValueError(f"eval_model: ctx must be at least 8 tokens, got {ctx}")
    pairs = list(pairs) if pairs is not None else list(DEFAULT_EVAL_PAIRS)
    for p in pairs + list(per_layer_pairs or []) + ([] if baseline == "hf" else [baseline]):
        check_spec(p)
    tokens = _token_ids(tokenizer, text, tokens)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    body = ctx - 1 if bos is not None else ctx
    n_chunks = _chunks(len(tokens), ctx, bos, max_chunks)
    if n_chunks < 1:
        raise ValueError(f"eval_model: {len(tokens)} tokens are fewer than one chunk of {ctx}")
    first = ctx // 2  # positions first .. ctx-2 predict tokens first+1 .. ctx-1
    keep = ctx - first

    config = model.config
    n_layers = config.get_text_config(decoder=True).num_hidden_layers
    windows = hf._layer_windows(config.get_text_config(decoder=True))
    on_layer = {p: layer_pairs(p, windows) for p in dict.fromkeys(pairs + list(per_layer_pairs or []) + [baseline])
                if p != "hf"}  # every spec checked against the model's layers before a forward pass
    sensitive = list(per_layer_pairs) if per_layer_pairs is not None else pairs
    runs: list[tuple[str, str | None, dict | None, int | None]] = [(p, p, None, None) for p in pairs]
    if per_layer:
        runs += [(p, "f32/f32", {l: on_layer[p][l]}, l) for p in sensitive for l in range(n_layers)]
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
        per = on_layer[pair] if pair in on_layer else layer_pairs(pair, windows)
        layer_codecs = {l: p for l, p in enumerate(per) if p != per[0]} | (layer_codecs or {})
        k, v = hf._pair(per[0])
        kw = dict(cache_config)
        if callable(kw.get("key_scales")):  # scales chosen per layer by its key format (centered or not)
            keys = [hf._pair(layer_codecs.get(l, per[0]))[0] for l in range(n_layers)]
            kw["key_scales"] = kw["key_scales"](keys)
        cache = hf.KVQCache(config, k, v, max_batch_size=1, layer_codecs=layer_codecs, **kw)
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
            "cache_config": {k: _json_value(v) for k, v in cache_config.items()}}
    return EvalResult(rows, layer_rows, info)


class _Phase:
    """A progress callback for one of several evaluations, reported as part of the whole."""

    def __init__(self, progress, offset: int, total: int):
        self.progress, self.offset, self.total = progress, offset, total

    def __call__(self, done: int, total: int) -> None:
        self.progress(min(self.offset + done, self.total), self.total)


def _eval_budget(model, tokenizer, text, tokens, pairs, ctx, max_chunks, baseline, per_layer, per_layer_pairs,
                 budget, budget_pairs, sensitivity, sensitivity_chunks, progress, cache_config,
                 budget_sides=None) -> EvalResult:
    """eval_model with a budget: the sensitivity (measured, or given), a proposal per budget, and one
    evaluation of the pairs and the proposals. ``budget_sides`` = (keys, values): the candidates are every
    K/V, measured as their sides K/f32 and f32/V (side_pair_rows)."""
    budgets = [float(budget)] if isinstance(budget, (int, float)) else [float(b) for b in budget]
    if not budgets or any(not math.isfinite(b) or b <= 0 for b in budgets):
        raise ValueError(f"eval_model: a budget is a positive number of bits per value, got {budget!r}")
    cands = list(budget_pairs) if budget_pairs is not None else None
    sides = None
    if budget_sides is not None:
        if cands is not None:
            raise ValueError("eval_model: budget_pairs or budget_keys/budget_values, not both")
        keys, values = (list(dict.fromkeys(x)) for x in budget_sides)
        if not keys or not values:
            raise ValueError("eval_model: budget_keys and budget_values go together, each with at least one codec")
        for x in keys + values:
            if any(c in x for c in "/|;*"):
                raise ValueError(f"eval_model: a budget key or value is one codec, not a pair: {x!r}")
        sides = [f"{k}/f32" for k in keys] + [f"f32/{v}" for v in values]
        cands = sides
        if pairs is None:
            pairs = []
    for p in cands or []:
        check_spec(p)
    tokens = _token_ids(tokenizer, text, tokens)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    kw = dict(ctx=ctx, baseline=baseline, **cache_config)
    given = sensitivity is not None
    if given:
        sens = list(sensitivity)
        if cands is None:
            cands = list(dict.fromkeys(r["pair"] for r in sens))
    else:
        assert cands is not None  # eval_model gives the default sides
    pairs = list(pairs) if pairs is not None else list(cands)
    # Progress over both evaluations; the second's size is known before the first runs (a proposal that
    # repeats a pair is not run twice, so it may end early: it then jumps to the end).
    n1 = 0 if given else _chunks(len(tokens), ctx, bos, sensitivity_chunks or max_chunks) * (1 + len(cands) * n_layers)
    # per_layer: the sensitivity rows are the per-layer rows, and more only for per_layer_pairs given.
    more_layers = per_layer and per_layer_pairs is not None
    n2 = _chunks(len(tokens), ctx, bos, max_chunks) * (1 + len(pairs) + len(budgets)
                                                        + (n_layers * len(per_layer_pairs) if more_layers else 0))
    if not given:
        first = eval_model(model, tokenizer, tokens=tokens, pairs=[], max_chunks=sensitivity_chunks or max_chunks,
                           per_layer=True, per_layer_pairs=cands,
                           progress=_Phase(progress, 0, n1 + n2) if progress else None, **kw)
        sens = first.per_layer
    if sides is not None:  # the candidates are the pairs of the measured sides
        cands = [f"{k}/{v}" for k in keys for v in values]
        sens_pairs = side_pair_rows(sens, keys, values)
    else:
        sens_pairs = sens
    proposals = [propose_budget(sens_pairs, b, cands, n_layers) for b in budgets]
    run_pairs = list(dict.fromkeys(pairs + [p["spec"] for p in proposals]))
    result = eval_model(model, tokenizer, tokens=tokens, pairs=run_pairs, max_chunks=max_chunks,
                        per_layer=more_layers, per_layer_pairs=per_layer_pairs,
                        progress=_Phase(progress, n1, n1 + n2) if progress else None, **kw)
    if progress:
        progress(n1 + n2, n1 + n2)
    result.per_layer = list(sens) + result.per_layer
    by_pair = {r["pair"]: r for r in result.rows[1:]}
    for prop in proposals:
        row = by_pair[prop["spec"]]
        row.setdefault("budget", prop["budget"])
        row.setdefault("kl_predicted", prop["kl_predicted"])
        prop["kl_mean"], prop["kl_mean_se"], prop["measured_bits_per_value"] = (
            row["kl_mean"], row["kl_mean_se"], row["bits_per_value"])
        uniform = [r for r in result.rows[1:] if r["pair"] in pairs and r["pair"] != prop["spec"]
                   and r["bits_per_value"] <= prop["budget"] + 1e-9]
        best = min(uniform, key=lambda r: r["kl_mean"], default=None)
        prop["best_uniform"] = None if best is None else {k: best[k] for k in ("pair", "bits_per_value", "kl_mean",
                                                                                "kl_mean_se")}
    result.budget = proposals
    result.info["budget"] = budgets
    result.info["sensitivity"] = "given" if given else {"chunks": _chunks(len(tokens), ctx, bos,
                                                                          sensitivity_chunks or max_chunks)}
    return result


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
