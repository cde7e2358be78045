"""Bad arguments to the `kvq` command (issue #15): numbers beyond what the library takes, data sets too
large to make, a directory as the plot file, and Hugging Face configs the planner must read as
transformers does. Each is a one-line error and exit status 2, as argparse's own usage errors are."""

import json
import sys

import pytest

import kvq
from kvq import cli

SMALL = "llm:layers=1,kv_heads=2,tokens=128,query_positions=2"


def run(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse: usage line and "error: ..." on stderr
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    """One message line ("kvq CMD: ..."); argparse's usage lines may precede it."""
    lines = [l for l in err.splitlines() if l.startswith("kvq ")]
    return len(lines) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,message", [
    (["plan", "--context", "99999999999999999999"], "expected a token count in 1..281474976710656"),
    (["plan", "--batch", "0"], "expected a sequence count"),
    (["table", "--seed", "-1"], "expected a seed in 0..18446744073709551615"),
    (["table", "--seed", str(2**64)], "expected a seed"),
    (["info", "--head-dim", "99999999999999999999"], "expected a head size"),
    # Beyond what a KVCache takes: `table --no-timing` never made a cache and took it silently.
    (["table", "--block-tokens", "4097", "--no-timing"], "expected a block size in tokens (what a KVCache takes) in 1..4096"),
    (["table", "--block-tokens", "0"], "in 1..4096"),
    (["eval", "gemma3-270m", "--text", "t.txt", "--block-tokens", "100000"], "in 1..4096"),
])
def test_numbers_beyond_the_library_are_usage_errors(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and one_line_error(err)


def test_a_codec_parameter_beyond_its_range_is_refused_with_the_range():
    # polar:budget=99 was taken as the largest allocation (12 bits/value). The table reports a codec's
    # error in its row, as for any codec the data set cannot take; the library refuses it.
    with pytest.raises(ValueError, match="budget must be at most 12 bits/value"):
        kvq.codec_info("polar:budget=99", 128)
    result = kvq.sweep([SMALL], ["q8_0/polar:budget=99"], timing=False)
    assert "budget must be at most 12 bits/value" in result.format("markdown")


def test_a_data_set_too_large_to_make_is_a_bad_argument(capsys):
    code, _, err = run(capsys, "table", "--data", "gaussian:kv_heads=100000,tokens=100000", "--pairs", "q8_0/q4_0",
                       "--no-timing")
    assert code == 2 and "a synthetic data set may hold" in err and one_line_error(err)
    code, _, err = run(capsys, "table", "--data", "llm:kv_heads=2000000000,q_per_kv=4", "--pairs", "q8_0/q4_0",
                       "--no-timing")
    assert code == 2 and "a synthetic data set may hold" in err and one_line_error(err)


def test_plot_into_a_directory_is_an_error_before_the_sweep(capsys, tmp_path):
    plots = tmp_path / "plots"
    plots.mkdir()
    code, out, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--plot", str(plots))
    assert code == 2 and "is a directory" in err and one_line_error(err)
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["plots"]  # no plots.png beside it
    code, _, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--plot",
                       str(tmp_path / "errors"))
    assert code == 2 and ".png" in err and not (tmp_path / "errors.png").exists()


def test_missing_matplotlib_or_an_unwritable_output_fail_before_the_sweep(capsys, tmp_path, monkeypatch):
    """Nothing runs for minutes to fail at the end: --plot without matplotlib is a bad argument (with the
    command to install it), an --output or --plot in a missing directory an I/O error, both before the sweep
    (no table printed, no progress)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--progress",
                         "--plot", str(tmp_path / "e.png"))
    assert code == 2 and "pip install matplotlib" in err and one_line_error(err) and out == "" and "%|" not in err
    monkeypatch.undo()
    for flag in ("--output", "--plot"):
        code, out, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--progress",
                             flag, str(tmp_path / "missing" / "e.png"))
        assert code == 1 and "no such directory" in err and out == "" and "%|" not in err


def test_plot_is_readable_one_marker_per_pair_titles_are_names(tmp_path):
    """The plot: one legend entry (marker) per pair and one per codec family, no text on the points, titles
    that are names (npy:dump, not its path), and a y axis that f16's 1e-8 does not stretch."""
    pytest.importorskip("matplotlib")
    from matplotlib import pyplot as plt
    rows = []
    for pair, kl, err in [("f16/f16", 2e-8, 3e-4), ("q8_0/q4_0", 2e-4, 0.09), ("q4_0+rot/q4_0", 1e-2, 0.15),
                          ("turbo4/turbo4", 1.2e-2, 0.15), ("polar/polar", 5e-2, 0.3)]:
        k, v = pair.split("/")
        bits = {"f16": 16, "q8_0": 8.5, "q4_0+rot": 4.5, "q4_0": 4.5, "turbo4": 4.125, "polar": 3.875}
        rows.append(dict(dataset="npy:/very/long/path/to/dump", layers="all", key=k, value=v, key_centered=False,
                         key_bits=bits[k], value_bits=bits[v], kl_mean=kl, output_err_mean=err, error=""))
    saved = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, *a, **kw):
        saved["fig"] = fig
        return real_savefig(fig, *a, **kw)

    plt.Figure.savefig = keep
    try:
        cli.plot_sweep(rows, str(tmp_path / "p.png"))
    finally:
        plt.Figure.savefig = real_savefig
    fig = saved["fig"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:5] == ["f16/f16", "q8_0/q4_0", "q4_0+rot/q4_0", "turbo4/turbo4", "polar/polar"]
    assert {"family: ggml blocks", "family: rotated", "family: turbo", "family: polar"} <= set(labels)
    for ax in fig.axes:
        assert ax.get_title() == "npy:dump" and not ax.texts  # no labels drawn on the points
        assert ax.get_ylim()[0] > 1e-7  # f16's 2e-8 KL sits on the floor, not 4 decades below the others
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_plot_is_written_under_the_name_printed(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plots" / "e.svg"
    path.parent.mkdir()
    code, _, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--plot", str(path))
    assert code == 0 and f"plot written to {path}" in err
    assert path.read_bytes().lstrip().startswith(b"<?xml")


def _qwen2(**extra):
    return {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "hidden_size": 3584, "sliding_window": 4096, **extra}


def _f16_total(capsys, tmp_path, config, context=32768):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run(capsys, "plan", "--config", str(path), "--pairs", "f16/f16", "--context", str(context),
                         "--format", "json")
    assert code == 0, err
    return json.loads(out)["rows"][0]["bytes_total"]


def test_qwen2_windows_only_the_layers_transformers_windows(capsys, tmp_path):
    per_token = 2 * 4 * 128 * 2  # K and V, 4 kv heads of 128, fp16: one layer
    # transformers' Qwen2Config: layer i uses the window iff use_sliding_window and i >= max_window_layers.
    total = _f16_total(capsys, tmp_path, _qwen2(use_sliding_window=True, max_window_layers=21))
    assert total == per_token * (21 * 32768 + 7 * 4096)
    # use_sliding_window defaults to false in Qwen2Config: no window at all.
    assert _f16_total(capsys, tmp_path, _qwen2()) == per_token * 28 * 32768
    assert _f16_total(capsys, tmp_path, _qwen2(use_sliding_window=False, max_window_layers=0)) == per_token * 28 * 32768
    # max_window_layers defaults to 28: with 28 layers, none is windowed.
    assert _f16_total(capsys, tmp_path, _qwen2(use_sliding_window=True)) == per_token * 28 * 32768
    # An explicit layer_types list (newer transformers write it) is taken as it is.
    types = ["full_attention"] * 20 + ["sliding_attention"] * 8
    total = _f16_total(capsys, tmp_path, _qwen2(use_sliding_window=True, max_window_layers=21, layer_types=types))
    assert total == per_token * (20 * 32768 + 8 * 4096)


def test_heads_that_are_not_a_multiple_of_kv_heads_are_refused(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                                "num_key_value_heads": 7, "hidden_size": 4096}))
    code, _, err = run(capsys, "plan", "--config", str(path))
    assert code == 2 and "32 attention heads are not a multiple of 7 kv heads" in err and one_line_error(err)


def test_progress_is_a_tqdm_bar_on_stderr(capsys):
    code, out, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--progress")
    assert code == 0 and out.startswith("|") and "kvq table: 100%|" in err
