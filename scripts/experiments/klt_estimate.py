#!/usr/bin/env python3
"""One-off experiment (docs/eval-log.md, "What did not pay"): how much a calibrated transform (format_study.py's
+klt: the eigenbasis of the query- or o_proj-weighted second moments, bit widths by water-filling) could gain
over the rotation on Gemma 3 270M's keys and values, before measuring it on the model. Captures q, k, v per
layer on 1024 tokens of GPL-2 (calibration) and of GPL-3 (evaluation), then prints per layer
  1. the high-rate Gaussian model's gain in bits per value at 3 bits (keys with +qk against the transform),
  2. the weighted squared error of lm3 (3 bits, one scale per row) after the rotation and after +klt.

    build/venv/bin/python scripts/experiments/klt_estimate.py      # ~2 min, no kvq cache involved
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_study as fs  # noqa: E402
from kvq.cli import _model_path
from kvq.model_eval import load_model
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
CAP = {}
def attn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, softcap=None, **kw):
    L = module.layer_idx
    q = query[0].transpose(0, 1).float(); k = key[0].transpose(0, 1).float(); v = value[0].transpose(0, 1).float()
    CAP[L] = (q.clone(), k.clone(), v.clone(), module.o_proj.weight.detach().float().clone())
    nq, nh, d = q.shape; t, kvh, _ = k.shape
    sc = torch.einsum("qhd,thd->hqt", q, k.repeat_interleave(nh // kvh, 1)) * float(scaling if scaling is not None else d ** -0.5)
    if attention_mask is None: allow = torch.ones(nq, t, dtype=torch.bool).tril(t - nq)
    else: allow = attention_mask[0, 0] if attention_mask.dtype == torch.bool else attention_mask[0, 0] == 0
    w = torch.softmax(sc.masked_fill(~allow[None], float('-inf')), -1)
    out = torch.matmul(w, v.repeat_interleave(nh // kvh, 1).transpose(0, 1)).transpose(0, 1)
    return out[None].to(query.dtype), None
AttentionInterface.register('cap', attn); AttentionMaskInterface.register('cap', sdpa_mask)
model, tok = load_model(_model_path('gemma3-270m'))
model.set_attn_implementation('cap')
def run(path, n=1024):
    ids = tok(open(path).read(), add_special_tokens=False)['input_ids'][:n - 1]
    with torch.no_grad(): model(torch.tensor([[tok.bos_token_id] + ids]), use_cache=False)
    return {L: v for L, v in CAP.items()}
cal = run('/usr/share/common-licenses/GPL-2'); CAP.clear()
ev = run('/usr/share/common-licenses/GPL-3')
def wf(mu, R_total):
    """reverse water-filling: distortion sum for total rate R_total bits over eigenvalues mu."""
    mu = mu.clamp_min(1e-20).double(); lo, hi = 1e-30, float(mu.max())
    for _ in range(200):
        th = math.sqrt(lo * hi) if lo > 0 else hi / 2
        R = (0.5 * torch.log2(mu / th)).clamp_min(0).sum()
        if R > R_total: lo = th
        else: hi = th
    th = hi
    return float(torch.minimum(mu, torch.tensor(th, dtype=torch.float64)).sum())
def sym_sqrt(S):
    e, U = torch.linalg.eigh(S.double()); return (U * e.clamp_min(0).sqrt()) @ U.T
print('layer  keys: had(+qk) vs klt gain in bits/value at 3 b   values: same')
for L in sorted(ev):
    q, k, v, wo = cal[L]; qe, ke, ve, _ = ev[L]
    d = k.shape[-1]; g = q.shape[1] // k.shape[1]
    kc = (k - fs.block_mean(k, 128))[:, 0]; kce = (ke - fs.block_mean(ke, 128))[:, 0]
    s = fs.static_scale(q.pow(2).mean((0, 1))[None], kc.pow(2).mean(0)[None])[0]  # +qk
    Sq = torch.einsum('nhd,nhe->de', q / s, q / s) / (q.shape[0] * q.shape[1])   # query cov (calib), scaled
    Sk = (kc * s).T @ (kc * s) / kc.shape[0]
    Ske = (kce * s).T @ (kce * s) / kce.shape[0]
    A = sym_sqrt(Sq)
    R = 3.0 * d
    # Hadamard: isotropic error in k' space at rate R: per-coordinate variance tr(Sk)/d -> D = tr(Sq)·(tr Sk/d)·2^{-2R/d}
    D_had = float(torch.trace(Sq)) * float(torch.trace(Ske)) / d * 2 ** (-2 * R / d)
    Sz = A @ Sk.double() @ A; e, U = torch.linalg.eigh(Sz)  # KLT from calib
    Sze = U.T @ (A @ Ske.double() @ A) @ U                 # eval keys in calib's basis: diag used for water-filling
    D_klt = wf(torch.diagonal(Sze), R)
    # values: error weighted by o_proj's columns of the group (sum over query heads of the kv head)
    W = wo.reshape(wo.shape[0], -1, d)  # hidden, heads, d
    Wv = torch.einsum('xhd,xhe->de', W, W).double()
    vc = v[:, 0]; Sv = vc.T @ vc / vc.shape[0]; vce = ve[:, 0]; Sve = (vce.T @ vce / vce.shape[0]).double()
    D_hadv = float(torch.trace(Wv)) * float(torch.trace(Sve)) / d * 2 ** (-2 * R / d)
    B = sym_sqrt(Wv); e2, U2 = torch.linalg.eigh(B @ Sv.double() @ B)
    D_kltv = wf(torch.diagonal(U2.T @ (B @ Sve @ B) @ U2), R)
    print(f'{L:5d}  {0.5 * math.log2(D_had / D_klt):6.2f}        {0.5 * math.log2(D_hadv / D_kltv):6.2f}')

# --- the real quantizers on the eval chunk: weighted MSE, Hadamard+lm3 (keys +qk) against +klt
R = fs.rotation(256)
fs.S = fs.Study(256)
for L in sorted(ev):
    q, k, v, wo = cal[L]
    fs._record(type('M', (), {'o_proj': type('O', (), {'weight': wo})()})(), L, q, k, v)
print('layer  keys: mse had, klt, klt/had ; values: mse had, klt, ratio; coeffs with 0 bits (k, v)')
for L in sorted(ev):
    qe, ke, ve, wo = ev[L]; c = fs.S.calib[L]
    kc = ke - fs.block_mean(ke, 128)
    s = fs.static_scale(c['q2'], c['kc2'])  # (note: kc2 is over 32-token blocks)
    Sq = c['Sq'][0]
    def wmse(e, W): return float(torch.einsum('td,de,te->', e[:, 0], W, e[:, 0])) / e.shape[0]
    kh = fs.grouped(lambda x: fs.lm(x, 3), (kc * s) @ R.T, 256) @ R / s
    tr = fs.klt_transform(L, 'k', True, 3)
    kk = fs.klt_round(kc, tr)
    W = torch.einsum('xhgd,xhge->hde', wo.reshape(wo.shape[0], 1, -1, 256), wo.reshape(wo.shape[0], 1, -1, 256))[0]
    vh = fs.grouped(lambda x: fs.lm(x, 3), ve @ R.T, 256) @ R
    trv = fs.klt_transform(L, 'v', False, 3)
    vk = fs.klt_round(ve, trv)
    a, b = wmse(kh - kc, Sq), wmse(kk - kc, Sq); a2, b2 = wmse(vh - ve, W), wmse(vk - ve, W)
    print(f'{L:5d}  {a:.4g} {b:.4g} {b/a:.2f} ; {a2:.4g} {b2:.4g} {b2/a2:.2f} ; {int((tr[0][3]==0).sum())} {int((trv[0][3]==0).sum())}  maxbits {int(tr[0][3].max())} {int(trv[0][3].max())}')
