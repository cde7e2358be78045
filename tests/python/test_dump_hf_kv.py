"""kvq.dump_hf_kv (kvq-dump-hf-kv, scripts/dump_hf_kv.py): the dump's files have the shapes kvq reads and hold what the model's attention
used. Always tested with a fake model object (numpy, no torch); with a tiny randomly initialized Llama
when torch and transformers are installed (they are not kvq dependencies, so CI may skip that test)."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kvq

SCRIPT = Path(__file__).resolve().parents[2] / "python" / "kvq" / "dump_hf_kv.py"
spec = importlib.util.spec_from_file_location("dump_hf_kv", SCRIPT)
dump_hf_kv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dump_hf_kv)


def apply_rotary_pos_emb(q, k, cos, sin):
    """Stands in for transformers' function of this name: the recorder wraps it on this module."""
    return q * cos - q[..., ::-1] * sin, k * cos - k[..., ::-1] * sin


class FakeAttention:
    scaling = 0.125


class FakeModel:
    """Looks like a transformers causal LM to dump(): call with input_ids and use_cache, get past_key_values."""

    def __init__(self, layers=3, heads=4, kv_heads=2, head_dim=16, cache_form="layers", windows=None):
        self.layers, self.heads, self.kv_heads, self.head_dim = layers, heads, kv_heads, head_dim
        self.cache_form, self.windows = cache_form, windows or [None] * layers
        self.queries = []  # what attention saw, for the test to compare

    def modules(self):
        return [self, FakeAttention()]

    def __call__(self, input_ids, use_cache):
        assert use_cache
        t = input_ids.shape[1]
        rng = np.random.default_rng(1)
        cos = np.cos(np.arange(t, dtype=np.float32))[:, None]
        sin = np.sin(np.arange(t, dtype=np.float32))[:, None]
        keys, values = [], []
        for layer in range(self.layers):
            q = rng.standard_normal((1, self.heads, t, self.head_dim)).astype(np.float32)
            k = rng.standard_normal((1, self.kv_heads, t, self.head_dim)).astype(np.float32)
            v = rng.standard_normal((1, self.kv_heads, t, self.head_dim)).astype(np.float32)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)  # looked up in this module at call time
            self.queries.append(q)
            w = self.windows[layer]
            keys.append(k[:, :, -w:] if w else k)
            values.append(v[:, :, -w:] if w else v)
        if self.cache_form == "layers":
            past = SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in zip(keys, values)])
        elif self.cache_form == "key_cache":
            past = SimpleNamespace(key_cache=keys, value_cache=values)
        else:
            past = tuple(zip(keys, values))
        return SimpleNamespace(past_key_values=past)


@pytest.mark.parametrize("cache_form", ["layers", "key_cache", "tuple"])
def test_dump_with_a_fake_model_writes_what_attention_used(tmp_path, cache_form):
    model = FakeModel(cache_form=cache_form)
    ids = np.zeros((1, 24), dtype=np.int64)
    info = dump_hf_kv.dump(model, ids, tmp_path, dtype="float32", meta={"model": "fake"})
    assert info["layers"] == 3 and info["tokens"] == 24 and info["heads"] == 4 and info["scale"] == 0.125
    k, q = np.load(tmp_path / "k.npy"), np.load(tmp_path / "q.npy")
    assert k.shape == (3, 24, 2, 16) and q.shape == (3, 24, 4, 16)
    np.testing.assert_array_equal(q[1, 5, 3], model.queries[1][0, 3, 5])
    assert json.loads((tmp_path / "meta.json").read_text())["model"] == "fake"
    d = kvq.dataset(f"npy:{tmp_path}")
    assert (d.layers, d.tokens, d.kv_heads, d.q_heads, d.head_dim) == (3, 24, 2, 4, 16)
    np.testing.assert_array_equal(d.q[1, -1], q[1, -1])  # the last token is the last decode query
    # The wrapper is removed again.
    assert dump_hf_kv.sys.modules[__name__].apply_rotary_pos_emb is apply_rotary_pos_emb


def test_dump_cuts_sliding_window_layers_to_the_common_tokens(tmp_path):
    notes = []
    model = FakeModel(windows=[None, 10, None])
    info = dump_hf_kv.dump(model, np.zeros((1, 24)), tmp_path, note=notes.append)
    assert info["tokens"] == 10
    assert np.load(tmp_path / "k.npy").dtype == np.float16
    assert np.load(tmp_path / "q.npy").shape == (3, 10, 4, 16)
    assert "sliding windows" in notes[0]


def test_dump_without_rope_function_leaves_queries_out(tmp_path):
    class Plain:
        def __call__(self, input_ids, use_cache):
            k = np.ones((1, 2, 8, 16), dtype=np.float32)
            return SimpleNamespace(past_key_values=((k, k),))

    (tmp_path / "q.npy").write_bytes(b"stale")
    notes = []
    info = dump_hf_kv.dump(Plain(), np.zeros((1, 8)), tmp_path, note=notes.append)
    assert "heads" not in info and not (tmp_path / "q.npy").exists()
    assert "synthesize" in notes[0]
    with pytest.raises(ValueError, match="no past_key_values"):
        dump_hf_kv.dump(lambda input_ids, use_cache: SimpleNamespace(), np.zeros((1, 8)), tmp_path)


def test_dump_tiny_llama_matches_its_attention(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 40))
    info = dump_hf_kv.dump(model, ids, tmp_path, dtype="float32")
    assert (info["layers"], info["tokens"], info["kv_heads"], info["heads"], info["head_dim"]) == (2, 40, 2, 4, 16)
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    k, q = np.load(tmp_path / "k.npy"), np.load(tmp_path / "q.npy")
    for layer in range(2):
        for head in range(4):
            scores = k[layer, :, head // 2] @ q[layer, -1, head] * info["scale"]  # the last token sees all 40
            w = np.exp(scores - scores.max())
            np.testing.assert_allclose(w / w.sum(), attentions[layer][0, head, -1].numpy(), atol=1e-5)
    result = kvq.sweep([f"npy:{tmp_path}"], ["f32/f32", "q8_0/q4_0"], timing=False)
    assert result.rows[0]["kl_mean"] < 1e-6


def test_dump_tiny_gemma3_keeps_sliding_layers_whole_and_writes_windows(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                           query_pre_attn_scalar=24, sliding_window=8, max_position_embeddings=128,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    config._attn_implementation = "eager"
    model = transformers.Gemma3ForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 30))
    notes = []
    info = dump_hf_kv.dump(model, ids, tmp_path, dtype="float32", note=notes.append)
    assert info["tokens"] == 30 and info["windows"] == [8, 0, 8] and not notes  # nothing cut
    assert info["scale"] == pytest.approx(24 ** -0.5)
    assert json.loads((tmp_path / "meta.json").read_text())["windows"] == [8, 0, 8]
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    k, q = np.load(tmp_path / "k.npy"), np.load(tmp_path / "q.npy")
    assert k.shape == (3, 30, 1, 32) and q.shape == (3, 30, 4, 32)
    for layer, window in enumerate([8, 0, 8]):
        seen = slice(30 - window, 30) if window else slice(0, 30)
        for head in range(4):
            scores = k[layer, seen, 0] @ q[layer, -1, head] * info["scale"]
            w = np.exp(scores - scores.max())
            np.testing.assert_allclose(w / w.sum(), attentions[layer][0, head, -1, seen].numpy(), atol=1e-5)


def test_default_text_is_a_real_long_text_not_a_repeated_paragraph():
    """Without --text-file the dump runs the Python Language Reference's topics (pydoc_data, in every CPython):
    far more than 2048 tokens of distinct text (the old default was one paragraph repeated)."""
    text = dump_hf_kv.default_text()
    assert len(text) > 400_000
    lines = [l for l in text.splitlines() if l.strip()]
    assert len(set(lines)) > 0.6 * len(lines)  # the topics share some lines (rules, grammar); the old default had 4
    assert "The \"assert\" statement" in text[:200]


def test_installed_as_a_console_script():
    """pip install puts kvq-dump-hf-kv beside the interpreter; --help runs without torch being imported."""
    import subprocess
    exe = Path(sys.executable).parent / "kvq-dump-hf-kv"
    if not exe.exists():
        pytest.skip("kvq is not installed into this interpreter's environment (run from build/venv)")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--text-file" in out and "pydoc_data" in out
