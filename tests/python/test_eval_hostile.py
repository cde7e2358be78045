"""Hostile data-set files and metric inputs through Python and `kvq table` (issue 36, items 7, 8 and 11):
npy:DIR never hangs on a FIFO, never reads more than its header promises, and gives a one-line error
(exit status 2) where it gave tracebacks; NaN, Inf and scores beyond float are refused with the reason, or
computed in double (reference_attention), never a table of KL 0."""

import json
import os
import re
import resource
import subprocess
import sys

import numpy as np
import pytest

import kvq
from kvq import cli

L, T, H, D = 1, 24, 1, 32


def write_dump(path, q=None):
    rng = np.random.default_rng(0)
    for name in ("k", "v"):
        np.save(path / f"{name}.npy", rng.standard_normal((L, T, H, D)).astype(np.float32))
    if q is not None:
        np.save(path / "q.npy", q)
    return f"npy:{path},query_positions=2"


def queries(value=None, whole_head=False):
    q = np.random.default_rng(1).standard_normal((L, T, 2 * H, D)).astype(np.float32)
    if value is not None:
        q[0, T - 1, 0, slice(None) if whole_head else 5] = value
    return q


def table(capsys, spec):
    code = cli.main(["table", "--data", spec, "--pairs", "q8_0/q4_0", "--no-timing"])
    out, err = capsys.readouterr()
    return code, out, err


def sweep(spec):
    return kvq.sweep([spec], ["q8_0/q4_0"], timing=False)


def refused(capsys, spec, message, api=kvq.dataset):
    """`kvq table` on spec: exit status 2 and a one-line message; the Python api: ValueError, same message."""
    code, out, err = table(capsys, spec)
    assert code == 2 and "Traceback" not in err and out == "", err
    assert message in err, err
    with pytest.raises(ValueError, match=re.escape(message)):
        api(spec)


def test_a_fifo_in_place_of_k_npy_is_refused_at_once(tmp_path):
    spec = write_dump(tmp_path)
    os.remove(tmp_path / "k.npy")
    os.mkfifo(tmp_path / "k.npy")  # no writer: opening it for reading used to block for ever
    r = subprocess.run([sys.executable, "-m", "kvq", "table", "--data", spec, "--pairs", "q8_0/q4_0", "--no-timing"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "k.npy: is a FIFO, not a regular file" in r.stderr, r.stderr


def test_a_directory_in_place_of_a_file_is_a_one_line_error(capsys, tmp_path):
    spec = write_dump(tmp_path)
    os.remove(tmp_path / "v.npy")
    os.mkdir(tmp_path / "v.npy")
    refused(capsys, spec, "v.npy: is a directory, not a regular file")
    os.rmdir(tmp_path / "v.npy")
    write_dump(tmp_path)
    os.mkdir(tmp_path / "meta.json")
    refused(capsys, spec, "meta.json: is a directory, not a regular file")


def npy_with_shape(shape: str, data: bytes = b"") -> bytes:
    """A .npy file of float32 with the shape text as given (NumPy could not write these)."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


def test_shape_numbers_beyond_64_bits_are_a_one_line_error(capsys, tmp_path):
    spec = write_dump(tmp_path)
    (tmp_path / "k.npy").write_bytes(npy_with_shape("(1, 12345678901234567890123, 1, 32)", bytes(64)))
    refused(capsys, spec, "shape number 12345678901234567890123 is beyond")
    (tmp_path / "k.npy").write_bytes(npy_with_shape("(4294967296, 4294967296, 1, 1)"))
    refused(capsys, spec, "holds more elements than fit in 64 bits")


def test_a_file_longer_than_its_header_says_is_refused(capsys, tmp_path):
    spec = write_dump(tmp_path)
    with open(tmp_path / "k.npy", "r+b") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB whose header says 3 KiB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(capsys, spec, "does not match shape (1, 24, 1, 32) of float32 (3072 bytes)")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 512 << 10  # KiB: the 2 GiB were not read


@pytest.mark.parametrize("scale", ["1e300", "1e-300", "Infinity", "NaN"])
def test_a_meta_json_scale_float_cannot_hold_is_refused(capsys, tmp_path, scale):
    spec = write_dump(tmp_path, queries())
    (tmp_path / "meta.json").write_text('{"scale": %s}' % scale)
    refused(capsys, spec, "'scale' must be a positive number within float's range")


@pytest.mark.parametrize("value, message", [(np.nan, "the queries holds nan at layer 0, token 23, head 0"),
                                            (np.inf, "the queries holds inf at layer 0, token 23, head 0")])
def test_nan_or_inf_queries_are_refused_not_a_table_of_kl_0(capsys, tmp_path, value, message):
    refused(capsys, write_dump(tmp_path, queries(value)), message)


@pytest.mark.parametrize("value", [1e38, 3e38])
def test_queries_whose_scores_overflow_float_are_refused(capsys, tmp_path, value):
    refused(capsys, write_dump(tmp_path, queries(value, whole_head=True)),
            "layer 0, kv head 0: the queries at token 23 have scores (q · k · scale) beyond float's range", sweep)


def test_a_scale_that_makes_every_score_overflow_is_refused(capsys, tmp_path):
    spec = write_dump(tmp_path, queries())
    (tmp_path / "meta.json").write_text(json.dumps({"scale": 3e38}))
    refused(capsys, spec, "beyond float's range", sweep)


def test_reference_attention_computes_a_query_of_3e38_in_double():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((n, D)).astype(np.float32) for n in (2, 20, 20))
    q[1, 3] = 3e38
    out, w = kvq.reference_attention(q, k, v, return_weights=True)
    assert np.isfinite(out).all() and np.isfinite(w).all()
    best = int(np.argmax(k[:, 3]))
    assert w[1, best] == 1.0 and np.array_equal(out[1], v[best])
    # The 3-D path (per kv head) and the scale too.
    out3 = kvq.reference_attention(q[:, None], k[:, None], v[:, None])
    assert np.array_equal(out3[1, 0], v[best])
    for scale in (float("inf"), 1e300):
        with pytest.raises(ValueError, match="scale"):
            kvq.reference_attention(q, k, v, scale)


def test_attention_error_refuses_a_query_whose_scores_overflow():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, D)).astype(np.float32) for n in (3, 64, 64))
    assert np.isfinite(kvq.attention_error(q, k, v)["kl"]["mean"])
    q[1, 3] = 3e38
    with pytest.raises(ValueError, match="query 1's scores .* are beyond float's range"):
        kvq.attention_error(q, k, v)
    with pytest.raises(ValueError, match="beyond float's range"):
        kvq.attention_error(q[:, None], k[:, None], v[:, None], causal=False)
