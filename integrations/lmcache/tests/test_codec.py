"""The kvq frame of a chunk, without storage: kvq's bytes, exact sizes, and every bad frame refused."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import LMCACHE_MISSING

pytest.importorskip("lmcache", reason=LMCACHE_MISSING)

import kvq  # noqa: E402
from conftest import kv_chunk  # noqa: E402
from kvq_lmcache import ChunkCodec, FrameRejected, Geometry  # noqa: E402
from kvq_lmcache.frame import HEADER, digest16  # noqa: E402

KEY = digest16(b"chunk-0")
SPECS = ["q8_0/q4_0", "q8_0/q8_0", "q4_0+rot+center/q4_0", "chan3/polar:budget=3", "turbo3.5/turbo3.5",
         "q8_0/q4_0*2;chan3/turbo3.5;q5_0+rot+center/iq4_nls+rot"]


def encode(codec, kv, model="m", key=KEY):
    g = Geometry(kv.shape[1], kv.shape[2], kv.shape[3], kv.dtype)
    out = np.zeros(codec.frame_bytes(g), np.uint8)
    n = codec.encode(kv, out, model_name=model, key_digest=key)
    return out, n


def decode(codec, frame, like, model="m", key=KEY):
    kv = torch.full_like(like, 7.0)
    codec.decode(frame, kv, model_name=model, key_digest=key)
    return kv


@pytest.mark.parametrize("pair", ["q8_0/q4_0", "q4_0/q4_1", "q5_0/q8_0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ggml_formats_are_kvq_quantize_bytes(pair, dtype):
    kv = kv_chunk(layers=3, tokens=40, dtype=dtype)
    codec = ChunkCodec(pair, head_dim=128)
    frame, _ = encode(codec, kv)
    at = HEADER.size + len(pair)
    for side, spec in enumerate(pair.split("/")):
        for layer in range(3):
            want = kvq.quantize(kv[side, layer].float().reshape(40, 2, 128).numpy(), spec).tobytes()
            assert frame[at : at + len(want)].tobytes() == want, (side, layer)
            at += len(want)
    # and they decode to kvq.dequantize's values, in the chunk's dtype
    back = decode(codec, frame, kv)
    want_k = kvq.dequantize(kvq.quantize(kv[0].float().reshape(3, 40, 2, 128).numpy(), pair.split("/")[0]),
                            pair.split("/")[0], 128)
    assert torch.equal(back[0], torch.from_numpy(want_k).reshape(3, 40, 256).to(dtype))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("tokens", [256, 77])
def test_frame_is_exactly_the_estimate_and_round_trips(spec, tokens):
    kv = kv_chunk(layers=4, tokens=tokens)
    codec = ChunkCodec(spec, head_dim=128)
    frame, n = encode(codec, kv)
    assert n == frame.size
    back = decode(codec, frame, kv)
    rel = ((back.float() - kv.float()).pow(2).mean() / kv.float().pow(2).mean()).item()
    assert rel < 0.06, rel  # 3-bit codes on N(0,1) rows: ~0.04


def test_sizes_meet_the_issue_targets():
    g = Geometry(18, 256, 256, torch.bfloat16)  # Gemma 3 270M: 18 layers, 1 kv head of 256
    bf16 = 2 * 18 * 256 * 256 * 2
    assert ChunkCodec("q8_0/q4_0", head_dim=256).frame_bytes(g) <= 0.41 * bf16
    assert ChunkCodec("q4_0+rot+center/q4_0", head_dim=256, block_tokens=64).frame_bytes(g) <= 0.29 * bf16
    assert ChunkCodec("chan3/polar:budget=3", head_dim=256).frame_bytes(g) <= 0.23 * bf16


def test_per_channel_keys_are_within_half_a_step():
    kv = kv_chunk(layers=1, tokens=64, dtype=torch.float32)
    codec = ChunkCodec("chan4/q8_0", head_dim=128, block_tokens=32)
    back = decode(codec, encode(codec, kv)[0], kv)
    k = kv[0, 0].reshape(2, 32, 256)
    step = (k.amax(1) - k.amin(1)) / 15
    err = (back[0, 0].reshape(2, 32, 256) - k).abs()
    assert (err <= step[:, None] / 2 * 1.01 + 1e-3).all()


def test_every_bad_frame_is_refused_and_leaves_the_chunk_untouched():
    kv = kv_chunk(layers=2, tokens=64)
    codec = ChunkCodec("q8_0/q4_0", head_dim=128, fingerprint="gemma-3-270m@rev1")
    frame, _ = encode(codec, kv)
    rng = np.random.default_rng(1)
    cases = {}
    for i, pos in enumerate([0, 9, 20, HEADER.size - 1, HEADER.size + 5, frame.size // 2, frame.size - 1]):
        bad = frame.copy()
        bad[pos] ^= np.uint8(1 << int(rng.integers(8)))
        cases[f"bit flip at {pos}"] = (bad, codec, KEY)
    cases["truncated"] = (np.concatenate([frame[:-100], np.zeros(100, np.uint8)]), codec, KEY)
    cases["short buffer"] = (frame[:50], codec, KEY)
    cases["zeros"] = (np.zeros_like(frame), codec, KEY)
    cases["wrong key"] = (frame, codec, digest16(b"chunk-1"))
    cases["other model"] = (frame, ChunkCodec("q8_0/q4_0", head_dim=128, fingerprint="llama-3-8b"), KEY)
    cases["other format"] = (frame, ChunkCodec("q8_0/q8_0", head_dim=128, fingerprint="gemma-3-270m@rev1"), KEY)
    for name, (bad, reader, key) in cases.items():
        target = torch.full_like(kv, 7.0)
        with pytest.raises(FrameRejected):
            reader.decode(bad, target, model_name="m", key_digest=key)
        assert (target == 7.0).all(), name


def test_fingerprint_defaults_to_the_keys_model_name():
    kv = kv_chunk(layers=1, tokens=32)
    codec = ChunkCodec("q8_0/q4_0", head_dim=128)
    frame, _ = encode(codec, kv, model="org/model-a")
    with pytest.raises(FrameRejected, match="other model"):
        decode(codec, frame, kv, model="org/model-b")


def test_encrypted_frames_need_the_key():
    pytest.importorskip("cryptography")
    kv = kv_chunk(layers=2, tokens=32)
    codec = ChunkCodec("q8_0/q4_0", head_dim=128, encryption_key=bytes(range(32)))
    frame, n = encode(codec, kv)
    plain_n = encode(ChunkCodec("q8_0/q4_0", head_dim=128), kv)[1]
    assert n == plain_n + 28  # nonce and tag
    assert torch.equal(decode(codec, frame, kv), decode(ChunkCodec("q8_0/q4_0", head_dim=128), encode(ChunkCodec("q8_0/q4_0", head_dim=128), kv)[0], kv))
    with pytest.raises(FrameRejected, match="not authentic"):
        decode(ChunkCodec("q8_0/q4_0", head_dim=128, encryption_key=bytes(32)), frame, kv)
    with pytest.raises(FrameRejected, match="flags"):
        decode(ChunkCodec("q8_0/q4_0", head_dim=128), frame, kv)


def test_one_codec_from_many_threads():
    codec = ChunkCodec("q8_0/q4_0*2;chan3/turbo3.5*2", head_dim=128)
    chunks = [kv_chunk(layers=4, tokens=64, seed=i) for i in range(8)]
    want = [encode(codec, c, key=digest16(i))[0] for i, c in enumerate(chunks)]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                frame, _ = encode(codec, chunks[i], key=digest16(i))
                assert np.array_equal(frame[: HEADER.size], want[i][: HEADER.size])
                decode(codec, frame, chunks[i], key=digest16(i))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
