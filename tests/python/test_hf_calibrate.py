"""Calibrated key scales (kvq.hf.key_moments, calibrate_key_scales, KeyScalesByFormat, kvq eval --key-scales
calib): the moments are those of the queries and keys attention sees (checked against an attention function of
our own recording them), the scales are (E[q²] / E[k²])^¼ with a geometric mean of 1, a centered key format
gets the moments of the centered keys, and the scales lower a rotated 4-bit codec's score error where the
queries weigh channels unevenly."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import kvq  # noqa: E402
import kvq.hf  # noqa: E402
from kvq import cli  # noqa: E402

from test_hf import prompt, tiny  # noqa: E402
from test_hf_eval import tiny_dir  # noqa: E402,F401  (the fixture)

RECORD = "kvq_test_record"


def recorded_qk(model, ids):
    """Per layer the (tokens, heads, d) queries and (tokens, kv heads, d) keys of one eager forward, as an
    attention function receives them (after RoPE and the q/k norms)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    seen = {}

    def attend(module, query, key, value, attention_mask, scaling=None, **kw):
        seen[module.layer_idx] = (query[0].transpose(0, 1).double(), key[0].transpose(0, 1).double())
        fn = AttentionInterface._global_mapping["sdpa"]
        return fn(module, query, key, value, attention_mask, scaling=scaling, **kw)

    AttentionInterface.register(RECORD, attend)
    AttentionMaskInterface.register(RECORD, sdpa_mask)
    model.set_attn_implementation(RECORD)
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        model.set_attn_implementation("kvq")
    return seen


def test_moments_are_those_attention_sees():
    model = tiny("gemma3")
    ids = prompt(70)  # two full blocks of 32 and 6 tokens more
    seen = recorded_qk(model, ids)
    m = kvq.hf.key_moments(model, ids[0])
    cfg = model.config
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    for layer, (q, k) in seen.items():
        t, h, d = q.shape
        q2 = (q**2).reshape(t, -1, g, d).mean(dim=(0, 2)).numpy()
        np.testing.assert_allclose(m.q2[layer], q2, rtol=1e-5)
        np.testing.assert_allclose(m.k2[layer], (k**2).mean(dim=0).numpy(), rtol=1e-5)
        blocks = k[:64].reshape(2, 32, -1, d)
        kc2 = ((blocks - blocks.mean(dim=1, keepdim=True)) ** 2).mean(dim=(0, 1)).numpy()
        np.testing.assert_allclose(m.kc2[layer], kc2, rtol=1e-5)
        assert m.tokens[layer] == 70 and m.centered_tokens[layer] == 64
    # A second prompt adds to the same moments: the means over both.
    m2 = kvq.hf.key_moments(model, ids[0, :40], moments=kvq.hf.key_moments(model, ids[0, 40:]))
    a, b = kvq.hf.key_moments(model, ids[0, :40]), kvq.hf.key_moments(model, ids[0, 40:])
    np.testing.assert_allclose(m2.q2[0], (a.q2[0] * 40 + b.q2[0] * 30) / 70, rtol=1e-10)
    assert b.kc2[0] is None  # 30 tokens: no full block, so the centered moments are the first 40's
    np.testing.assert_allclose(m2.kc2[0], a.kc2[0], rtol=1e-10)
    with pytest.raises(ValueError, match="one sequence"):
        kvq.hf.key_moments(model, ids.repeat(2, 1))


def test_scales_follow_the_definition_and_the_format():
    model = tiny("gemma3")
    ids = prompt(70)
    m = kvq.hf.key_moments(model, ids)
    for centered, k2 in ((True, m.kc2), (False, m.k2)):
        scales = kvq.hf.calibrate_key_scales(model, ids, centered=centered)
        assert len(scales) == model.config.num_hidden_layers
        for l, s in enumerate(scales):
            assert s.dtype == np.float32 and s.shape == (model.config.num_key_value_heads, model.config.head_dim)
            np.testing.assert_allclose(np.exp(np.log(s.astype(np.float64)).mean(axis=1)), 1.0, rtol=1e-5)
            ratio = (m.q2[l] / k2[l]) ** 0.25
            np.testing.assert_allclose(s / s[:, :1], ratio / ratio[:, :1], rtol=1e-4)
    by_format = kvq.hf.KeyScalesByFormat(m, "test")
    picked = by_format(["q4_0+rot+center", "q4_0+rot", "f32"])
    assert picked[0] is by_format.centered[0] and picked[1] is by_format.plain[1] and picked[2] is by_format.plain[2]
    assert not np.allclose(by_format.centered[0], by_format.plain[0])
    with pytest.raises(ValueError, match="3 layers"):
        by_format(["q4_0"])
    with pytest.raises(ValueError, match="too short"):
        kvq.hf.calibrate_key_scales(model, ids[:, :20], centered=True)  # no full block to center


def test_scales_lower_the_score_error_of_rotated_keys():
    # Queries that weigh 16 of 128 channels, keys of equal spread: the scales move q4_0+rot's rounding error
    # to the channels the queries do not read. Scores q·k are kept exactly (q ⊘ s)·(k ⊙ s).
    rng = np.random.default_rng(5)
    d, n = 128, 2048
    qw = np.full(d, 0.05)
    qw[rng.choice(d, 16, replace=False)] = 3.0
    q = (rng.standard_normal((n, 1, d)) * qw).astype(np.float32)
    k = (rng.standard_normal((n, 1, d)) + rng.standard_normal(d)).astype(np.float32)
    m = kvq.hf.KeyMoments(1, 32)
    m.add(0, q, k)
    s = m.scales(False)[0][0]

    def score_error(scale):
        codes = kvq.quantize(k[:, 0] * scale, "q4_0+rot")
        kq = np.asarray(kvq.dequantize(codes, "q4_0+rot", d)) / scale
        return float(np.mean(((q[:, 0] * (kq - k[:, 0])).sum(-1)) ** 2))

    plain, scaled = score_error(np.ones(d, np.float32)), score_error(s)
    assert scaled < plain / 3, (plain, scaled)


def test_cli_calibrated_scales(tiny_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "calib.json"
    text = tiny_dir / "text.txt"
    rc = cli.main(["eval", str(tiny_dir), "--text", str(text), "--key-scales", "calib", "--calib-text", str(text),
                   "--pairs", "q4_0+rot/q4_0,q4_0+rot+center/q4_0", "--ctx", "64", "--max-chunks", "1",
                   "--format", "json", "--output", str(out), "--no-progress"])
    assert rc == 0
    got = json.loads(out.read_text())
    assert got["info"]["cache_config"]["key_scales"] == f"calibrated on 64 tokens of {text}"
    assert [r["pair"] for r in got["rows"]][1:] == ["q4_0+rot/q4_0", "q4_0+rot+center/q4_0"]
    for args in (["--key-scales", "calib"], ["--calib-text", str(text)]):
        rc = cli.main(["eval", str(tiny_dir), "--text", str(text), "--ctx", "64", "--no-progress", *args])
        assert rc == 2 and "go together" in capsys.readouterr().err
