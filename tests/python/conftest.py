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
