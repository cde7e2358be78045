"""The exact tail from Python (kvq.KVCache exact_tail_tokens=, kvq.hf.KVQCache's cache keywords, the bits
counted over a context, and kvq eval's --exact-tail)."""

import numpy as np
import pytest

import kvq

KV, H, D = 2, 4, 64


def rows(n, seed):
    return np.random.default_rng(seed).standard_normal((n, KV, D), dtype=np.float32)


def cache(k="q4_0", v="q4_0", **kw):
    return kvq.KVCache(1, KV, D, n_heads=H, key_codec=k, value_codec=v, block_tokens=8, **kw)


def test_tail_tokens_are_read_exactly():
    # 20 tokens, blocks of 8, a tail of 16: no block is all older than 16 tokens, so nothing is quantized.
    k, v, q = rows(20, 1), rows(20, 2), np.random.default_rng(3).standard_normal((H, D), dtype=np.float32)
    outs = {}
    for name, c in {"tail": cache(exact_tail_tokens=16), "none": cache(), "f32": cache("f32", "f32")}.items():
        c.add_sequence()
        c.append(0, k, v)
        outs[name] = c.attend(0, q)
    np.testing.assert_allclose(outs["tail"], outs["f32"], rtol=1e-5, atol=1e-6)
    assert np.abs(outs["none"] - outs["f32"]).max() > 1e-3


def test_config_save_load_and_bytes(tmp_path):
    c = cache(exact_tail_tokens=16)
    assert c.config["exact_tail_tokens"] == 16
    s = c.add_sequence()
    c.append(0, rows(30, 4), rows(30, 5), seq=s)
    # Three blocks' rows (ceil((16 + 8 - 1) / 8)) of keys and values, f32, in the pool's reservation.
    assert c.pool_stats()["bytes_reserved"] == 3 * 2 * KV * 8 * D * 4
    path = tmp_path / "tail.kvq"
    c.save(path)
    loaded = kvq.KVCache.load(path)
    assert loaded.config["exact_tail_tokens"] == 16
    q = np.ones((H, D), dtype=np.float32)
    assert np.array_equal(loaded.attend(0, q, seq=0), c.attend(0, q, seq=s))
    sealed = c.bytes_per_token(0)  # the sealed format: 2 kv heads x 2 x 36 bytes
    assert sealed == 144
    assert c.average_bytes_per_token(0, 64) == pytest.approx((48 * 144 + 16 * 2 * KV * D * 4) / 64)
    with pytest.raises(ValueError, match="exact_tail_tokens"):
        cache(exact_tail_tokens=-1)
    with pytest.raises(ValueError, match="exact_tail_tokens"):
        cache(exact_tail_tokens=8, seal="on_append")


def test_hf_cache_takes_the_tail_and_counts_its_bits():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import kvq.hf

    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    plain = kvq.hf.KVQCache(cfg, "q4_0", "q4_0")
    tail = kvq.hf.KVQCache(cfg, "q4_0", "q4_0", exact_tail_tokens=128)
    assert tail.kvq_caches[0].config["exact_tail_tokens"] == 128
    # q4_0: 4.5 bits; a tail of 128 f32 tokens over a context of 1024: 1/8 of the tokens at 32 bits.
    assert plain.bits_per_value(context=1024) == pytest.approx((4.5, 4.5))
    assert tail.bits_per_value() == pytest.approx((4.5, 4.5))
    assert tail.bits_per_value(context=1024) == pytest.approx((4.5 * 7 / 8 + 32 / 8,) * 2)
    assert tail.bits_per_value(context=64) == pytest.approx((32.0, 32.0))


def test_eval_cli_takes_exact_tail():
    from kvq import cli

    parser = cli.build_parser()
    args = parser.parse_args(["eval", "gemma3-270m", "--text", "x.txt", "--exact-tail", "128"])
    assert args.exact_tail == 128
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "gemma3-270m", "--text", "x.txt", "--exact-tail", "-1"])
