#!/usr/bin/env python3
"""Puts the first numeric column of two tables from cpu.sh / heap.sh side by side.

usage: compare.py BEFORE.md AFTER.md [UNIT]   (rows matched by their first cell; Markdown out)
"""
import re
import sys


def tables(path):
    """Every Markdown table in the file: list of (header, {first cell: second cell})."""
    out, cur, header = [], None, None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cur is None:
                cur, header = {}, cells
                out.append((header, cur))
            elif not re.match(r"^-+:?$", cells[0]):
                cur[cells[0]] = cells[1]
        else:
            cur = None
    return out


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


before, after = tables(sys.argv[1]), tables(sys.argv[2])
for (hb, b), (_, a) in zip(before, after):
    print(f"| {hb[0]} | before: {hb[1]} | after | change |")
    print("|---|---:|---:|---:|")
    keys = list(dict.fromkeys(list(b) + list(a)))
    keys.sort(key=lambda k: -(num(b.get(k, "0")) or 0))
    for k in keys:
        vb, va = b.get(k, "–"), a.get(k, "–")
        nb, na = num(vb), num(va)
        ch = f"{na - nb:+,.0f}" if nb is not None and na is not None else ""
        print(f"| {k} | {vb} | {va} | {ch} |")
    print()
