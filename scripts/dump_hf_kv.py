#!/usr/bin/env python3
"""Runs kvq.dump_hf_kv (python/kvq/dump_hf_kv.py; `pip install` puts it on PATH as kvq-dump-hf-kv) from a
source tree: python scripts/dump_hf_kv.py MODEL DIR [--tokens N] [--text-file FILE]."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "python" / "kvq" / "dump_hf_kv.py"), run_name="__main__")
