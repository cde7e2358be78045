"""KVQCache(key_scales=...): keys stored as k ⊙ s, queries attending as q ⊘ s give the same scores (an f32 cache
gives transformers' logits with or without them), the scales reach the quantized keys (q4_0 logits move), bad
scales are refused before anything is stored, and key_scales_from_norms reads q_norm and k_norm."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import kvq.hf  # noqa: E402

from test_hf import VOCAB, cache_kw, prompt, tiny  # noqa: E402


def logits(model, cache, ids):
    model.set_attn_implementation("kvq")
    with torch.no_grad():
        return model(ids, use_cache=True, **cache_kw(model, cache)).logits


def random_scales(model, seed):
    rng = np.random.default_rng(seed)
    cfg = model.config
    return {l: np.exp(rng.normal(0, 0.7, (cfg.num_key_value_heads, cfg.head_dim))).astype(np.float32)
            for l in range(cfg.num_hidden_layers)}


def test_scales_keep_the_scores_and_reach_the_codes():
    model = tiny("gemma3")
    with torch.no_grad():  # norms of their own, so that key_scales_from_norms gives channels different weights
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_(0, 0.5)
            layer.self_attn.k_norm.weight.normal_(0, 0.5)
    ids = prompt(40)
    cfg = model.config
    plain = logits(model, kvq.hf.KVQCache(cfg, "f32", "f32"), ids)
    for scales in (random_scales(model, 1), kvq.hf.key_scales_from_norms(model)):
        scaled = logits(model, kvq.hf.KVQCache(cfg, "f32", "f32", key_scales=scales), ids)
        assert torch.allclose(plain, scaled, atol=2e-4, rtol=1e-4)
        q_plain = logits(model, kvq.hf.KVQCache(cfg, "q4_0", "f32"), ids)
        q_scaled = logits(model, kvq.hf.KVQCache(cfg, "q4_0", "f32", key_scales=scales), ids)
        assert (q_plain - q_scaled).abs().max() > 1e-3  # the rounding moved: the keys were stored scaled
    # A list with None for unscaled layers, and torch tensors, are taken too.
    s = random_scales(model, 2)
    listed = [None, torch.from_numpy(s[1]), None]
    mixed = logits(model, kvq.hf.KVQCache(cfg, "f32", "f32", key_scales=listed), ids)
    assert torch.allclose(plain, mixed, atol=2e-4, rtol=1e-4)


def test_key_scales_from_norms_pairs_the_rope_channels():
    model = tiny("gemma3")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_(0, 0.5)
            layer.self_attn.k_norm.weight.normal_(0, 0.5)
    scales = kvq.hf.key_scales_from_norms(model)
    cfg = model.config
    assert len(scales) == cfg.num_hidden_layers
    d = cfg.head_dim
    for l, s in enumerate(scales):
        attn = model.model.layers[l].self_attn
        gq = 1 + attn.q_norm.weight.detach().double().numpy()
        gk = 1 + attn.k_norm.weight.detach().double().numpy()
        pair = lambda g2: 0.5 * (g2[: d // 2] + g2[d // 2:])
        want = (pair(gq**2) / pair(gk**2)) ** 0.25
        want = want / np.exp(np.mean(np.log(want)))
        assert s.shape == (cfg.num_key_value_heads, d)
        np.testing.assert_allclose(s[:, : d // 2], np.broadcast_to(want, (cfg.num_key_value_heads, d // 2)), rtol=1e-6)
        np.testing.assert_array_equal(s[:, : d // 2], s[:, d // 2:])
    with pytest.raises(ValueError, match="no q_norm and k_norm"):
        kvq.hf.key_scales_from_norms(tiny("llama"))


@pytest.mark.parametrize("bad, match", [
    ({5: np.ones((2, 32))}, "names layer 5"),
    ({0: np.ones((2, 16))}, "shape"),
    ({0: np.zeros((2, 32))}, "positive and finite"),
    ({0: np.full((2, 32), np.inf)}, "positive and finite"),
    ({0: np.full((2, 32), 1e-320)}, "positive and finite"),
    ({0: -np.ones((2, 32))}, "positive and finite"),
    ({1.5: np.ones((2, 32))}, "integer"),
])
def test_bad_scales_are_refused(bad, match):
    model = tiny("llama")
    with pytest.raises(ValueError, match=match):
        kvq.hf.KVQCache(model.config, "q4_0", "q4_0", key_scales=bad)
