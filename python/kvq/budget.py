"""Bits where they matter (``kvq eval --budget``): one K/V pair per layer within a budget of bits per value,
chosen from per-layer sensitivity rows (``EvalResult.per_layer``: the KL with only that layer quantized).
``allocate_budget`` solves the choice exactly, ``propose_budget`` turns rows into a proposal, and
``side_pair_rows`` builds a pair's rows from its key side's and value side's. No torch needed."""

from __future__ import annotations

import math
from typing import Sequence

from ._pairs import format_layer_pairs, layer_pairs


def allocate_budget(kl: Sequence[Sequence[float]], bits: Sequence[Sequence[float]], budget: float) -> list[int]:
    """One candidate per layer (its index) minimizing the sum of kl[layer][c] subject to
    mean over layers of bits[layer][c] <= budget: a multiple-choice knapsack, solved exactly.

    Dynamic programming over the layers on the Pareto frontier of (bits so far, KL so far): after each layer
    only the partial choices that no other partial choice beats on both bits and KL are kept (sorted by bits,
    a state is kept when its KL is below every state with fewer or equal bits), and those that cannot meet the
    budget even with the cheapest candidates on the remaining layers are dropped. It is exact: the first
    layers of an optimal choice are either kept or beaten on both counts by a kept state, which the same
    remaining layers complete within the budget at no more KL. No discretization of the bits: the states are
    the distinct sums of bits, few when the candidates' bits are few (7 candidates at multiples of 0.25 bit
    over 18 layers: at most 22 × 18 + 1 = 397 sums). Among choices of equal KL the one with fewer bits wins.
    Every layer counts alike, as KVQCache.bits_per_value averages them (each layer holds as many values).
    """
    n = len(kl)
    if n == 0 or len(bits) != n or any(len(a) != len(b) or not a for a, b in zip(kl, bits)):
        raise ValueError("allocate_budget: kl and bits need the same non-empty candidate lists for every layer")
    if not math.isfinite(budget):
        raise ValueError(f"allocate_budget: budget must be a finite number of bits per value, got {budget}")
    cap = budget * n
    eps = 1e-9 * max(1.0, abs(cap))
    rest = [0.0] * (n + 1)  # the fewest bits of layers l.. (the cheapest candidate of each)
    for l in range(n - 1, -1, -1):
        rest[l] = rest[l + 1] + min(bits[l])
    if rest[0] > cap + eps:
        raise ValueError(f"a budget of {budget:g} bits per value is below the cheapest choice: the cheapest "
                         f"candidate on every layer is {rest[0] / n:.4g} bits per value")
    frontier: list[tuple[float, float, tuple[int, ...]]] = [(0.0, 0.0, ())]
    for l in range(n):
        states = [(b + bits[l][c], k + kl[l][c], ch + (c,)) for b, k, ch in frontier for c in range(len(kl[l]))
                  if b + bits[l][c] + rest[l + 1] <= cap + eps]
        states.sort(key=lambda s: (s[0], s[1]))
        frontier = []
        for st in states:
            if not frontier or st[1] < frontier[-1][1]:
                frontier.append(st)
    return list(frontier[-1][2])  # the most bits on the frontier: the least KL


def propose_budget(per_layer: Sequence[dict], budget: float, pairs: Sequence[str] | None = None,
                   n_layers: int | None = None) -> dict:
    """The per-layer pairs for a budget of bits per value, from per-layer sensitivity rows (``EvalResult
    .per_layer``: pair, layer, window, bits_per_value, kl_mean with only that layer quantized): the candidates
    are ``pairs`` (default: every pair of the rows), each needing a row for every layer; the choice minimizes
    the sum of the per-layer KLs (the predicted KL, on the reading that the layers' KLs add up) with mean
    bits per value ≤ budget (``allocate_budget``). Returns budget, spec (a per-layer pair list kvq eval
    --pairs and KVQCache.from_spec take), bits_per_value, kl_predicted and the layers (layer, window, pair,
    bits_per_value, kl_predicted)."""
    table = {(r["pair"], int(r["layer"])): r for r in per_layer}
    cands = list(dict.fromkeys(pairs if pairs is not None else [r["pair"] for r in per_layer]))
    layers = sorted({l for _, l in table})
    if n_layers is not None and layers != list(range(n_layers)):
        raise ValueError(f"propose_budget: the sensitivity rows cover layers {layers}; the model has {n_layers}")
    if not cands or layers != list(range(len(layers))):
        raise ValueError("propose_budget: need per-layer rows for layers 0..n-1 of at least one pair")
    for p in cands:
        if ";" in p or "*" in p:
            raise ValueError(f"propose_budget: a candidate is one pair or 'K/V|K2/V2', not a per-layer list: {p!r}")
        missing = [l for l in layers if (p, l) not in table]
        if missing:
            raise ValueError(f"propose_budget: no sensitivity row of {p} for layers {missing}")
    rows = [[table[p, l] for p in cands] for l in layers]
    kl = [[float(r["kl_mean"]) for r in rs] for rs in rows]
    bits = [[float(r["bits_per_value"]) for r in rs] for rs in rows]
    choice = allocate_budget(kl, bits, budget)
    out = []
    for l, c in enumerate(choice):
        w = rows[l][c]["window"]
        out.append({"layer": l, "window": w, "pair": layer_pairs(cands[c], [0 if w == "full" else int(w)])[0],
                    "candidate": cands[c], "bits_per_value": bits[l][c], "kl_predicted": kl[l][c]})
    return {"budget": float(budget), "spec": format_layer_pairs([r["pair"] for r in out]),
            "bits_per_value": sum(r["bits_per_value"] for r in out) / len(out),
            "kl_predicted": sum(r["kl_predicted"] for r in out), "candidates": cands, "layers": out}


def side_pair_rows(per_layer: Sequence[dict], keys: Sequence[str], values: Sequence[str]) -> list[dict]:
    """Per-layer rows of every pair K/V from the per-layer rows of its sides, K/f32 (keys quantized, values
    exact) and f32/V: KL the sum of the two sides' (the KLs of a pair's sides add up: docs/eval.md measured
    pairs within ~7% of the sum), bits the mean of K's key bits and V's value bits (a side row's other half
    is f32's 32 bits). What ``--budget-keys``/``--budget-values`` choose from: n + m per-layer runs for
    n·m candidate pairs."""
    table = {(r["pair"], int(r["layer"])): r for r in per_layer}
    layers = sorted({l for _, l in table})
    out = []
    for k in keys:
        for v in values:
            for l in layers:
                rk, rv = table.get((f"{k}/f32", l)), table.get((f"f32/{v}", l))
                if rk is None or rv is None:
                    raise ValueError(f"side_pair_rows: no per-layer row of {k}/f32 or f32/{v} for layer {l}")
                kb, vb = 2 * float(rk["bits_per_value"]) - 32, 2 * float(rv["bits_per_value"]) - 32
                out.append({"pair": f"{k}/{v}", "layer": l, "window": rk["window"], "bits_per_value": (kb + vb) / 2,
                            "kl_mean": float(rk["kl_mean"]) + float(rv["kl_mean"])})
    return out
