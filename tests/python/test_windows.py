"""Sliding windows in npy dumps (meta.json "windows") and per-channel keys (chanB) through `kvq table`
and kvq.sweep: windowed layers are measured on their window, full and window layers are reported apart."""

import csv
import io
import json

import numpy as np
import pytest

import kvq
from kvq import cli


def write_dump(path, windows, tokens=96, layers=2, kv_heads=1, heads=2, d=64, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((layers, tokens, kv_heads, d)).astype(np.float32) + 3 * rng.standard_normal(d).astype(np.float32)
    v = rng.standard_normal((layers, tokens, kv_heads, d)).astype(np.float32)
    q = rng.standard_normal((layers, tokens, heads, d)).astype(np.float32)
    for name, a in (("k", k), ("v", v), ("q", q)):
        np.save(path / f"{name}.npy", a)
    meta = {"scale": 0.125}
    if windows is not None:
        meta["windows"] = windows
    (path / "meta.json").write_text(json.dumps(meta))


def table_csv(capsys, spec, pairs):
    assert cli.main(["table", "--data", spec, "--pairs", pairs, "--format", "csv", "--no-timing"]) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr()[0])))


def test_windows_are_read_and_split_the_rows(capsys, tmp_path):
    write_dump(tmp_path, [0, 32])
    assert kvq.dataset(f"npy:{tmp_path}").windows == [0, 32]
    rows = table_csv(capsys, f"npy:{tmp_path}", "q4_0/q4_0,chan4/q4_0")
    assert [(r["key"], r["layers"]) for r in rows] == [("q4_0", "all"), ("q4_0", "full"), ("q4_0", "window"),
                                                      ("chan4", "all"), ("chan4", "full"), ("chan4", "window")]
    assert int(rows[0]["queries"]) == int(rows[1]["queries"]) + int(rows[2]["queries"])
    assert float(rows[3]["key_bits"]) == 5.0
    # The window changes what layer 1 measures: the same data without windows gives other figures there.
    write_dump(tmp_path, None)
    plain = table_csv(capsys, f"npy:{tmp_path}", "q4_0/q4_0")
    assert [r["layers"] for r in plain] == ["all"]
    assert abs(float(plain[0]["kl_mean"]) - float(rows[0]["kl_mean"])) > 1e-4 * float(plain[0]["kl_mean"])


def test_window_equals_the_cut_dump(tmp_path):
    # One windowed layer over 96 tokens (window 40) measures what the last 40 tokens measure alone.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_dump(tmp_path / "a", [40], layers=1)
    k, v, q = (np.load(tmp_path / "a" / f"{n}.npy") for n in "kvq")
    for name, x in (("k", k), ("v", v), ("q", q)):
        np.save(tmp_path / "b" / f"{name}.npy", x[:, -40:])
    (tmp_path / "b" / "meta.json").write_text(json.dumps({"scale": 0.125}))
    ra = kvq.sweep([f"npy:{tmp_path / 'a'},query_positions=1"], ["turbo4/q4_0"], timing=False).rows
    rb = kvq.sweep([f"npy:{tmp_path / 'b'},query_positions=1"], ["turbo4/q4_0"], timing=False).rows
    # The window (rows 56..95) and the cut dump (rows 0..39) fall into 32-row blocks differently, so they
    # agree to float rounding only: turbo's avx512 scores take rows 16 to a register and the rest one at a
    # time (the same products, summed in another order), and the output is the decode engine's online
    # softmax, block by block.
    assert ra[0]["kl_mean"] == pytest.approx(rb[0]["kl_mean"], rel=1e-5)
    assert ra[0]["output_err_mean"] == pytest.approx(rb[0]["output_err_mean"], rel=1e-6)


@pytest.mark.parametrize("meta,message", [
    ({"windows": [0]}, "'windows' has 1 entries but k.npy has 2 layers"),
    ({"windows": [0, -1]}, "windows[1] must be a non-negative integer"),
    ({"sliding_window": 16}, "go together"),
    ({"sliding_window": 16, "layer_types": ["full_attention", "local"]}, "layer_types[1]"),
])
def test_bad_windows_are_refused(capsys, tmp_path, meta, message):
    write_dump(tmp_path, None)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert cli.main(["table", "--data", f"npy:{tmp_path}", "--pairs", "q8_0/q4_0", "--no-timing"]) == 2
    assert message in capsys.readouterr()[1]


def test_chan_keys_are_timed_on_a_kvcache_and_bad_specs_are_named(capsys):
    rows = kvq.sweep(["llm:layers=1,kv_heads=2,tokens=128,query_positions=1"], ["chan4/q4_0", "q8_0/q4_0"], repeats=1).rows
    assert rows[0]["decode_vs_f16"] is not None and rows[1]["decode_vs_f16"] is not None
    assert cli.main(["table", "--data", "gaussian:tokens=64", "--pairs", "chan4+center/q4_0", "--no-timing"]) == 2
    assert "+center does not apply" in capsys.readouterr()[1]


def test_block_tokens_sets_the_centering_and_chan_blocks(capsys):
    rows = table_csv(capsys, "gaussian:tokens=128", "chan4/q4_0,q4_0+center/q4_0")
    assert [float(r["key_bits"]) for r in rows] == [5.0, 5.0]
    assert cli.main(["table", "--data", "gaussian:tokens=128", "--pairs", "chan4/q4_0,q4_0+center/q4_0", "--format", "csv",
                     "--no-timing", "--block-tokens", "64"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr()[0])))
    assert [float(r["key_bits"]) for r in rows] == [4.5, 4.75]
