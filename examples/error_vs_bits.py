"""Attention error against bits per value, for every codec in kvq's table (and its +rot form).

Each codec stores the keys (values kept in float32) and then the values (keys in float32), on Gaussian
rows with queries scaled so attention is neither uniform nor one-hot. Prints the table and, with
matplotlib installed (`pip install matplotlib`), plots it:

    python examples/error_vs_bits.py                 # writes error_vs_bits.png
    python examples/error_vs_bits.py --no-plot       # the table only
"""

import argparse

import numpy as np

import kvq


def measure(head_dim=128, n_tokens=1024, n_queries=32, seed=1234):
    """One row per codec spec: bits per value, KL when it stores keys, output error when it stores values."""
    rng = np.random.default_rng(seed)
    q = 2 * rng.standard_normal((n_queries, head_dim), dtype=np.float32)
    k = rng.standard_normal((n_tokens, head_dim), dtype=np.float32)
    v = rng.standard_normal((n_tokens, head_dim), dtype=np.float32)
    rows = []
    for name in kvq.codecs():
        for spec in (name, name + "+rot"):
            as_keys = kvq.attention_error(q, k, v, spec, "f32")
            as_values = kvq.attention_error(q, k, v, "f32", spec)
            rows.append({"codec": spec, "bits": kvq.codec_info(spec, head_dim)["bits_per_value"],
                         "key_kl": as_keys["kl"]["mean"], "value_l2": as_values["output_l2"]["mean"]})
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_k, ax_v) = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((ax_k, "key_kl", "KL(ref || quantized), codec on keys"),
                           (ax_v, "value_l2", "output relative L2, codec on values")):
        shown = [r for r in rows if r[key] > 0]  # exact (f32) has nothing to show on a log scale
        for rotated, marker, color in ((False, "o", "C0"), (True, "x", "C1")):
            mine = [r for r in shown if r["codec"].endswith("+rot") == rotated]
            ax.scatter([r["bits"] for r in mine], [r[key] for r in mine], marker=marker, color=color,
                       label="with +rot" if rotated else "plain")
        for r in shown:
            if not r["codec"].endswith("+rot"):  # one label per pair: the +rot point sits beside it
                ax.annotate(r["codec"], (r["bits"], r[key]), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.legend(loc="upper right")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bits per value (scales included)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("kvq: attention error against bits per value (Gaussian rows, head_dim 128)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-plot", action="store_true", help="print the table only (no matplotlib needed)")
    parser.add_argument("--output", default="error_vs_bits.png", help="where the plot goes")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    rows = measure(head_dim=args.head_dim)
    print("| codec | bits/value | as keys: KL mean | as values: output rel. L2 |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['codec']} | {r['bits']:.3f} | {r['key_kl']:.2e} | {r['value_l2']:.4f} |")
    if not args.no_plot:
        try:
            plot(rows, args.output)
        except ImportError:
            raise SystemExit("plotting needs matplotlib: pip install matplotlib (or run with --no-plot)")


if __name__ == "__main__":
    main()
