"""What ``kvq eval`` prints: the KL statistics as ``llama-perplexity --kl-divergence`` computes them
(``kl_stats``) and the result's tables in markdown, CSV or JSON (``EvalResult``). No torch needed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np


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
    budget: list[dict] = field(default_factory=list)  # the proposals of eval_model(budget=...)

    COLUMNS = [("pair", "K/V"), ("bits_per_value", "bits/value"), ("ppl", "PPL"), ("ppl_ratio", "PPL ratio"),
               ("kl_mean", "KL mean"), ("kl_mean_se", "±"), ("kl_median", "KL median"), ("kl_p99", "KL p99"),
               ("kl_p99_9", "KL p99.9"), ("kl_max", "KL max"), ("same_top", "same top %"),
               ("kib_per_token", "KiB/token"), ("tokens_per_s", "tokens/s")]
    CSV_EXTRA = ["key_bits", "value_bits", "kl_p90", "kl_p95", "kl_min", "same_top_se", "scored"]
    LAYER_COLUMNS = [("pair", "K/V"), ("layer", "layer"), ("window", "window"), ("bits_per_value", "bits/value"),
                     ("kl_mean", "KL mean"), ("kl_mean_se", "±"), ("kl_median", "KL median"), ("kl_p99", "KL p99"),
                     ("kl_p99_9", "KL p99.9"), ("same_top", "same top %"), ("ppl", "PPL")]

    BUDGET_COLUMNS = [("budget", "budget"), ("layer", "layer"), ("window", "window"), ("pair", "K/V"),
                      ("bits_per_value", "bits/value"), ("kl_predicted", "predicted KL")]

    def format(self, fmt: str = "markdown", table: str = "pairs") -> str:
        """table: "pairs", "layers" (the per-layer rows) or "budget" (the proposals, layer by layer)."""
        if fmt == "json":
            return json.dumps({"info": self.info, "rows": self.rows, "per_layer": self.per_layer,
                               "budget": self.budget}, indent=1) + "\n"
        if table == "budget":
            rows = [{"budget": p["budget"]} | r for p in self.budget for r in p["layers"]]
            cols = self.BUDGET_COLUMNS if fmt == "csv" else self.BUDGET_COLUMNS[1:]
            if fmt == "markdown":
                return "\n".join(self._proposal_markdown(p) for p in self.budget)
        elif table in ("pairs", "layers"):
            rows, cols = (self.rows, self.COLUMNS) if table == "pairs" else (self.per_layer, self.LAYER_COLUMNS)
        else:
            raise ValueError(f"table must be pairs, layers or budget, got {table!r}")
        return self._format(rows, cols, fmt, table)

    def _proposal_markdown(self, p: dict) -> str:
        best = p.get("best_uniform")
        lines = [f"Budget {p['budget']:g} bits/value: {p['bits_per_value']:.4g} bits/value, KL mean predicted "
                 f"{p['kl_predicted']:.3g} (the sum of the per-layer KLs)"
                 + (f", measured {p['kl_mean']:.3g} ± {p['kl_mean_se']:.1g}" if "kl_mean" in p else "")
                 + (f"; the best uniform pair within the budget, {best['pair']} ({best['bits_per_value']:.4g} "
                    f"bits/value): {best['kl_mean']:.3g} ± {best['kl_mean_se']:.1g}" if best else "") + ".", "",
                 f"    kvq eval ... --pairs '{p['spec']}'", ""]
        rows = [r for r in p["layers"]]
        return "\n".join(lines) + "\n" + self._format(rows, self.BUDGET_COLUMNS[1:], "markdown", "budget")

    def _format(self, rows: list[dict], cols: list, fmt: str, table: str) -> str:
        if fmt == "csv":
            cols = cols + [(k, k) for k in self.CSV_EXTRA if table == "pairs"]
            lines = [",".join(k for k, _ in cols)] + [",".join(_cell(r.get(k), k) for k, _ in cols) for r in rows]
            return "\n".join(lines) + "\n"
        if fmt != "markdown":
            raise ValueError(f"format must be markdown, csv or json, got {fmt!r}")
        head = "| " + " | ".join(h for _, h in cols) + " |"
        sep = "|" + "|".join("---" if i == 0 else "--:" for i in range(len(cols))) + "|"
        # "K/V|K2/V2" and "PAIR*n": a "|" splits a cell, "*" is emphasis
        cells = [[_cell(r.get(k), k).replace("|", "\\|").replace("*", "\\*") for k, _ in cols] for r in rows]
        return "\n".join([head, sep] + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"


def _cell(v, key: str) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    if key.startswith("kl_"):
        return "0" if not v else f"{v:.1e}" if key == "kl_mean_se" else f"{v:.2e}"
    if key in ("same_top", "kib_per_token", "bits_per_value", "budget"):
        return f"{v:.2f}"
    if key in ("ppl", "ppl_ratio"):
        return f"{v:.4f}"
    if key == "tokens_per_s":
        return f"{v:.0f}"
    return str(v)
