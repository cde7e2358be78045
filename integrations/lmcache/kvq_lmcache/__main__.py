"""kvq-lmcache server ARGS: LMCache's `lmcache server` (the cache server vLLM connects to) with the kvq serde
registered first, so that an --l2-adapter may name it ("serde": {"type": "kvq", ...}). Every ARG is
lmcache's (kvq-lmcache server --help)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "server":
        sys.exit("usage: kvq-lmcache server [lmcache server arguments]  (see docs/lmcache.md)")
    import kvq_lmcache  # noqa: F401  registers the serde before LMCache builds its adapters
    from lmcache.cli.main import main as lmcache_main

    lmcache_main(args)


if __name__ == "__main__":
    main()
