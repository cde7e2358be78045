"""The examples run as documented (the plot example without matplotlib, --no-plot)."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script, *args, cwd):
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_runs_from_any_directory(tmp_path):
    out = run("quickstart.py", cwd=tmp_path)
    assert "q8_0" in out and "KL" in out


def test_error_vs_bits_prints_a_row_per_codec(tmp_path):
    import kvq

    out = run("error_vs_bits.py", "--no-plot", "--head-dim", "64", cwd=tmp_path)
    table_rows = [line for line in out.splitlines() if line.startswith("| ") and "codec" not in line]
    assert len(table_rows) == 2 * len(kvq.codecs())
    assert any(line.startswith("| q4_0+rot | 4.500 |") for line in table_rows)
