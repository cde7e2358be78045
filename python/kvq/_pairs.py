"""K/V pair specs, parsed in one place (kvq eval --pairs, kvq.eval_model, kvq.hf.KVQCache.from_spec):

- ``K/V``: one pair on every layer, e.g. ``q8_0/q4_0``;
- ``K/V|K2/V2``: K2/V2 on the sliding-window layers, K/V on the others;
- a per-layer list, one pair per layer in layer order, separated by ``;``, a run of n equal layers written
  ``PAIR*n``: ``chan3/polar:budget=3*4;q8_0/q4_0;chan3/polar:budget=3*13`` is 18 layers, layer 4 at
  q8_0/q4_0. Its layer count must be the model's. ``kvq eval --budget`` prints its proposals this way.

No codec name holds ``;``, ``*`` or ``|``; quote a spec in the shell. Needs no torch.
"""

from __future__ import annotations

from typing import Sequence


def split_pair(spec: str) -> tuple[str, str]:
    """'q8_0/q4_0' -> ('q8_0', 'q4_0'); one pair, no '|', ';' or '*'."""
    k, sep, v = spec.partition("/")
    if not sep or not k or not v or any(c in spec for c in "|;*") or "/" in v:
        raise ValueError(f"a codec pair is 'KEY/VALUE', e.g. 'q8_0/q4_0'; got {spec!r}")
    return k, v


# The most layers a list may name: a KVCache holds at most 65536 (kvq.KVCache's n_layers).
MAX_LAYERS = 65536


def _runs(spec: str) -> list[tuple[str, int]]:
    """The per-layer list's runs (pair, n), not expanded, their layers at most MAX_LAYERS in all; a
    ValueError on any malformed item (n in ASCII digits right after '*', no space around the pair)."""
    out: list[tuple[str, int]] = []
    total = 0
    for item in spec.split(";"):
        pair, star, count = item.strip().partition("*")
        n = 1
        if star:
            if not (count.isascii() and count.isdigit()) or int(count) < 1:
                raise ValueError(f"a per-layer pair list repeats a pair as PAIR*n (n >= 1, ASCII digits); got {item!r} "
                                 f"in {spec!r}")
            if len(count) > 6 or int(count) > MAX_LAYERS:
                raise ValueError(f"a per-layer pair list repeats {pair!r} {count} times; a cache has at most "
                                 f"{MAX_LAYERS} layers")
            n = int(count)
        if pair != pair.strip():
            raise ValueError(f"a per-layer pair list's item is PAIR or PAIR*n without spaces around the pair; got "
                             f"{item!r} in {spec!r}")
        split_pair(pair)
        total += n
        if total > MAX_LAYERS:
            raise ValueError(f"the per-layer pair list {spec[:80]!r}... names more than {MAX_LAYERS} layers, more than "
                             "a cache holds")
        out.append((pair, n))
    return out


def check_spec(spec: str) -> None:
    """Raise a ValueError if spec is none of the three forms (the layer count is checked by layer_pairs)."""
    if ";" in spec or "*" in spec:
        _runs(spec)
    elif "|" in spec:
        full, _, windowed = spec.partition("|")
        split_pair(full)
        split_pair(windowed)
    else:
        split_pair(spec)


def layer_pairs(spec: str, windows: Sequence[int]) -> list[str]:
    """The pair ('K/V') of each layer under spec; windows: per layer, 0 for full attention or the sliding
    window (kvq.hf reads them from a model config)."""
    check_spec(spec)
    n = len(windows)
    if ";" in spec or "*" in spec:
        runs = _runs(spec)
        named = sum(k for _, k in runs)
        if named != n:  # compared before the list is made
            raise ValueError(f"the per-layer pair list {spec!r} names {named} layers; the model has {n}")
        return [pair for pair, k in runs for _ in range(k)]
    full, _, windowed = spec.partition("|")
    return [windowed if windowed and w else full for w in windows]


def format_layer_pairs(pairs: Sequence[str]) -> str:
    """The per-layer list of pairs as a spec layer_pairs reads back (runs of equal layers as PAIR*n);
    one pair on every layer is written as the plain pair."""
    if not pairs:
        raise ValueError("format_layer_pairs: no layers")
    for p in pairs:
        split_pair(p)
    runs: list[list] = []
    for p in pairs:
        if runs and runs[-1][0] == p:
            runs[-1][1] += 1
        else:
            runs.append([p, 1])
    if len(runs) == 1:
        return pairs[0]
    return ";".join(p if n == 1 else f"{p}*{n}" for p, n in runs)
