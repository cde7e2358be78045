"""What kvq's plots share (kvq table --plot, kvq eval --plot): a colour per codec family, markers per pair,
matplotlib on the Agg backend; and kvq table's plot (plot_sweep)."""

from __future__ import annotations

import os

# Codec families, each a colour: the ggml blocks, rotated, centered, per-channel keys, polar, turbo.
FAMILIES = [("turbo", "turbo", "tab:red"), ("polar", "polar", "tab:purple"), ("chan", "per-channel keys", "tab:brown"),
            ("+center", "centered keys", "tab:green"), ("+rot", "rotated", "tab:orange"), ("", "ggml blocks", "tab:blue")]
MARKERS = "osD^v<>pPX*hH8d"


def family(pair: str) -> tuple[str, str]:
    """The (name, colour) of a K/V pair's family: the first of FAMILIES whose tag the pair's key or value has."""
    return next((name, colour) for tag, name, colour in FAMILIES if tag in pair)


def pyplot(what: str):
    """matplotlib.pyplot on the Agg backend; a missing matplotlib is a bad-argument error with the command to
    install it (called before any work, so that a sweep or an evaluation does not run for nothing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError(f"{what} needs matplotlib: pip install matplotlib (or pip install 'kvq-cache[plot]')") from e
    return plt


def _short(name: str) -> str:
    """A data set's name for a title: npy:/long/path/dump -> npy:dump."""
    kind, sep, rest = name.partition(":")
    return f"{kind}:{os.path.basename(rest.rstrip('/')) or rest}" if sep and kind == "npy" else name


def plot_sweep(rows: list[dict], path: str) -> None:
    """Error against bits per value, one panel per data set and metric: the KL of the attention weights against
    key bits, the output error against the mean of K and V bits. One marker per K/V pair, named in a legend
    (no labels on the points, which overprint), coloured by codec family; the y axis spans the quantized
    pairs, and a pair below it (f16/f16's rounding-level errors) is drawn hollow on its floor."""
    plt = pyplot("--plot")
    rows = [r for r in rows if r.get("layers", "all") == "all"]  # not the [full]/[window] layer subsets
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    # The attention weights depend on the keys alone; the output on both.
    metrics = [
        ("kl_mean", "KL(ref ‖ quant) of attention weights, mean, nats", "key bits per value, everything stored",
         lambda r: r["key_bits"]),
        # A latent row's values are its keys' leading values: its bits are the latent's (value_bits is None).
        ("output_err_mean", "output relative L2 error, mean", "bits per value, (K + V) / 2, everything stored",
         lambda r: r["key_bits"] if r.get("latent") else (r["key_bits"] + r["value_bits"]) / 2),
    ]
    pairs = list(dict.fromkeys(f"{r['key']}{'+center' if r['key_centered'] else ''}/{r['value']}"
                               for r in rows if not r["error"]))
    marker = {p: MARKERS[i % len(MARKERS)] for i, p in enumerate(pairs)}
    fig, axes = plt.subplots(len(metrics), len(datasets), figsize=(5.5 * len(datasets) + 2.6, 4.2 * len(metrics)),
                             squeeze=False)
    for col, name in enumerate(datasets):
        points = [r for r in rows if r["dataset"] == name and not r["error"]]
        for row_i, (metric, label, x_label, x_of) in enumerate(metrics):
            ax = axes[row_i][col]
            ys = [r[metric] for r in points if r[metric] and r[metric] > 0]
            top = max(ys, default=1.0)
            # The floor: the least error within 5 decades of the largest (f16's 1e-8 would stretch the axis).
            floor = min((y for y in ys if y >= top * 1e-5), default=top * 1e-5) / 2
            for r in points:
                pair = f"{r['key']}{'+center' if r['key_centered'] else ''}/{r['value']}"
                y = r[metric] or 0.0
                below = y < floor
                colour = family(pair)[1]
                ax.scatter(x_of(r), max(y, floor), s=36, marker=marker[pair], edgecolors=colour,
                           facecolors="none" if below else colour, linewidths=1.2, zorder=3)
            ax.set_yscale("log")
            ax.set_ylim(floor / 1.5, top * 2)
            ax.set_xlabel(x_label)
            ax.set_ylabel(label, fontsize=9)
            ax.set_title(_short(name))
            ax.grid(True, which="both", alpha=0.3)
    handles = [plt.Line2D([], [], ls="", marker=marker[p], ms=7, color=family(p)[1], label=p) for p in pairs]
    families = list(dict.fromkeys(family(p) for p in pairs))
    handles += [plt.Line2D([], [], ls="", marker="s", ms=9, color=c, label=f"family: {n}") for n, c in families]
    handles.append(plt.Line2D([], [], ls="", marker="o", ms=7, mfc="none", color="grey", label="below the axis (drawn on it)"))
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 2.5 / fig.get_size_inches()[0], 1))
    fig.savefig(path, dpi=120, format=os.path.splitext(path)[1].lower().lstrip(".").replace("jpg", "jpeg"))
    plt.close(fig)
