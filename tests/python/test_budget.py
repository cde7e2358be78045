"""kvq eval --budget without a model: the allocator (kvq.model_eval.allocate_budget, propose_budget) against
brute force, and the per-layer pair spec (kvq._pairs) read back from what it writes. Needs no torch."""

import itertools

import numpy as np
import pytest

from kvq import _pairs, model_eval


def brute_force(kl, bits, budget):
    """The least total KL of any choice within the budget (mean bits <= budget), or None."""
    n = len(kl)
    best = None
    for choice in itertools.product(*[range(len(k)) for k in kl]):
        b = sum(bits[l][c] for l, c in enumerate(choice))
        if b <= budget * n + 1e-9:
            k = sum(kl[l][c] for l, c in enumerate(choice))
            best = k if best is None or k < best else best
    return best


@pytest.mark.parametrize("grid", [True, False])
def test_allocator_matches_brute_force(grid):
    rng = np.random.default_rng(7 if grid else 8)
    checked = 0
    for _ in range(300):
        n, c = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        if grid:  # bits on a grid, as kvq's pairs are (many equal sums), KL falling with bits plus noise
            bits = [sorted(rng.choice(np.arange(3.0, 9.0, 0.25), size=c, replace=False).tolist()) for _ in range(n)]
            kl = [[float(rng.lognormal(-2 - 0.6 * b, 1)) for b in row] for row in bits]
        else:  # any real bits and KL, no order between them
            bits = rng.uniform(2, 9, size=(n, c)).tolist()
            kl = rng.exponential(1, size=(n, c)).tolist()
        lo, hi = np.mean([min(r) for r in bits]), np.mean([max(r) for r in bits])
        budget = float(rng.uniform(lo - 0.3, hi + 0.3))
        best = brute_force(kl, bits, budget)
        if best is None:
            with pytest.raises(ValueError, match="below the cheapest"):
                model_eval.allocate_budget(kl, bits, budget)
            continue
        choice = model_eval.allocate_budget(kl, bits, budget)
        assert len(choice) == n
        assert sum(bits[l][c] for l, c in enumerate(choice)) <= budget * n + 1e-9  # the budget holds
        assert sum(kl[l][c] for l, c in enumerate(choice)) == pytest.approx(best, rel=1e-12, abs=1e-15)
        checked += 1
    assert checked > 200


def test_allocator_spends_bits_where_they_matter():
    # Three layers, candidates 3 and 5 bits; layer 1 loses the most from 3 bits, so it gets 5.
    kl = [[0.10, 0.01], [0.50, 0.02], [0.05, 0.04]]
    bits = [[3, 5]] * 3
    assert model_eval.allocate_budget(kl, bits, 3.0) == [0, 0, 0]
    assert model_eval.allocate_budget(kl, bits, 11 / 3) == [0, 1, 0]
    assert model_eval.allocate_budget(kl, bits, 13 / 3) == [1, 1, 0]
    assert model_eval.allocate_budget(kl, bits, 5) == [1, 1, 1]
    # Equal KL: the fewer bits.
    assert model_eval.allocate_budget([[0.1, 0.1]], [[5, 3]], 5) == [1]
    # A dear candidate that is no better is never taken.
    assert model_eval.allocate_budget([[0.1, 0.2]], [[3, 8]], 8) == [0]


def test_allocator_refuses_an_infeasible_budget_and_bad_tables():
    with pytest.raises(ValueError, match=r"budget of 3\.4 bits per value is below the cheapest choice: .* 3\.5 bits"):
        model_eval.allocate_budget([[0.1, 0.0]] * 2, [[3.5, 8.5]] * 2, 3.4)
    with pytest.raises(ValueError, match="same non-empty"):
        model_eval.allocate_budget([[0.1]], [[3, 4]], 4)
    with pytest.raises(ValueError, match="same non-empty"):
        model_eval.allocate_budget([], [], 4)
    with pytest.raises(ValueError, match="finite"):
        model_eval.allocate_budget([[0.1]], [[3]], float("nan"))


def rows(table, windows):
    """Sensitivity rows as eval_model's per_layer: {pair: [(bits, kl) per layer]}."""
    return [{"pair": p, "layer": l, "window": windows[l] or "full", "bits_per_value": b, "kl_mean": k}
            for p, per in table.items() for l, (b, k) in enumerate(per)]


def test_propose_budget_from_per_layer_rows():
    windows = [512, 512, 0, 512]
    table = {"a/b": [(3, 0.2), (3, 0.3), (3, 0.9), (3, 0.1)], "c/d": [(4, 0.1), (4, 0.1), (4, 0.1), (4, 0.05)],
             "e/f|g/h": [(6, 0.01), (5, 0.01), (6, 0.0), (5, 0.04)]}  # e/f on full layers, g/h on windowed ones
    p = model_eval.propose_budget(rows(table, windows), 3.5, n_layers=4)
    # 14 bits for 4 layers, 2 above the cheapest: 4 bits on layer 2 (0.9 at 3 bits) and on layer 1.
    assert [r["pair"] for r in p["layers"]] == ["a/b", "c/d", "c/d", "a/b"]
    assert p["spec"] == "a/b;c/d*2;a/b" and p["bits_per_value"] == 3.5
    assert p["kl_predicted"] == pytest.approx(0.2 + 0.1 + 0.1 + 0.1)
    assert _pairs.layer_pairs(p["spec"], windows) == [r["pair"] for r in p["layers"]]
    p = model_eval.propose_budget(rows(table, windows), 5.25, n_layers=4)
    assert [r["pair"] for r in p["layers"]] == ["g/h", "g/h", "e/f", "c/d"]
    assert [r["candidate"] for r in p["layers"]] == ["e/f|g/h"] * 3 + ["c/d"]
    assert p["bits_per_value"] == 5.25 and p["spec"] == "g/h*2;e/f;c/d"
    assert model_eval.propose_budget(rows(table, windows), 5.5)["spec"] == "g/h*2;e/f;g/h"  # 0.06 < 0.07
    # Candidates restricted; rows missing or for another model: refused.
    assert model_eval.propose_budget(rows(table, windows), 9, pairs=["a/b"])["spec"] == "a/b"
    with pytest.raises(ValueError, match="below the cheapest"):
        model_eval.propose_budget(rows(table, windows), 3.5, pairs=["c/d"])
    with pytest.raises(ValueError, match="has 18"):
        model_eval.propose_budget(rows(table, windows), 3.5, n_layers=18)
    partial = [r for r in rows(table, windows) if not (r["pair"] == "c/d" and r["layer"] == 2)]
    with pytest.raises(ValueError, match=r"no sensitivity row of c/d for layers \[2\]"):
        model_eval.propose_budget(partial, 3.5)


def test_per_layer_spec_round_trip():
    windows = [512] * 5 + [0] + [512] * 5 + [0]
    rng = np.random.default_rng(2)
    names = ["q8_0/q4_0", "chan3/polar:budget=3", "q4_0+rot+center/q4_0", "polar:L=4,budget=3/q8_0"]
    for _ in range(200):
        pairs = [names[i] for i in rng.integers(0, len(names), size=len(windows))]
        spec = _pairs.format_layer_pairs(pairs)
        assert _pairs.layer_pairs(spec, windows) == pairs
        assert ("*" in spec or ";" in spec) == (len(set(pairs)) > 1)
    assert _pairs.format_layer_pairs(["a/b", "a/b", "c/d", "a/b"]) == "a/b*2;c/d;a/b"
    assert _pairs.format_layer_pairs(["a/b"] * 3) == "a/b"
    # The other forms: one pair, and K/V|K2/V2 (K2/V2 on the windowed layers).
    assert _pairs.layer_pairs("a/b", [0, 4]) == ["a/b", "a/b"]
    assert _pairs.layer_pairs("a/b|c/d", [0, 4, 4]) == ["a/b", "c/d", "c/d"]
    assert _pairs.layer_pairs("a/b*2; c/d", [0, 4, 4]) == ["a/b", "a/b", "c/d"]


@pytest.mark.parametrize("spec, match", [
    ("a/b;c/d", "names 2 layers; the model has 3"), ("a/b*4", "names 4 layers"), ("a/b*0;c/d*3", r"PAIR\*n"),
    ("a/b*x", r"PAIR\*n"), ("a/b;;c/d", "KEY/VALUE"), ("a;b/c;d/e", "KEY/VALUE"), ("a/b|c/d;e/f", "KEY/VALUE"),
    ("a/b|c", "KEY/VALUE"), ("a/b/c", "KEY/VALUE"), ("a/b|c/d|e/f", "KEY/VALUE"),
])
def test_per_layer_spec_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        _pairs.layer_pairs(spec, [0, 4, 4])


def test_side_pair_rows_add_the_sides():
    # Keys a (4.5 bits) and b (8.5), values x (4.5) and y (3.5), on 2 layers: a pair's KL the sum of its
    # sides', its bits the mean of the key's and the value's (each side row counts the other half as f32).
    side = {("a/f32", 0): (18.25, 0.2), ("a/f32", 1): (18.25, 0.3), ("b/f32", 0): (20.25, 0.01),
            ("b/f32", 1): (20.25, 0.02), ("f32/x", 0): (18.25, 0.05), ("f32/x", 1): (18.25, 0.04),
            ("f32/y", 0): (17.75, 0.1), ("f32/y", 1): (17.75, 0.3)}
    per_layer = [{"pair": p, "layer": l, "window": "full", "bits_per_value": b, "kl_mean": k}
                 for (p, l), (b, k) in side.items()]
    got = {(r["pair"], r["layer"]): (r["bits_per_value"], r["kl_mean"])
           for r in model_eval.side_pair_rows(per_layer, ["a", "b"], ["x", "y"])}
    assert set(got) == {(p, l) for p in ("a/x", "a/y", "b/x", "b/y") for l in (0, 1)}
    assert got["a/y", 1] == pytest.approx((4.0, 0.6)) and got["b/x", 0] == pytest.approx((6.5, 0.06))
    p = model_eval.propose_budget(model_eval.side_pair_rows(per_layer, ["a", "b"], ["x", "y"]), 5.0)
    # 10 bits over 2 layers: the least summed KL of the pairs within them (a/x on both, 0.59).
    best = min(((c0, c1) for c0 in got for c1 in got if c0[1] == 0 and c1[1] == 1
                and got[c0][0] + got[c1][0] <= 10), key=lambda c: got[c[0]][1] + got[c[1]][1])
    assert p["spec"] == _pairs.format_layer_pairs([best[0][0], best[1][0]])
    with pytest.raises(ValueError, match="no per-layer row of c/f32"):
        model_eval.side_pair_rows(per_layer, ["c"], ["x"])
