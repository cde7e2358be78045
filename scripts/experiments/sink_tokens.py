#!/usr/bin/env python3
"""One-off experiment (issue 39, "Sink tokens: measured" in docs/eval-log.md): does keeping the first S tokens of
a sequence (the attention sinks: BOS and the next few) in f16 lower the model-level KL enough to pay for their
bits? Not a permanent tool and not a cache format: it emulates one.

    build/venv/bin/python scripts/experiments/sink_tokens.py gemma3-270m \
        --text /usr/share/common-licenses/GPL-3 --ctx 1024 --max-chunks 2 \
        --pairs 'q4_0+rot+center/q4_0,q4_0+rot/q4_0' --sinks 0,1,4,16

It runs `kvq eval`'s prefill-mode evaluation (chunks of ctx tokens, BOS first, the second half scored, KL
against the model on a kvq f32/f32 cache) with its own attention function: softmax(scale * scores + mask) @
values in torch, where the scores q.k and the values are those the kvq cache of the pair computes and
stores, except on the first S tokens, whose keys and values are the exact ones rounded to f16 (scored
against the float query).

"Those the cache computes": they are read back out of a kvq.KVCache with the layer's codecs ('+center',
chanN, rotations and seed as kvq.hf.KVQCache makes them), one sequence per block of block_tokens tokens, so
the block statistics ('+center' means, chanN's per-channel minimums and steps) are the cache's:

- scores: the block's key rows are appended with f32 values one-hot by token (row j -> e_j) and one more
  token with key 0 (left unsealed, so exact: its score is exactly 0); decode attention (attend_batch) of a
  query q scaled by a power of 2, alpha, gives weights p_j with log(p_j / p_ref) = alpha * (q.k_j) as the
  key codec scores it: the q8 round trip of the query that the block codecs score against, rotations and
  the q.mean of '+center' included. One call scores every (key block, query block) pair of one offset.
- values: keys f32, row j's key 200 * e_j, and the query e_j picks row j alone (the others' weights are
  exp(-200) = 0 in float32): the decoded value row.

A block's sink rows are replaced, before it is stored, by the mean of its other rows, so the block's mean,
minimum and maximum per channel are those of the non-sink rows (a sink format would leave the sinks out of
the block's statistics); the decoded sink rows are then discarded for the f16 ones. The rows of a block not
full at the end of the chunk stay exact, as in the cache (its float staging; none at ctx 1024 = 32 blocks).

Checks: `--self-check` compares the emulation with the cache's attend_prefill on random data (no model;
relative difference ~3e-7, float32 rounding). `--check-cache` computes each S = 0 layer on a kvq.KVCache too,
prints the largest relative difference (5e-7 on Gemma 3 270M) and goes on with the cache's result, so its
KL is `kvq eval`'s own. The emulation's S = 0 KL is not `kvq eval`'s to float noise: differences of 5e-7 move
later layers' values across the codes' rounding boundaries, and a chunk's KL moves by ~5-10% with them
(docs/eval-log.md, "Sink tokens: measured"); compare S > 0 with the emulation's own S = 0. The row "fake f32/f32"
(the emulation with f32 codecs against the kvq f32/f32 cache, ~4e-8) is the plumbing's noise floor.

Variants: --full-only (sinks on the full-attention layers only), --sinks-in-stats (block 0 stored with its
sink rows), --seed (the codecs' rotations), --first-chunk (other chunks of the text).

bits/value: each layer's key and value bits (KVQCache.bits_per_value(layer=l)), with min(S, m) of the m tokens
the layer holds at ctx (m = ctx, or its sliding window if shorter) at 16 bits instead, averaged over the
layers: (1 - S/m) * b + S/m * 16 (the convention of --exact-tail in docs/eval-log.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch

from kvq import _core, hf
from kvq._pairs import check_spec, layer_pairs, split_pair
from kvq.cli import _model_path, _pairs as _cli_pairs
from kvq.hf._config import _AttentionShape, split_key_spec
from kvq.model_eval import kl_stats, load_model

ATTN = "kvq_sink_experiment"


class FakeQuant:
    """A layer's attention scores and decoded values as a kvq cache with the spec's codecs computes them."""

    def __init__(self, config, spec: str, block_tokens: int = 32, seed: int | None = None):
        text = config.get_text_config(decoder=True)
        self.shape = shape = _AttentionShape.of(text)
        self.bt = block_tokens
        self.sinks_in_stats = False  # True: block 0 stored with its sink rows (they count in its statistics)
        self.group = block_tokens * (shape.n_heads // shape.n_kv_heads)  # query vectors per kv head and call
        self.pairs = [split_pair(p) for p in layer_pairs(spec, shape.windows)]
        n, kvh, d = shape.n_layers, shape.n_kv_heads, shape.head_dim
        if block_tokens + 1 > d:
            raise ValueError("the one-hot read-out needs head_dim > block_tokens")
        kw = dict(block_tokens=block_tokens, scale=1.0, softcap=0.0)
        self.seed = {} if seed is None else {"seed": seed}
        kw.update(self.seed)
        # As KVQCache groups them: one cache per centering, each layer with its own codecs there.
        self.kcache, self.vcache = {}, {}
        centered = [split_key_spec(k)[1] for k, _ in self.pairs]
        for c in set(centered):
            own = [(split_key_spec(k)[0], "f32") if cc == c else None for (k, _), cc in zip(self.pairs, centered)]
            first = next(p for p in own if p)
            self.kcache[c] = _core.KVCache(n, kvh, d, kvh * self.group, key_codec=first[0], value_codec="f32",
                                           layer_codecs=own, center_keys=c, **kw)
        self.key_cache = [self.kcache[c] for c in centered]
        self.vcache = _core.KVCache(n, kvh, d, kvh * block_tokens, key_codec="f32", value_codec=self.pairs[0][1],
                                    layer_codecs=[("f32", v) for _, v in self.pairs], **kw)

    def scores(self, layer: int, q: np.ndarray, k: np.ndarray, sinks: int, window: int = 0) -> np.ndarray:
        """q (queries, n_heads, head_dim), the last queries of k (tokens, kv_heads, head_dim), float32 -> the
        dot products q.k (n_heads, queries, tokens) as the cache computes them on its stored keys, for the
        full blocks each query may see (causal, within `window` tokens if > 0); elsewhere, and on the first
        `sinks` tokens (f16), the exact q.k."""
        bt, (t, kvh, d), (nq, nh, _) = self.bt, k.shape, q.shape
        g = nh // kvh
        out = np.einsum("qhd,thd->hqt", q, np.repeat(k, g, axis=1), optimize=True)  # query head i: kv head i // g
        nb = t // bt
        if sinks:
            kh = np.repeat(k[:sinks].astype(np.float16).astype(np.float32), g, axis=1)
            out[:, :, :sinks] = np.einsum("qhd,thd->hqt", q, kh)
        if nb == 0:
            return out
        cache = self.key_cache[layer]
        # Each query vector scaled so that its scores stay within +-30 (exp in float32 keeps the ratios);
        bound = np.abs(out[:, :, :nb * bt]).max(axis=2) + 1e-6  # (n_heads, queries)
        # A power of 2: the scaled query's float bits (and its q8 round trip in the block codecs) scale exactly.
        alpha = np.exp2(np.floor(np.log2(30.0 / bound))).astype(np.float32)
        qa = q * alpha.T[:, :, None]  # (queries, n_heads, d)
        # Query blocks of bt queries; (key block, query block) pairs that the mask lets meet.
        off = t - nq  # position of query 0
        work = []
        for qb in range(0, nq, bt):
            lo_pos, hi_pos = off + qb, off + min(qb + bt, nq) - 1
            first_key = max(0, lo_pos - window + 1) if window else 0
            for b in range(first_key // bt, min(hi_pos // bt, nb - 1) + 1):
                work.append((b, qb))
        per = self.group  # query vectors per kv head in a call: a query block's bt queries x g heads
        vals = np.zeros((bt + 1, kvh, d), np.float32)
        for j in range(bt + 1):
            vals[j, :, j] = 1.0
        seqs = []
        try:
            for b in range(nb):
                rows = np.ascontiguousarray(k[b * bt:(b + 1) * bt])
                if not self.sinks_in_stats:
                    rows = _without_sinks(rows, sinks - b * bt)
                seq = cache.add_sequence()
                seqs.append(seq)
                cache.append(layer, np.concatenate([rows, np.zeros((1, kvh, d), np.float32)]), vals, seq=seq)
            # One call per offset between the query block and the key block (a sequence once per call).
            by_offset: dict[int, list[tuple[int, int]]] = {}
            for b, qb in work:
                by_offset.setdefault(qb // bt - b, []).append((b, qb))
            for part in by_offset.values():
                batch = np.zeros((len(part), kvh * per, d), np.float32)
                for i, (b, qb) in enumerate(part):
                    qq = qa[qb:qb + bt]  # (m, n_heads, d); kv head h's vectors: its g heads of each query
                    m = qq.shape[0]
                    for h in range(kvh):
                        batch[i, h * per:h * per + m * g] = qq[:, h * g:(h + 1) * g].reshape(m * g, d)
                p = cache.attend_batch(layer, batch, seqs=[seqs[b] for b, _ in part])[..., :bt + 1]
                p = p.astype(np.float64)
                with np.errstate(divide="raise"):
                    lr = np.log(p[..., :bt] / p[..., bt:])  # alpha * q.k
                for i, (b, qb) in enumerate(part):
                    m = min(bt, nq - qb)
                    for h in range(kvh):
                        sc = lr[i, h * per:h * per + m * g].reshape(m, g, bt).transpose(1, 0, 2)  # (g, m, bt)
                        heads = slice(h * g, (h + 1) * g)
                        out[heads, qb:qb + m, b * bt:(b + 1) * bt] = sc / alpha[heads, qb:qb + m, None]
        finally:
            for s in seqs:
                cache.remove(s)
        if sinks:  # the decoded sink rows are not used
            out[:, :, :sinks] = np.einsum("qhd,thd->hqt", q, kh)
        return out

    def values(self, layer: int, v: np.ndarray, sinks: int) -> np.ndarray:
        bt, (t, kvh, d) = self.bt, v.shape
        nb = t // bt
        out = v.copy()
        if nb == 0:
            return out
        keys = np.zeros((bt, kvh, d), np.float32)
        for j in range(bt):
            keys[j, :, j] = 200.0
        q = np.zeros((kvh * bt, d), np.float32)
        for h in range(kvh):
            q[h * bt:(h + 1) * bt, :bt] = np.eye(bt, dtype=np.float32)
        seqs = []
        cache = self.vcache
        try:
            for b in range(nb):
                rows = np.ascontiguousarray(v[b * bt:(b + 1) * bt])
                seq = cache.add_sequence()
                seqs.append(seq)
                cache.append(layer, keys, rows, seq=seq)
            o = cache.attend_batch(layer, np.broadcast_to(q, (nb,) + q.shape).copy(), seqs=seqs)
        finally:
            for s in seqs:
                cache.remove(s)
        out[:nb * bt] = o.reshape(nb, kvh, bt, d).transpose(0, 2, 1, 3).reshape(nb * bt, kvh, d)
        return out


def _without_sinks(rows: np.ndarray, sinks: int) -> np.ndarray:
    """The block's first `sinks` rows replaced by the mean of the others (they leave its statistics alone)."""
    s = min(max(sinks, 0), len(rows))
    if s == 0:
        return rows
    rows = rows.copy()
    rows[:s] = rows[s:].mean(axis=0) if s < len(rows) else 0.0
    return rows


class _State:
    fq: FakeQuant | None = None
    sinks = 0
    full_only = False  # sinks on the full-attention layers only
    check_cache = False  # --check-cache: S = 0 layers computed by the cache itself, the difference recorded
    diffs: list[float] = []


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
               softcap=None, **kwargs):
    """transformers attention (batch 1): softmax(scaling * scores + mask) @ values, the scores and values as the
    kvq cache of _State.fq stores them (FakeQuant), the first _State.sinks tokens exact (f16)."""
    fq, s = _State.fq, _State.sinks
    if _State.full_only and sliding_window:
        s = 0
    if softcap:
        raise ValueError("soft-capped attention is not emulated here")
    if query.shape[0] != 1:
        raise ValueError("batch 1 only")
    layer = module.layer_idx
    q = query[0].transpose(0, 1).float().contiguous().numpy()  # (queries, n_heads, head_dim)
    k = key[0].transpose(0, 1).float().contiguous().numpy()  # (tokens, kv heads, head_dim)
    v = value[0].transpose(0, 1).float().contiguous().numpy()
    nq, nh, d = q.shape
    t, kvh, _ = k.shape
    if fq is None:
        sc, vd = np.einsum("qhd,thd->hqt", q, np.repeat(k, nh // kvh, axis=1)), v
    else:
        sc, vd = fq.scores(layer, q, k, s, int(sliding_window or 0)), fq.values(layer, v, s)
        if s:
            vd[:s] = v[:s].astype(np.float16).astype(np.float32)
    logits = torch.from_numpy(sc) * float(scaling if scaling is not None else d ** -0.5)  # (heads, q, t)
    if attention_mask is None:
        allow = torch.ones(nq, t, dtype=torch.bool).tril(t - nq)
    else:
        allow = attention_mask[0, 0] if attention_mask.dtype == torch.bool else attention_mask[0, 0] == 0
    logits = logits.masked_fill(~allow[None], float("-inf"))
    w = torch.softmax(logits, dim=-1)
    vh = torch.from_numpy(np.repeat(vd, nh // kvh, axis=1)).transpose(0, 1)  # (heads, t, d)
    out = torch.matmul(w, vh).transpose(0, 1).contiguous()  # (q, heads, d)
    if _State.check_cache and fq is not None and s == 0:
        # The same layer's attention on a kvq.KVCache of the layer's pair (its own codecs, one append and
        # attend_prefill as kvq.hf does); the model goes on with the cache's result.
        kc, vc = fq.pairs[layer]
        cache = _core.KVCache(fq.shape.n_layers, kvh, d, nh, key_codec=split_key_spec(kc)[0], value_codec=vc,
                              center_keys=split_key_spec(kc)[1], scale=float(scaling), sliding_window=fq.shape.windows,
                              **fq.seed)
        seq = cache.add_sequence()
        cache.append(layer, k, v, seq=seq)
        ref = torch.from_numpy(cache.attend_prefill(layer, q, seq=seq))
        _State.diffs.append(float((out - ref).norm() / ref.norm()))
        out = ref
    return out[None].to(query.dtype), None


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN, _attention)
    AttentionMaskInterface.register(ATTN, sdpa_mask)


def sink_bits(config, spec: str, sinks: int, ctx: int, full_only: bool = False) -> tuple[float, float]:
    """Mean (key, value) bits per value over the layers with the first `sinks` tokens at 16 bits (on the
    full-attention layers only if full_only)."""
    cache = hf.KVQCache.from_spec(config, spec)
    kb = vb = 0.0
    n = len(cache.windows)
    for l, w in enumerate(cache.windows):
        k, v = cache.bits_per_value(layer=l)
        held = min(ctx, w) if w else ctx
        share = 0.0 if full_only and w else min(sinks, held) / held
        kb += (1 - share) * k + share * 16
        vb += (1 - share) * v + share * 16
    return kb / n, vb / n


def self_check(specs=("f32/f32", "q4_0/q4_0", "q4_0+rot/q4_0", "q4_0+rot+center/q4_0", "chan3/polar:budget=3",
                        "q5_0+rot+center/polar:budget=3")) -> bool:
    """The emulation against the cache itself on random data (no model): attention on FakeQuant's scores and
    values, with S = 0, must equal kvq.KVCache.attend_prefill within float32 rounding, full and windowed."""
    from types import SimpleNamespace

    n, d, win, scale = 1024, 256, 512, 1 / 16
    cfg = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=d,
                          hidden_size=640, sliding_window=win, layer_types=["sliding_attention", "full_attention"])
    cfg.get_text_config = lambda decoder=True: cfg
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((n, 1, d)) * 1.5 + rng.standard_normal((1, 1, d)) * 3).astype(np.float32)
    v = rng.standard_normal((n, 1, d)).astype(np.float32)
    q = rng.standard_normal((n, 4, d)).astype(np.float32)
    i = np.arange(n)
    ok = True
    for spec in specs:
        fq = FakeQuant(cfg, spec)
        kc, vc = split_pair(spec)
        cache = _core.KVCache(2, 1, d, 4, key_codec=split_key_spec(kc)[0], value_codec=vc, scale=scale,
                              center_keys=split_key_spec(kc)[1], sliding_window=[win, 0])
        seq = cache.add_sequence()
        for layer, w in ((0, win), (1, 0)):
            cache.append(layer, k, v, seq=seq)
            ref = cache.attend_prefill(layer, q, seq=seq)
            lg = fq.scores(layer, q, k, 0, w).astype(np.float64) * scale
            mask = (i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :] < w) if w else True)
            lg = np.where(mask[None], lg, -np.inf)
            p = np.exp(lg - lg.max(2, keepdims=True))
            p /= p.sum(2, keepdims=True)
            got = np.einsum("hqt,td->qhd", p, fq.values(layer, v, 0)[:, 0])
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            ok &= err < 1e-5
            print(f"{spec:34} window {w:3}: relative difference from the cache's attend_prefill {err:.2g}")
    print("self-check", "passed" if ok else "FAILED")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="as kvq eval's MODEL (gemma3-270m, a directory or a .gguf)")
    ap.add_argument("--self-check", action="store_true", help="only check the emulation against the cache on "
                                                                   "random data (no model) and exit")
    ap.add_argument("--text")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--max-chunks", type=int, default=2)
    ap.add_argument("--first-chunk", type=int, default=0, help="skip this many chunks of the text first")
    ap.add_argument("--seed", type=int, help="the codecs' seed (rotations), as kvq.KVCache(seed=...); default kvq's")
    ap.add_argument("--pairs", help="comma-separated pair specs, as kvq eval --pairs")
    ap.add_argument("--sinks", default="0,1,4,16")
    ap.add_argument("--full-only", action="store_true", help="sinks on the full-attention layers only")
    ap.add_argument("--check-cache", action="store_true",
                    help="with S = 0, each layer also on a kvq.KVCache: prints the emulation's relative difference "
                         "per layer and goes on with the cache's result (so S = 0 is kvq eval's own run)")
    ap.add_argument("--sinks-in-stats", action="store_true",
                    help="store block 0 with its sink rows (they count in its '+center' means and chanN ranges)")
    ap.add_argument("--no-noise-floor", action="store_true", help="skip the fake f32/f32 row")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if a.self_check:
        return 0 if self_check() else 1
    if not (a.model and a.text and a.pairs):
        ap.error("MODEL, --text and --pairs are needed (or --self-check)")
    pairs = _cli_pairs([a.pairs])  # as kvq eval --pairs splits them
    sinks = [int(s) for s in a.sinks.split(",")]
    for p in pairs:
        check_spec(p)
    _register()
    t0 = time.time()
    model, tok = load_model(_model_path(a.model))
    config = model.config
    print(f"model loaded in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    text = open(a.text, encoding="utf-8").read()
    tokens = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id
    ctx = a.ctx
    body = ctx - 1 if bos is not None else ctx
    n_chunks = min(len(tokens) // body - a.first_chunk, a.max_chunks)
    first = ctx // 2
    keep = ctx - first
    runs = ([("f32/f32", 0, True)] if not a.no_noise_floor else []) + [(p, s, False) for p in pairs for s in sinks]
    fqs = {p: FakeQuant(config, p, seed=a.seed) for p in dict.fromkeys(r[0] for r in runs)}
    for fq in fqs.values():
        fq.sinks_in_stats = a.sinks_in_stats
    acc = {i: {"kl": [], "nll": [], "same": 0} for i in range(len(runs))}
    base_nll = []
    cache_kw = hf.cache_keyword(model)
    with torch.no_grad():
        for c in range(n_chunks):
            at = (a.first_chunk + c) * body
            ids = torch.tensor([([bos] if bos is not None else []) + tokens[at:at + body]])
            targets = ids[0, first + 1:]
            model.set_attn_implementation(hf.ATTN_IMPLEMENTATION)
            cache = hf.KVQCache(config, "f32", "f32", max_batch_size=1)
            logits = model(ids, use_cache=True, logits_to_keep=keep, **{cache_kw: cache}).logits[0, :-1]
            base = torch.log_softmax(logits.float(), dim=-1)
            base_nll.append((-base.gather(1, targets[:, None])[:, 0]).numpy().astype(np.float64))
            base_top = base.argmax(-1)
            del cache, logits
            model.set_attn_implementation(ATTN)
            for i, (p, s, _) in enumerate(runs):
                t1 = time.time()
                _State.fq, _State.sinks, _State.full_only = fqs[p], s, a.full_only
                _State.check_cache, _State.diffs = a.check_cache, []
                logits = model(ids, use_cache=False, logits_to_keep=keep).logits[0, :-1]
                lp = torch.log_softmax(logits.float(), dim=-1)
                kl = (base.exp() * (base - lp)).sum(-1).clamp_min(0).numpy().astype(np.float64)
                acc[i]["kl"].append(kl)
                acc[i]["nll"].append((-lp.gather(1, targets[:, None])[:, 0]).numpy().astype(np.float64))
                acc[i]["same"] += int((lp.argmax(-1) == base_top).sum())
                print(f"chunk {c + 1}/{n_chunks} {p} S={s}: KL {kl.mean():.4g} ({time.time() - t1:.0f} s)"
                      + (f"; emulation vs cache per layer: max {max(_State.diffs):.2g}" if _State.diffs else ""),
                      file=sys.stderr, flush=True)
    base_ppl = math.exp(np.concatenate(base_nll).mean())
    rows = []
    for i, (p, s, floor) in enumerate(runs):
        kl = np.concatenate(acc[i]["kl"])
        nll = np.concatenate(acc[i]["nll"])
        kb, vb = sink_bits(config, p, s, ctx, a.full_only)
        rows.append({"pair": ("fake " if floor else "") + p, "sinks": s, "bits_per_value": (kb + vb) / 2,
                     "key_bits": kb, "value_bits": vb, **kl_stats(kl), "same_top": 100.0 * acc[i]["same"] / kl.size,
                     "ppl_ratio": math.exp(nll.mean()) / base_ppl, "scored": int(kl.size)})
    print(f"ctx {ctx}, chunks {a.first_chunk + 1}..{a.first_chunk + n_chunks}, {rows[0]['scored']} scored tokens; "
          "KL against the kvq f32/f32 cache" + ("; sinks on the full-attention layers only" if a.full_only else "")
          + ("; sinks in block 0's statistics" if a.sinks_in_stats else "") + "\n")
    print("| K/V | S | bits/value | KL mean ± se | KL median | KL p99 | same top % | PPL ratio |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        name = r["pair"].replace("|", "\\|").replace("*", "\\*")
        print(f"| {name} | {r['sinks']} | {r['bits_per_value']:.3f} | {r['kl_mean']:.4g} ± {r['kl_mean_se']:.2g} | "
              f"{r['kl_median']:.4g} | {r['kl_p99']:.4g} | {r['same_top']:.2f} | {r['ppl_ratio']:.4f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ctx": ctx, "first_chunk": a.first_chunk, "chunks": n_chunks, "seed": a.seed, "text": a.text,
                       "full_only": a.full_only, "sinks_in_stats": a.sinks_in_stats, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
