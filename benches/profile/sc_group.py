#!/usr/bin/env python3
"""Per-tunnel system calls from a `perf trace -s` summary and a `perf stat` file.

usage: sc_group.py TRACE STAT COUNT LABEL   (Markdown out; see syscalls.sh)

The trace summary has one table per thread; calls are summed over threads and divided by
COUNT. `errors` are calls that returned an error, almost all EAGAIN: a read or accept that
found nothing, which is what an edge-triggered reactor pays to learn that a socket is drained.
"""
import re
import sys
from collections import defaultdict

THREAD = re.compile(r"^ (.+?) \((\d+)\), (\d+) events")
ROW = re.compile(r"^\s+([a-z_0-9]+)\s+(\d+)\s+(\d+)\s+[\d.]+")


def trace(path):
    calls, errors, by_thread = defaultdict(int), defaultdict(int), defaultdict(int)
    thread = None
    for line in open(path):
        m = THREAD.match(line)
        if m:
            # Worker threads share a name; group them by it.
            thread = m.group(1)
            continue
        m = ROW.match(line)
        if m and thread is not None:
            name, n, err = m.group(1), int(m.group(2)), int(m.group(3))
            calls[name] += n
            errors[name] += err
            by_thread[thread] += n
    return calls, errors, by_thread


def stat(path):
    out = {}
    for line in open(path):
        m = re.match(r"^\s*([\d,.]+)\s+(?:msec\s+)?(raw_syscalls:sys_enter|context-switches|task-clock)", line)
        if m:
            out[m.group(2)] = float(m.group(1).replace(",", ""))
    return out


def main():
    trace_path, stat_path, count, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    calls, errors, by_thread = trace(trace_path)
    st = stat(stat_path)
    total = sum(calls.values())
    print(f"**{total / count:.1f} system calls per {label}** (`perf trace`, {total:,} over {count:,}; "
          f"`perf stat` counted {st.get('raw_syscalls:sys_enter', 0) / count:.1f}); "
          f"**{st.get('context-switches', 0) / count:.2f} context switches** per {label} (CPU "
          f"is not reported: tracing every call slows each one; `benches/run` measures it).\n")
    print(f"| system call | calls per {label} | of them failed (EAGAIN and the like) |")
    print("|---|---:|---:|")
    for name in sorted(calls, key=lambda n: -calls[n]):
        per = calls[name] / count
        if per < 0.05:
            continue
        print(f"| {name} | {per:.2f} | {errors[name] / count:.2f} |")
    rest = sum(v for n, v in calls.items() if v / count < 0.05) / count
    if rest:
        print(f"| (others, each < 0.05) | {rest:.2f} | |")
    print()
    print(f"| thread | calls per {label} |")
    print("|---|---:|")
    for name in sorted(by_thread, key=lambda n: -by_thread[n]):
        print(f"| {name} | {by_thread[name] / count:.2f} |")


if __name__ == "__main__":
    main()
