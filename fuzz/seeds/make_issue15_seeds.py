"""Writes the seeds of issue #15 (hostile input) for fuzz_cache_load and fuzz_cache_ops:

  python fuzz/seeds/make_issue15_seeds.py        (needs the kvq package: build/venv/bin/python)

fuzz_cache_load: cache files of the target's base configuration 0 (2 layers, 1 kv head, 2 query heads,
head_dim 32, 4-token blocks, q8_0/q4_0, on_block_full, propagate) whose CRCs were recomputed after NaN,
1e30, or an Inf or NaN fp16 scale was put into a staged row or a sealed block, and a file that declares
far more blocks than it holds; each followed by the control bytes that make the target take the rest of
the input as the whole file (raw mode), load it into a cache of configuration 0 with no pool limit, under
NanPolicy::reject (the *-reject seeds) or propagate. FuzzedDataProvider reads integers from the end.
fuzz_cache_ops: an add_sequence followed by an append of each overflowing token count the target offers,
and an append followed by an attend with a query of ~1e38.
"""

import os
import struct
import tempfile

import numpy as np

import kvq

HERE = os.path.dirname(os.path.abspath(__file__))


def crc32c(data: bytes) -> int:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def base_file() -> bytes:
    cache = kvq.KVCache(n_layers=2, n_kv_heads=1, head_dim=32, n_heads=2, key_codec="q8_0", value_codec="q4_0",
                        block_tokens=4, nan_policy="propagate")
    seq = cache.add_sequence()
    for layer, n in ((0, 6), (1, 11)):
        x = np.sin(0.1 * layer + 0.37 * np.arange(n * 32, dtype=np.float32)).reshape(n, 1, 32)
        cache.append(layer, x, np.cos(x), seq=seq)
    with tempfile.TemporaryDirectory() as d:
        cache.save(os.path.join(d, "c.kvq"))
        return open(os.path.join(d, "c.kvq"), "rb").read()


def fields(b: bytes):
    return dict(zip(["payloads", "n_blocks", "block", "n_staging", "staging", "table", "table_bytes"],
                    struct.unpack_from("<7Q", b, 24)))


def recompute_crcs(b: bytearray) -> None:
    f = fields(b)
    for i in range(f["n_blocks"] + f["n_staging"]):
        if i < f["n_blocks"]:
            at, size = f["payloads"] + i * f["block"], f["block"]
        else:
            at, size = f["payloads"] + f["n_blocks"] * f["block"] + (i - f["n_blocks"]) * f["staging"], f["staging"]
        struct.pack_into("<I", b, f["table"] + 4 * i, crc32c(b[at:at + size]))
    end = f["table"] + f["table_bytes"] - 4
    struct.pack_into("<I", b, end, crc32c(b[f["table"]:end]))
    header = struct.unpack_from("<I", b, 12)[0]
    struct.pack_into("<I", b, header - 4, crc32c(b[:header - 4]))


def forged(base: bytes, what: str) -> bytes:
    b = bytearray(base)
    f = fields(b)
    staging0 = f["payloads"] + f["n_blocks"] * f["block"]
    if what == "staged-nan":
        struct.pack_into("<f", b, staging0 + 4 * 5, float("nan"))  # layer 0's open block, key row 0
    elif what == "staged-1e30":
        struct.pack_into("<f", b, staging0 + 4 * 5, 1e30)
    elif what == "block-inf-scale":
        struct.pack_into("<H", b, f["payloads"], 0x7C00)  # block 0, key row 0: its first fp16 scale
    elif what == "block-nan-scale":
        struct.pack_into("<H", b, f["payloads"], 0x7E00)
    recompute_crcs(b)
    if what == "huge-block-count":  # only the header changes (its CRC recomputed): 2^40 blocks declared
        struct.pack_into("<Q", b, 32, 1 << 40)
        header = struct.unpack_from("<I", b, 12)[0]
        struct.pack_into("<I", b, header - 4, crc32c(b[:header - 4]))
    return bytes(b)


def main() -> None:
    base = base_file()
    out = os.path.join(HERE, "fuzz_cache_load")
    os.makedirs(out, exist_ok=True)
    for what in ("staged-nan", "staged-1e30", "block-inf-scale", "block-nan-scale", "huge-block-count"):
        for policy, reject in (("propagate", 0), ("reject", 1)):
            # From the end: which = 0, raw (0 % 8 == 0), configuration 0 (1 % 8 != 0), no pool limit (odd),
            # NanPolicy::reject if odd.
            control = bytes([reject, 1, 1, 0, 0])
            with open(os.path.join(out, f"issue15-{what}-{policy}"), "wb") as f:
                f.write(forged(base, what) + control)
    ops = os.path.join(HERE, "fuzz_cache_ops")
    os.makedirs(ops, exist_ok=True)
    # Configuration bytes (from the end): 1 layer, 1 kv head, GQA 1, q8_0/q4_0, 8-token blocks, on_block_full,
    # no pool limit, grow by 1; then 32 query floats (4 bytes each, zero: -2.0).
    config = bytes(128) + bytes(9)
    for variant in range(5):
        # Ops from the end: add_sequence (0), append of a huge count (6) with variant `variant`.
        with open(os.path.join(ops, f"issue15-append-overflow-{variant}"), "wb") as f:
            f.write(bytes([variant, 6, 0]) + config)
    # add_sequence, append of 3 tokens (1: count byte 2 -> 1 + 2 % 12 = 3, 3 x 32 x 2 floats), attend with a
    # query scaled to ~1e38 (7, then the scale's 4 bytes).
    floats = bytes(range(256)) * 3
    with open(os.path.join(ops, "issue15-huge-query"), "wb") as f:
        f.write(bytes([0xFF] * 4) + bytes([7]) + floats[: 3 * 32 * 2 * 4] + bytes([2, 1, 0]) + config)


if __name__ == "__main__":
    main()
