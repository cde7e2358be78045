"""Issue 50 (hostile use, round three), items 2 and 6 as Python sees them: reports that keep '+sinkN', clear
refusals (BadParams, ValueError) instead of pybind11 TypeErrors and silently taken inputs, and the CLI's
text files that are not regular files."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import kvq
from kvq import _pairs


def test_key_codec_and_layer_codecs_keep_the_sink_suffix():
    c = kvq.KVCache(n_layers=2, n_kv_heads=1, head_dim=64, key_codec="q8_0+sink2", value_codec="q4_0",
                    layer_codecs=[(None, None), ("q4_0+rot+sink1", "q8_0")])
    assert c.key_codec == "q8_0+sink2"
    assert c.layer_codecs() == [("q8_0+sink2", "q4_0"), ("q4_0+rot+sink1", "q8_0")]
    assert c.config["key_codec"] == "q8_0+sink2"


@pytest.mark.parametrize("tail", [2**31, 2**64, -1, 2**20 + 1, 1.5, "8", True, None])
def test_exact_tail_tokens_out_of_range_or_not_an_integer_is_bad_params(tail):
    with pytest.raises(kvq.BadParams, match=r"exact_tail_tokens must be an integer in 0..1048576"):
        kvq.KVCache(n_layers=1, n_kv_heads=1, head_dim=64, exact_tail_tokens=tail)


def test_exact_tail_tokens_takes_integers_of_any_kind():
    for tail in (0, 5, np.int64(7), 2**20):
        c = kvq.KVCache(n_layers=1, n_kv_heads=1, head_dim=64, exact_tail_tokens=tail)
        assert c.config["exact_tail_tokens"] == int(tail)


@pytest.mark.parametrize("spec, message", [
    ("q8_0/q4_0*99999999999999999999", "at most 65536 layers"),
    ("q8_0/q4_0*3000000000", "at most 65536 layers"),
    ("q8_0/q4_0*40000;q8_0/q4_0*40000", "more than 65536 layers"),
    ("q8_0/q4_0 *3", "without spaces around the pair"),
    ("q8_0/q4_0*\u0663", "ASCII digits"),  # an Arabic-Indic three
    ("q8_0/q4_0*\uff13", "ASCII digits"),  # a fullwidth three
])
def test_per_layer_pair_lists_refuse_what_they_cannot_mean_at_once(spec, message):
    start = time.monotonic()
    with pytest.raises(ValueError, match=message):
        _pairs.layer_pairs(spec, [0] * 3)
    with pytest.raises(ValueError, match=message):
        _pairs.check_spec(spec)
    assert time.monotonic() - start < 1.0


def test_per_layer_pair_lists_still_read_runs():
    assert _pairs.layer_pairs("q8_0/q4_0*2;q4_0/q4_0", [0, 0, 0]) == ["q8_0/q4_0", "q8_0/q4_0", "q4_0/q4_0"]
    with pytest.raises(ValueError, match="names 65536 layers; the model has 3"):
        _pairs.layer_pairs("q8_0/q4_0*65536", [0] * 3)


@pytest.mark.parametrize("option", ["--calib-text", "--text"])
def test_kvq_eval_refuses_a_fifo_for_its_text_files_at_once(tmp_path, option):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading used to block for ever
    text = tmp_path / "t.txt"
    text.write_text("some text")
    args = [sys.executable, "-m", "kvq", "eval", str(tmp_path), "--text", str(text if option != "--text" else fifo)]
    if option == "--calib-text":
        args += ["--key-scales", "calib", "--calib-text", str(fifo)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{option} {fifo} is a FIFO, not a regular file" in r.stderr, r.stderr


def test_kvqcache_key_scales_take_bfloat16_tensors():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import kvq.hf
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    s = torch.full((2, 32), 2.0)
    for dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int32):
        cache = kvq.hf.KVQCache(cfg, "q8_0", "q4_0", key_scales={0: s.to(dtype)})
        assert cache.kvq_caches[0].config["key_scales"] is not None
    with pytest.raises(ValueError, match="must be real"):
        kvq.hf.KVQCache(cfg, "q8_0", "q4_0", key_scales={0: s.to(torch.complex64)})
    with pytest.raises(kvq.BadParams, match="exact_tail_tokens must be an integer"):
        kvq.hf.KVQCache(cfg, "q8_0", "q4_0", exact_tail_tokens=1.5)
