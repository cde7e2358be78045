"""What kvq's plots share (kvq table --plot, kvq eval --plot): a colour per codec family, markers per pair."""

from __future__ import annotations

# Codec families, each a colour: the ggml blocks, rotated, centered, per-channel keys, polar, turbo.
FAMILIES = [("turbo", "turbo", "tab:red"), ("polar", "polar", "tab:purple"), ("chan", "per-channel keys", "tab:brown"),
            ("+center", "centered keys", "tab:green"), ("+rot", "rotated", "tab:orange"), ("", "ggml blocks", "tab:blue")]
MARKERS = "osD^v<>pPX*hH8d"


def family(pair: str) -> tuple[str, str]:
    """The (name, colour) of a K/V pair's family: the first of FAMILIES whose tag the pair's key or value has."""
    return next((name, colour) for tag, name, colour in FAMILIES if tag in pair)
