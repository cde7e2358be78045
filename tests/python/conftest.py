import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def ggml_data():
    """ggml's own bytes for 256 rows of 128 values (tests/data/README.md): manifest, input rows."""
    manifest = json.loads((DATA / "manifest.json").read_text())
    rows, dim = manifest["rows"], manifest["dim"]
    x = np.fromfile(DATA / manifest["input"], dtype="<f4").reshape(rows, dim)
    return manifest, x


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def _simd_levels():
    import kvq

    return kvq.available_simd_levels()


@pytest.fixture(params=_simd_levels())
def every_simd_level(request):
    """Runs the test once per SIMD level this CPU runs (restoring the level in use after)."""
    import kvq

    before = kvq.simd_level()
    kvq.force_simd_level(request.param)
    assert kvq.simd_level() == request.param, kvq.simd_report()["text"]
    yield request.param
    kvq.force_simd_level(before)
