"""`kvq table`'s latent rows (DeepSeek's MLA, issue 54): the mla data set, its rows in CSV, Markdown and JSON,
the pairs a latent cache refuses as rows with the reason, and the plot."""

import csv
import io
import json

import numpy as np
import pytest

import kvq
from kvq import cli

LATENT = "mla:tokens=128,q_heads=4,query_positions=2"


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mla_dataset_is_a_latent_of_deepseek_v3_shapes():
    d = kvq.dataset(LATENT)
    assert d.latent and (d.head_dim, d.head_dim_v, d.kv_heads, d.q_heads) == (576, 512, 1, 4)
    assert d.k.shape == (1, 128, 1, 576) and d.v.shape == (1, 128, 1, 512)
    assert np.array_equal(d.v, d.k[..., :512])  # V is a view of K
    assert "mla" in dict(kvq.dataset_kinds())
    assert "mla" in cli.DEFAULT_DATA  # the README's main command prints them


def test_table_latent_rows_in_csv(capsys):
    code, out, _ = run(capsys, "table", "--data", LATENT, "--format", "csv", "--repeats", "1")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [f"{r['key']}/{r['value']}" for r in rows] == kvq.default_pairs(latent=True)
    assert all(r["latent"] == "true" and r["head_dim"] == "576" and r["head_dim_v"] == "512" for r in rows)
    assert all(r["value_bits"] == "" and not r["error"] for r in rows)  # the values have no bytes of their own
    q8 = next(r for r in rows if r["key"] == "q8_0")
    assert float(q8["key_bits"]) == 8.5
    assert float(q8["bytes_per_token"]) == 61 * 18 * 34  # deepseek-v3: 61 layers of one q8_0 row of 576
    f16 = next(r for r in rows if r["key"] == "f16")
    assert float(f16["decode_vs_f16"]) == 1.0 and float(q8["decode_vs_f16"]) > 0
    assert float(f16["kl_mean"]) < float(q8["kl_mean"]) < float(next(r for r in rows if r["key"] == "q4_0")["kl_mean"])


def test_table_latent_markdown_and_json_refused_pairs(capsys):
    code, out, _ = run(capsys, "table", "--data", LATENT, "--pairs", "q8_0/q8_0,q8_0/q4_0,turbo4/turbo4", "--no-timing")
    assert code == 0
    assert f"| {LATENT} | q8_0 | K[:512] | 8.50 | — | 36.5 | 1.88× |" in out
    assert "the value codec must be empty or the key codec ('q8_0'), got 'q4_0'" in out
    assert "key codec 'turbo4' does not keep its leading values as rows of their own" in out
    assert "KiB/token and vs f16: deepseek-v3 (61 layers, MLA latent 512 + rope 64" in out
    code, out, _ = run(capsys, "table", "--data", LATENT, "gaussian:tokens=64", "--pairs", "q8_0/q8_0", "--no-timing",
                       "--format", "json")
    result = json.loads(out)
    assert result["latent_model"]["name"] == "deepseek-v3" and result["model"]["name"] == "llama-3-8b"
    latent, plain = result["rows"]
    assert latent["latent"] is True and latent["value_bits"] is None
    assert plain["latent"] is False and plain["value_bits"] == 8.5
    api = kvq.sweep([LATENT], ["q8_0/q8_0"], timing=False)
    assert api.latent_model["mla_latent_dim"] == 512 and api.rows[0]["value_bits"] is None


def test_table_plot_with_latent_rows(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    code, _, _ = run(capsys, "table", "--data", LATENT, "gaussian:tokens=64", "--pairs", "q8_0/q8_0,q4_0/q4_0",
                     "--no-timing", "--plot", str(png))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
