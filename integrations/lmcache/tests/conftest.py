"""A real redis-server on 127.0.0.1 (a free port, stopped at the end) and LMCache StorageManagers over it.
Skipped, saying why, where LMCache (scripts/setup.sh installs 0.5.6 for the test command) or redis-server
is missing."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time

import pytest

import torch

LMCACHE_MISSING = ("LMCache is not installed (scripts/test.sh installs lmcache==0.5.6 into build/venv-lmcache "
                   "through scripts/setup.sh's test-only part; it could not here)")


@pytest.fixture(scope="session")
def redis_port():
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it with apt for the test command)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        for _ in range(100):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"redis-server on 127.0.0.1:{port} did not answer")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_client(redis_port):
    import redis

    client = redis.Redis(host="127.0.0.1", port=redis_port)
    client.flushall()
    return client


@pytest.fixture
def resp_adapter(redis_client, redis_port):
    def adapter(**serde):
        return {"type": "resp", "host": "127.0.0.1", "port": redis_port, "serde": {"type": "kvq", **serde}}
    return adapter


def kv_chunk(layers=4, tokens=64, kv_heads=2, head_dim=128, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, layers, tokens, kv_heads * head_dim, generator=g).to(dtype)


def adapter_json(adapter: dict) -> str:
    return json.dumps(adapter)


@pytest.fixture
def storage():
    from kvq_lmcache.storage import Storage

    opened = []

    def open_storage(adapter):
        s = Storage(adapter, l1_gb=0.25)
        opened.append(s)
        return s
    yield open_storage
    for s in opened:
        s.close()
