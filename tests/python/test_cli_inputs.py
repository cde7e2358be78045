"""Bad arguments to the `kvq` command (issue #15): numbers beyond what the library takes, data sets too
large to make, a directory as the plot file. Each is a one-line error and exit status 2, as argparse's
own usage errors are."""

import pytest

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
])
def test_numbers_beyond_the_library_are_usage_errors(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and one_line_error(err)


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


def test_plot_is_written_under_the_name_printed(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plots" / "e.svg"
    path.parent.mkdir()
    code, _, err = run(capsys, "table", "--data", SMALL, "--pairs", "q8_0/q4_0", "--no-timing", "--plot", str(path))
    assert code == 0 and f"plot written to {path}" in err
    assert path.read_bytes().lstrip().startswith(b"<?xml")
