"""SIMD levels from Python: the report, forcing a level, and the shipped parity check (kvq.selftest and
`kvq selftest`)."""

import subprocess
import sys

import pytest

import kvq


def test_the_report_names_the_levels_and_the_one_in_use():
    r = kvq.simd_report()
    names = [l["name"] for l in r["levels"]]
    assert names[0] == "scalar"
    assert r["in_use"] == kvq.simd_level() and r["in_use"] in names
    assert r["reason"]
    in_use = next(l for l in r["levels"] if l["name"] == r["in_use"])
    assert in_use["cpu_runs"] and in_use["passed"]
    for level in r["levels"]:
        assert level["cpu_runs"] == (level["name"] in kvq.available_simd_levels())
        if not level["cpu_runs"]:
            assert not level["passed"]
    assert "in use: " + r["in_use"] in r["text"]


def test_force_simd_level_and_bad_names():
    before = kvq.simd_level()
    for name in kvq.available_simd_levels():
        kvq.force_simd_level(name)
        assert kvq.simd_level() == name
    kvq.force_simd_level(before)
    with pytest.raises(ValueError, match="unknown SIMD level"):
        kvq.force_simd_level("avx9000")


def test_selftest_passes_at_every_level_and_reports_lines():
    seen = []
    result = kvq.selftest(on_line=seen.append)
    assert result["passed"], [l["text"] for l in result["lines"] if not l["passed"]]
    assert len(seen) == len(result["lines"]) > 0
    levels = {l["level"] for l in result["lines"]}
    assert levels == set(kvq.available_simd_levels())
    assert all(l["cases"] > 0 for l in result["lines"])


def test_the_selftest_command_exits_zero_and_prints_a_summary():
    out = subprocess.run([sys.executable, "-m", "kvq", "selftest", "--quiet"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 failed" in out.stdout
    assert "in use: " in out.stdout


def test_kvq_simd_asks_for_a_level_and_kvq_selfcheck_0_skips_the_check():
    import os

    env = dict(os.environ, KVQ_SIMD="scalar")
    code = "import kvq; r = kvq.simd_report(); print(r['in_use']); print(r['reason'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == "scalar"
    env = dict(os.environ, KVQ_SELFCHECK="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "self-check skipped" in out.stdout
