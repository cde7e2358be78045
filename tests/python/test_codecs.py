"""The codec table from Python: info, round trips, ggml byte identity, and what bad input gets."""

import numpy as np
import pytest

import kvq
from conftest import DATA

# Relative RMSE of a round trip on N(0, 1) rows of 128 values: about 1.3x what the format gives
# (measured: f16 2.1e-4, bf16 1.7e-3, q8_0 0.0054, q4_0 0.087, q4_1 0.079, q5_0 0.043, q5_1 0.038).
ROUNDTRIP_BOUND = {"f32": 0.0, "f16": 3e-4, "bf16": 2.2e-3, "q8_0": 0.007, "q4_0": 0.11, "q4_1": 0.1,
                   "q5_0": 0.055, "q5_1": 0.05}


def generic_bound(bits):
    """For the other codecs (tested closely in C++): what scalar quantizers reach, 1.5-4.5 x 2^-bits
    (polar 2.6, turbo ~1.7, turbo*_qjl ~4.4), and always better than storing nothing (error 1)."""
    return min(5 * 2.0 ** -bits, 0.9)


SPECS = [name + suffix for name in kvq.codecs() for suffix in ("", "+rot")]
# The codecs whose bytes are a ggml type's (the registry's ggml_type column), but f32: ggml's f32 is the
# float itself, with no oracle file.
GGML_CODECS = [name for name in kvq.codecs() if kvq.codec_info(name)["ggml_type"] >= 0 and name != "f32"]


def relative_rmse(y, x):
    return float(np.sqrt(np.sum((y - x) ** 2) / np.sum(x ** 2)))


def test_the_table_lists_the_ggml_codecs_and_reports_honest_sizes(ggml_data):
    # The rows with a ggml type are those ggml's oracle has bytes of, and f32.
    manifest, _ = ggml_data
    assert sorted(GGML_CODECS) == sorted(manifest["types"])
    assert kvq.codec_info("f32")["ggml_type"] >= 0
    # One reader per ggml type (the ggml_layout row, named as ggml names the type); a codec that writes a
    # type's bytes without being its reader (iq4_nls) writes rows of the reader's size.
    readers = {}
    for name in kvq.codecs():
        info = kvq.codec_info(name)
        assert not (info["rotates"] and info["ggml_type"] >= 0)
        if info["ggml_layout"]:
            assert info["ggml_type"] >= 0 and info["ggml_type"] not in readers
            readers[info["ggml_type"]] = name
    for name in GGML_CODECS:
        info = kvq.codec_info(name)
        assert info["row_bytes"] == kvq.codec_info(readers[info["ggml_type"]])["row_bytes"]
    q8 = kvq.codec_info("q8_0")
    assert (q8["block"], q8["bytes_per_block"], q8["row_bytes"], q8["bits_per_value"]) == (32, 34, 136, 8.5)
    q4 = kvq.codec_info("q4_0", head_dim=64)
    assert (q4["block"], q4["bytes_per_block"], q4["row_bytes"], q4["bits_per_value"]) == (32, 18, 36, 4.5)
    assert q4["ggml_layout"] and not q4["rotated"] and "nibbles" in q4["layout"]
    rot = kvq.codec_info("q4_0+rot")
    assert rot["rotated"] and rot["base"] == "q4_0" and not rot["ggml_layout"] and rot["ggml_type"] == -1
    for spec in SPECS:
        info = kvq.codec_info(spec, 256)
        assert info["bits_per_value"] == pytest.approx(8 * info["row_bytes"] / 256)


@pytest.mark.parametrize("spec", SPECS)
def test_round_trip_error_is_within_the_codec_bound(spec, rng):
    x = rng.standard_normal((3, 40, 128), dtype=np.float32)
    codes = kvq.quantize(x, spec)
    info = kvq.codec_info(spec, 128)
    assert codes.dtype == np.uint8 and codes.shape == (3, 40, info["row_bytes"])
    y = kvq.dequantize(codes, spec, 128)
    assert y.dtype == np.float32 and y.shape == x.shape
    base = spec.removesuffix("+rot")
    assert relative_rmse(y, x) <= ROUNDTRIP_BOUND.get(base, generic_bound(info["bits_per_value"])) + 1e-6
    # Rows are independent: quantizing one row alone gives the same bytes.
    np.testing.assert_array_equal(kvq.quantize(x[1, 7], spec), codes[1, 7])


@pytest.mark.parametrize("name", GGML_CODECS)
def test_bytes_and_values_equal_ggml_on_its_oracle_rows(name, ggml_data):
    manifest, x = ggml_data
    t = manifest["types"][name]
    expected = np.fromfile(DATA / t["bytes"], dtype=np.uint8).reshape(len(x), t["row_bytes"])
    # The oracle has rows at 1e20 scale that overflow fp16 fields: kvq stores them only when told to.
    if name != "bf16":  # bf16 holds 1e20
        with pytest.raises(ValueError, match="beyond the codec's range"):
            kvq.quantize(x, name)
    codes = kvq.quantize(x, name, nan_policy="propagate")
    differs = codes != expected
    if name == "iq4_nl":
        # Blocks below ggml's eps store d = 0, with codes ggml leaves as its buffer held them (indeterminate;
        # kvq writes zeros): only their scale is compared.
        blocks = expected.reshape(len(x), -1, 18)
        zero_scale = (blocks[:, :, 0] == 0) & ((blocks[:, :, 1] & 0x7F) == 0)
        differs = differs.reshape(blocks.shape)
        differs[:, :, 2:] &= ~zero_scale[:, :, None]
        differs = differs.reshape(codes.shape)
    mismatched = np.flatnonzero(differs.any(axis=1))
    assert mismatched.size == 0, f"{name}: rows {mismatched[:10]} differ from ggml's bytes"
    values = kvq.dequantize(expected, name, x.shape[1])
    if (DATA / t["dequant"]).exists():
        np.testing.assert_array_equal(values, np.fromfile(DATA / t["dequant"], dtype="<f4").reshape(x.shape))
    if name == "f16":  # numpy's float16 is IEEE binary16 too (rows 4 and 7 overflow to inf, as in ggml)
        with np.errstate(over="ignore"):
            x16 = x.astype("<f2")
        np.testing.assert_array_equal(codes.view("<f2"), x16)
        np.testing.assert_array_equal(values, x16.astype(np.float32))


def test_float16_input_is_accepted_and_equals_its_float32_value(rng):
    x16 = rng.standard_normal((5, 64)).astype(np.float16)
    np.testing.assert_array_equal(kvq.quantize(x16, "q8_0"), kvq.quantize(x16.astype(np.float32), "q8_0"))


def test_rotation_depends_on_the_seed_and_round_trips_with_it(rng):
    x = rng.standard_normal((8, 128), dtype=np.float32)
    a, b = kvq.quantize(x, "q4_0+rot"), kvq.quantize(x, "q4_0+rot", seed=7)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, kvq.quantize(x, "q4_0+rot", seed=kvq.DEFAULT_SEED))
    assert relative_rmse(kvq.dequantize(b, "q4_0+rot", 128, seed=7), x) < ROUNDTRIP_BOUND["q4_0"]
    assert relative_rmse(kvq.dequantize(b, "q4_0+rot", 128), x) > 0.5  # wrong seed: wrong basis


def test_empty_batches_give_empty_results():
    codes = kvq.quantize(np.zeros((0, 4, 64), np.float32), "q8_0")
    assert codes.shape == (0, 4, 68)
    assert kvq.dequantize(codes, "q8_0", 64).shape == (0, 4, 64)


@pytest.mark.parametrize("bad, got", [
    (np.zeros((4, 128), np.int32), "got a int32 array of shape (4, 128)"),
    (np.zeros((4, 128), np.complex64), "got a complex64 array of shape (4, 128)"),
    (np.zeros((4, 128), np.longdouble), "got a float128 array of shape (4, 128)"),
    (np.zeros((4, 256), np.int8)[:, ::2], "got a non-contiguous int8 array of shape (4, 128)"),
    (np.float32(1.0), "got an object of type float32"),
    ([0.0] * 128, "got an object of type list"),
])
def test_quantize_rejects_what_it_cannot_read(bad, got):
    with pytest.raises(ValueError) as e:
        kvq.quantize(bad, "q8_0")
    assert "expected a float32, float16 or float64 array of shape (..., head_dim)" in str(e.value)
    assert got in str(e.value)


def test_float64_strided_and_torch_input_is_converted_once_to_float32():
    """quantize, KVCache.append and attend take float64 and strided arrays and torch tensors (float32/16/64,
    bfloat16): converted once to C-contiguous float32, the same codes and outputs as that float32 array."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 128))
    x32 = x.astype(np.float32)
    want = kvq.quantize(x32, "q8_0")
    np.testing.assert_array_equal(kvq.quantize(x, "q8_0"), want)
    wide = np.zeros((6, 256), np.float32)
    wide[:, ::2] = x32
    np.testing.assert_array_equal(kvq.quantize(wide[:, ::2], "q8_0"), want)
    np.testing.assert_array_equal(kvq.quantize(np.asfortranarray(x32), "q8_0"), want)
    # float64 beyond float32's range becomes Inf, refused as any non-finite input.
    with pytest.raises(ValueError, match="not finite|NaN|Inf"), np.errstate(over="ignore"):
        kvq.quantize(np.full((1, 128), 1e300), "q8_0")
    cache = kvq.KVCache(n_layers=1, n_kv_heads=2, head_dim=64, n_heads=4)
    ref = kvq.KVCache(n_layers=1, n_kv_heads=2, head_dim=64, n_heads=4)
    cache.add_sequence(), ref.add_sequence()
    k, v, q = rng.standard_normal((40, 2, 64)), rng.standard_normal((40, 2, 64)), rng.standard_normal((4, 64))
    cache.append(0, k, v)
    ref.append(0, k.astype(np.float32), v.astype(np.float32))
    np.testing.assert_array_equal(cache.attend(0, q), ref.attend(0, q.astype(np.float32)))
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = torch.from_numpy(x32).to(dtype)
        np.testing.assert_array_equal(kvq.quantize(t, "q8_0"), kvq.quantize(t.float().numpy(), "q8_0"))
    tq = torch.from_numpy(q.astype(np.float32)).requires_grad_(True)
    np.testing.assert_array_equal(cache.attend(0, tq), ref.attend(0, q.astype(np.float32)))
    with pytest.raises(ValueError, match="got a int32 array"):
        kvq.quantize(torch.zeros((2, 128), dtype=torch.int32), "q8_0")


def test_quantize_rejects_nan_inf_and_head_sizes_the_codec_cannot_take():
    x = np.ones((2, 64), np.float32)
    for value in (np.nan, np.inf, -np.inf):
        x[1, 5] = value
        with pytest.raises(ValueError, match="not finite"):
            kvq.quantize(x, "q4_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        kvq.quantize(np.ones((2, 48), np.float32), "q8_0")
    with pytest.raises(ValueError, match="unknown codec 'q3_0'"):
        kvq.quantize(np.ones((2, 64), np.float32), "q3_0")
    with pytest.raises(ValueError, match="unknown codec"):
        kvq.codec_info("nope")


def test_dequantize_checks_dtype_and_row_bytes():
    codes = kvq.quantize(np.ones((3, 64), np.float32), "q8_0")
    with pytest.raises(ValueError, match=r"expected a C-contiguous uint8 array of shape \(\.\.\., row_bytes=136\), "
                                         r"got a uint8 array of shape \(3, 68\)"):
        kvq.dequantize(codes, "q8_0", 128)
    with pytest.raises(ValueError, match="got a int8 array"):
        kvq.dequantize(codes.view(np.int8), "q8_0", 64)
    with pytest.raises(ValueError, match="head_dim must be in"):
        kvq.dequantize(codes, "q8_0", 0)


def test_iq4_nls_writes_iq4_nl_blocks_with_ggml_scale_search(rng):
    """iq4_nls: ggml's iq4_nl blocks from its scale-searching encoder; iq4_nl reads them back unchanged."""
    info = kvq.codec_info("iq4_nls")
    assert info["bytes_per_block"] == 18 and "iq4_nl" in info["layout"]
    assert not info["ggml_layout"] and kvq.codec_info("iq4_nl")["ggml_layout"]  # no ggml type is named iq4_nls
    assert info["ggml_type"] == kvq.codec_info("iq4_nl")["ggml_type"]  # but its bytes are iq4_nl's type
    x = rng.standard_normal((256, 128)).astype(np.float32)
    codes = kvq.quantize(x, "iq4_nls")
    assert codes.shape == (256, 72) and not np.array_equal(codes, kvq.quantize(x, "iq4_nl"))
    y = kvq.dequantize(codes, "iq4_nls", 128)
    np.testing.assert_array_equal(y, kvq.dequantize(codes, "iq4_nl", 128))
    err = lambda c: float(np.sum((kvq.dequantize(kvq.quantize(x, c), c, 128) - x) ** 2))
    assert err("iq4_nls") < err("iq4_nl")


def test_iq4_nls_in_a_cache_and_in_kv_format_specs(rng):
    cache = kvq.KVCache(1, 2, 64, n_heads=4, key_codec="iq4_nls+rot", value_codec="iq4_nls", center_keys=True)
    seq = cache.add_sequence()
    cache.append(0, rng.standard_normal((40, 2, 64)).astype(np.float32),
                 rng.standard_normal((40, 2, 64)).astype(np.float32), seq=seq)
    assert cache.attend(0, rng.standard_normal((4, 64)).astype(np.float32), seq=seq).shape == (4, 64)
    result = kvq.sweep(["llm:layers=1,kv_heads=2,tokens=128,query_positions=2"],
                       ["iq4_nls+rot+center/q4_0", "iq4_nl+rot+center/q4_0"], timing=False)
    assert "| iq4_nls+rot+center | q4_0 |" in result.format("markdown")
