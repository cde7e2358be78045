#!/usr/bin/env python3
"""Checks kvq's include graph: every #include in lib/ points to the same folder or one below it, and the
interfaces (ggml/, python/src/) include only kvq's public headers.

The layers, bottom to top (docs/DESIGN.md, "Layers"): util, rotation, ref, simd, codec, attention, cache,
check, capi form the engine library; eval is the research library above it. Public headers
(include/kvq/) include only public headers. The engine's public headers are kvq/kvq.h, kvq/kvq.hpp and
what kvq.hpp includes, and nothing else sits in include/kvq/ beside them; the research library's are in
include/kvq/research/, which no engine header or engine source includes. The layers below codec (util,
rotation, ref, simd) include no public header but kvq/simd.hpp and kvq/errors.hpp: kvq/codec.hpp and the
others belong to the layers above (so lib/simd's self-check cannot call back into the codecs). Prints each arrow that points up
and exits 1 if there is one.
"""
import pathlib
import re
import sys

ORDER = ["util", "rotation", "ref", "simd", "codec", "attention", "cache", "check", "capi", "eval"]
RANK = {name: i for i, name in enumerate(ORDER)}
# The public headers the layers below codec may include; every other kvq/ header is codec's or above.
FLOOR = {"util", "rotation", "ref", "simd"}
FLOOR_PUBLIC = {"kvq/simd.hpp", "kvq/errors.hpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# The layer each engine public header belongs to: a layer includes those of its own layer and below only
# (the attention layer never the cache's header).
PUBLIC_LAYER = {"kvq/simd.hpp": "simd", "kvq/errors.hpp": "util", "kvq/codec.hpp": "codec",
                "kvq/attention.hpp": "attention", "kvq/cache.hpp": "cache", "kvq/selftest.hpp": "check",
                "kvq/kvq.h": "capi", "kvq/kvq.hpp": "capi"}
# The interfaces above both libraries: they include kvq's public headers and their own files only (and,
# for the ggml backend, ggml's headers), never the libraries' internals.
INTERFACES = {"ggml": ("ggml.h", "ggml-backend.h", "ggml-backend-impl.h", "ggml-cpu.h"), "python/src": ()}


def target_folder(source: pathlib.Path, include: str, lib: pathlib.Path):
    if include.startswith("kvq/research/"):
        return "eval"  # the research library's public headers sit at its layer
    if include.startswith("kvq/"):
        return "public"
    path = (source.parent / include).resolve()
    if not path.exists():
        path = (lib / include).resolve()  # "ref/half.hpp" from lib/'s include root
    try:
        return path.relative_to(lib).parts[0]
    except ValueError:
        return None


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    lib = root / "lib"
    bad = []
    for source in sorted(lib.glob("*/*.[ch]pp")):
        folder = source.parent.name
        if folder not in RANK:
            bad.append(f"{source.relative_to(root)}: folder '{folder}' is not a known layer")
            continue
        for include in INCLUDE.findall(source.read_text()):
            to = target_folder(source, include, lib)
            if to == "public" and folder in FLOOR and include not in FLOOR_PUBLIC:
                bad.append(f"{source.relative_to(root)} ({folder}) includes {include}: below codec, only "
                           f"{' and '.join(sorted(FLOOR_PUBLIC))} of the public headers")
                continue
            if to == "public" and folder in RANK and include in PUBLIC_LAYER and RANK[PUBLIC_LAYER[include]] > RANK[folder]:
                bad.append(f"{source.relative_to(root)} ({folder}) includes {include} ({PUBLIC_LAYER[include]}'s "
                           f"public header): points up")
                continue
            if to in (None, "public", folder):
                continue
            if to not in RANK or RANK[to] > RANK[folder]:
                bad.append(f"{source.relative_to(root)} ({folder}) includes {include} ({to}): points up")
    for name, foreign in INTERFACES.items():
        folder = root / name
        for source in sorted(folder.glob("*.[ch]pp")):
            for include in INCLUDE.findall(source.read_text()):
                own = (folder / include).resolve()
                if include.startswith("kvq/") or include in foreign or (own.exists() and own.is_relative_to(folder)):
                    continue
                bad.append(f"{source.relative_to(root)} includes {include}: an interface includes kvq's public "
                           "headers only, never the libraries' internals")
    public = root / "include" / "kvq"
    for header in sorted(p for p in public.rglob("*") if p.is_file()):
        research = header.parent.name == "research"
        for include in INCLUDE.findall(header.read_text()):
            if not include.startswith("kvq/"):
                bad.append(f"{header.relative_to(root)} includes {include}: public headers include only kvq/")
            elif not research and include.startswith("kvq/research/"):
                bad.append(f"{header.relative_to(root)} includes {include}: an engine header includes a research one")
    engine = {"kvq.h", "kvq.hpp"} | {i.removeprefix("kvq/") for i in INCLUDE.findall((public / "kvq.hpp").read_text())}
    for entry in sorted(public.iterdir()):
        if entry.name not in engine and entry.name != "research":
            bad.append(f"{entry.relative_to(root)}: not included by kvq/kvq.hpp (research headers go in include/kvq/research/)")
    for line in bad:
        print(line)
    print(f"layers: {len(bad)} arrow(s) pointing up" if bad else "layers: every include points down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
