#!/usr/bin/env python3
"""Draws benches/ratios.png from the ratios.csv konn_bench writes.

Left: advantage factor of ours over Go per metric (ours/Go for higher-is-better metrics,
Go/ours for lower-is-better ones; > 1 = ours better, log scale), with the issue's target or
aim as a marker. Right: head-of-line throughput share for both servers with the 90% line.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst, title):
    rows = list(csv.DictReader(open(src)))
    bars, hol = [], None
    for r in rows:
        if "share" in r["label"]:
            hol = r
            continue
        if not r["ratio"]:
            continue
        ratio = float(r["ratio"])
        if ratio <= 0:
            continue
        hb = r["higher_better"] == "true"
        adv = ratio if hb else 1.0 / ratio
        tgt = None
        if r["target"]:
            t = float(r["target"])
            tgt = t if hb else 1.0 / t
        bars.append((r["label"], adv, tgt))

    fig, (ax, ax2) = plt.subplots(
        1, 2, figsize=(13, 0.42 * max(len(bars), 6) + 1.6),
        gridspec_kw={"width_ratios": [4, 1]})
    labels = [b[0] for b in bars][::-1]
    advs = [b[1] for b in bars][::-1]
    colors = ["tab:green" if a >= 1 else "tab:red" for a in advs]
    y = range(len(bars))
    ax.barh(list(y), advs, color=colors, alpha=0.8)
    for i, b in enumerate(bars[::-1]):
        if b[2] is not None:
            ax.plot([b[2]], [i], marker="|", markersize=18, color="black", mew=2)
        ax.text(b[1], i, f"  {b[1]:.2f}x", va="center", fontsize=8)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="gray", lw=1)
    ax.set_xlabel("advantage of ours over Go (x, log; >1 = ours better; | = target/aim)")
    ax.set_title(title, fontsize=10)

    if hol is not None and (hol["ours"] or hol["go"]):
        vals = [float(hol["ours"] or 0), float(hol["go"] or 0)]
        ax2.bar(["ours", "Go"], vals, color=["tab:blue", "tab:gray"])
        for i, v in enumerate(vals):
            ax2.text(i, v, f"{v:.0f}%", ha="center", va="bottom", fontsize=9)
        ax2.axhline(90, color="black", ls="--", lw=1)
        ax2.set_ylim(0, max(110, max(vals) * 1.1))
        ax2.set_title("head-of-line: active share %\n(target >= 90%)", fontsize=9)
    else:
        ax2.axis("off")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "konnectivity-server vs Go proxy-server")
