#!/usr/bin/env python3
"""Groups heap bytes live at dhat's global maximum (t-gmax) by component; prints Markdown.

usage: dh_group.py LABEL DHAT_BASE N_BASE DHAT_MANY N_MANY

Two runs of the same load with N_BASE and N_MANY units held (idle tunnels or agents); each
allocation site's bytes at t-gmax are compared, and (many - base) / (N_MANY - N_BASE) is the
cost of one unit, so the server's fixed heap (startup, the one upstream agent) drops out.
A site is charged to the first frame, from the allocation outwards, that is not the
allocator or a generic container (alloc/core/std, hashbrown, bytes, slab, ...).
"""
import json
import re
import sys
from collections import defaultdict

label = sys.argv[1]
base_path, n_base, many_path, n_many = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])

GENERIC = re.compile(
    r"^(<)?(malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|__rust_|__rdl_|__rg_|"
    r"alloc::|core::|std::|hashbrown::|bytes::|slab::|indexmap::|smallvec::|<alloc::|<core::|<std::|"
    r"<hashbrown::|<bytes::|<slab::|<indexmap::|<smallvec::|<T as |<\[T\]|<&|<F as |<Q as |<A as |"
    r"<I as |<Box<|<\(|\{\{closure\}\}|<mut |<dyn )"
)


def parse_frame(fr):
    m = re.match(r"0x[0-9A-Fa-f]+: (.*?) \((?:in )?([^()]*)\)$", fr)
    if not m:
        return fr, ""
    return m.group(1), m.group(2)


def crate_of(fn):
    s = fn.lstrip("<&*")
    s = re.sub(r"^(mut |dyn |const )+", "", s)
    return s.split("::", 1)[0] if "::" in s else s


def component(frames):
    fns = [parse_frame(f)[0] for f in frames]
    i = 0
    while i < len(fns) and GENERIC.match(fns[i]):
        i += 1
    if i >= len(fns):
        return "std/other (no owner frame)", fns[-1] if fns else "?"
    fn = fns[i]
    c = crate_of(fn)
    site = fn
    if c == "tokio" and ("runtime::task" in fn or "task::spawn" in fn or "JoinSet" in fn or "runtime::handle" in fn or "runtime::scheduler" in fn and "spawn" in fn):
        j = i
        while j < len(fns) and (GENERIC.match(fns[j]) or crate_of(fns[j]) in ("tokio", "tokio_util")):
            j += 1
        owner = fns[j] if j < len(fns) else "?"
        oc = crate_of(owner)
        return f"task futures (spawned by {oc})", owner
    if c == "tokio":
        if "sync" in fn:
            return "tokio: channels/sync", site
        if "io::scheduled_io" in fn or "io::registration" in fn or "runtime::io" in fn or "PollEvented" in fn:
            return "tokio: I/O registration", site
        if "time" in fn:
            return "tokio: timers", site
        return "tokio: other", site
    if c == "h2":
        if "hpack" in fn:
            return "h2: HPACK tables/buffers", site
        if "codec" in fn or "frame" in fn:
            return "h2: codec read/write buffers", site
        if "streams" in fn:
            return "h2: stream state", site
        return "h2: connection", site
    if c in ("hyper", "hyper_util"):
        return "hyper/hyper-util (server conn)", site
    if c == "tonic":
        if "codec" in fn:
            return "tonic: codec buffers", site
        return "tonic: transport/server", site
    if c in ("rustls", "rustls_webpki", "webpki", "ring", "tokio_rustls", "rustls_pki_types"):
        return "TLS: rustls session/buffers", site
    if c in ("prost", "tonic_prost"):
        return "prost (decoded messages)", site
    if c in ("tower", "tower_layer", "tower_service", "axum", "axum_core"):
        return "tower/axum (router, layers)", site
    if c in ("loona_hpack",):
        return "ours: authority mending (loona_hpack decoder)", site
    if c == "konnectivity_server":
        r = fn.split("::", 1)[1] if "::" in fn else fn
        if r.startswith("authority"):
            return "ours: authority mending", site
        if r.startswith("tunnel"):
            return "ours: tunnel queues", site
        if r.startswith("backend"):
            return "ours: backend route tables", site
        if r.startswith("frontend"):
            return "ours: frontend", site
        if r.startswith("listen"):
            return "ours: listen (accept, TLS handshake)", site
        if r.startswith("agent_service"):
            return "ours: agent_service", site
        if r.startswith("proto"):
            return "prost (decoded messages)", site
        if r.startswith("metrics"):
            return "metrics", site
        return "ours: " + r.split("::")[0], site
    if c in ("prometheus",):
        return "metrics", site
    if c in ("tracing", "tracing_core", "tracing_subscriber"):
        return "tracing (logging)", site
    if c in ("http", "http_body", "http_body_util"):
        return "http types (headers, extensions)", site
    if c in ("tokio_util", "tokio_stream", "futures_util", "futures_channel"):
        return "futures/tokio-util/tokio-stream", site
    return "other: " + c, site


def load(path):
    d = json.load(open(path))
    ftbl = d["ftbl"]
    out = defaultdict(lambda: [0, 0])
    sites = defaultdict(lambda: [0, 0])
    for pp in d["pps"]:
        frames = [ftbl[i] for i in pp["fs"]]
        comp, site = component(frames)
        out[comp][0] += pp["gb"]
        out[comp][1] += pp["gbk"]
        sites[(comp, site)][0] += pp["gb"]
        sites[(comp, site)][1] += pp["gbk"]
    return out, sites, d


if base_path == "-":  # no baseline run: the whole heap at t-gmax
    b, bs = defaultdict(lambda: [0, 0]), {}
else:
    b, bs, _ = load(base_path)
m, ms, _ = load(many_path)
dn = n_many - n_base
tot_b = sum(v[0] for v in b.values())
tot_m = sum(v[0] for v in m.values())
print(f"Heap live at t-gmax: {tot_b:,} B with {n_base} {label}s held, {tot_m:,} B with {n_many}; "
      f"**{(tot_m - tot_b) / dn:,.0f} B per {label}** (requested bytes; allocator rounding and "
      f"fragmentation, thread stacks and kernel memory are not in it).\n")
print(f"| component | bytes per {label} | blocks per {label} | top allocation sites (bytes per {label}) |")
print("|---|---:|---:|---|")
rows = []
for comp in set(b) | set(m):
    db = (m[comp][0] - b[comp][0]) / dn
    dk = (m[comp][1] - b[comp][1]) / dn
    rows.append((comp, db, dk))
rows.sort(key=lambda x: -x[1])
for comp, db, dk in rows:
    if abs(db) < 8:
        continue
    sl = []
    for (c, site), (gb, gbk) in ms.items():
        if c != comp:
            continue
        d0 = (gb - bs.get((c, site), [0, 0])[0]) / dn
        sl.append((site, d0))
    sl.sort(key=lambda x: -x[1])
    tops = "; ".join(f"`{re.sub(r'[|`]', '', s)[:80]}` {v:,.0f}" for s, v in sl[:3] if v >= 8)
    print(f"| {comp} | {db:,.0f} | {dk:.1f} | {tops} |")
