#!/usr/bin/env python3
"""Groups a callgrind dump's instruction counts (Ir) by component; prints Markdown.

usage: cg_group.py CALLGRIND_OUT COUNT [LABEL]

Self cost: every cost line is charged to the source file it came from (inlined code keeps its
own file through fi=/fe=, so a fat-LTO build with line tables still splits by crate); code from
the standard library (core/alloc/std, hashbrown) is charged to the crate of the function it was
compiled into, so a Vec grown by h2 counts as h2. Inclusive cost (self + callees, from the
calls= lines) is listed for the entry points that name a layer. Per-unit = total / COUNT.
"""
import re
import sys
from collections import defaultdict

path, count = sys.argv[1], int(sys.argv[2])
label = sys.argv[3] if len(sys.argv) > 3 else "tunnel"

names = {"fl": {}, "fn": {}, "ob": {}}


def name_of(kind, rest):
    # "(id) name" defines, "(id)" refers
    m = re.match(r"\((\d+)\)(?:\s+(.*))?$", rest)
    if not m:
        return rest
    key, nm = m.group(1), m.group(2)
    table = names["fl" if kind in ("fl", "fi", "fe", "cfi", "cfl") else "fn" if kind in ("fn", "cfn") else "ob"]
    if nm is not None:
        table[key] = nm
    return table.get(key, "?")


self_file_fn = defaultdict(int)  # (file, fn, ob) -> Ir
calls_from = defaultdict(int)  # fn -> Ir of its calls (inclusive of callees)
self_fn = defaultdict(int)
total = 0
cur = {"ob": "", "fl": "", "fi": None, "fn": ""}
skip_next = False
with open(path, errors="replace") as f:
    for line in f:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        if skip_next:
            # the cost line after calls= is the callee's inclusive cost
            parts = line.split()
            if len(parts) >= 2:
                calls_from[cur["fn"]] += int(parts[1])
            skip_next = False
            continue
        m = re.match(r"^(ob|fl|fi|fe|fn|cob|cfi|cfl|cfn)=(.*)$", line)
        if m:
            kind, rest = m.group(1), m.group(2)
            nm = name_of(kind, rest)
            if kind == "ob":
                cur["ob"] = nm
            elif kind == "fl":
                cur["fl"] = nm
                cur["fi"] = None
            elif kind in ("fi", "fe"):
                cur["fi"] = nm
            elif kind == "fn":
                cur["fn"] = nm
                cur["fi"] = None
            continue
        if line.startswith("calls="):
            skip_next = True
            continue
        if line[0] in "0123456789+-*":
            parts = line.split()
            if len(parts) < 2:
                continue
            ir = int(parts[1])
            total += ir
            fl = cur["fi"] or cur["fl"]
            self_file_fn[(fl, cur["fn"], cur["ob"])] += ir
            self_fn[cur["fn"]] += ir
            continue


def fn_crate(fn):
    s = fn.lstrip("<&*")
    s = re.sub(r"^(mut |dyn |const )+", "", s)
    return s.split("::", 1)[0] if "::" in s else s


def crate_of_file(fl):
    m = re.search(r"/registry/src/[^/]+/([A-Za-z0-9_\-]+?)-\d+\.\d+[^/]*/(.*)$", fl)
    if m:
        return m.group(1).replace("-", "_"), m.group(2)
    if "jemalloc" in fl:
        return "jemalloc", fl
    m = re.search(r"/(?:build|out)/.*?/out/(.*)$", fl)
    if m:
        return "generated", m.group(1)
    m = re.search(r"/work/[^/]+/src/(.*)$", fl)
    if m:
        return "ours", m.group(1)
    m = re.search(r"/rustc/[0-9a-f]+/library/([a-z_]+)/", fl)
    if m:
        return "std", fl
    if "jemalloc" in fl:
        return "jemalloc", fl
    return None, fl


def component(fl, fn, ob):
    crate, rel = crate_of_file(fl)
    if crate in (None, "std", "hashbrown", "generated") or fl == "???":
        if crate == "generated" or ("konnectivity_server::proto" in fn):
            return "prost encode/decode (generated)"
        if "libc.so" in (ob or "") or "ld-linux" in (ob or ""):
            if re.search(r"mem(cpy|move|set|cmp)|str", fn):
                return "libc memcpy/memset"
            return "libc (syscall wrappers, other)"
        if "jemalloc" in fn or fn.startswith("_rjem") or "malloc" in fn or fn.startswith("__rust_"):
            return "allocator (jemalloc)"
        c = fn_crate(fn)
        if c in ("core", "alloc", "std", "hashbrown", "?", "") or c.startswith("0x"):
            return "std (not attributable)"
        crate, rel = c, fn
    rel = rel or ""
    if crate == "jemalloc" or crate.startswith("tikv_jemalloc"):
        return "allocator (jemalloc)"
    if crate in ("rustls", "rustls_webpki", "webpki"):
        return "TLS: rustls"
    if crate in ("ring",):
        return "TLS: ring (crypto)"
    if crate == "tokio_rustls":
        return "TLS: tokio-rustls glue"
    if crate == "h2":
        if "hpack" in rel:
            return "h2: HPACK"
        if "codec" in rel or "frame" in rel:
            return "h2: frames/codec"
        if "proto/streams" in rel or "proto::streams" in rel:
            return "h2: streams"
        return "h2: connection/other"
    if crate in ("hyper", "hyper_util"):
        return "hyper/hyper-util"
    if crate == "tonic":
        if "codec" in rel:
            return "tonic: codec"
        return "tonic: transport/server"
    if crate in ("tower", "tower_layer", "tower_service", "tower_http", "axum", "axum_core", "matchit"):
        return "tower/axum (router, layers)"
    if crate in ("prost", "tonic_prost"):
        return "prost encode/decode (generated)"
    if crate == "tokio":
        if "runtime" in rel and ("scheduler" in rel or "task" in rel or "context" in rel or "park" in rel or "driver" in rel):
            if "io" in rel and "driver" in rel:
                return "tokio: I/O driver (epoll)"
            return "tokio: scheduler/tasks/wake-ups"
        if "runtime" in rel and "io" in rel:
            return "tokio: I/O driver (epoll)"
        if "sync" in rel:
            return "tokio: sync (channels, notify)"
        if "time" in rel:
            return "tokio: timers"
        return "tokio: net/io/other"
    if crate in ("tokio_util", "tokio_stream", "futures_util", "futures_core", "futures_channel", "futures"):
        return "futures/tokio-util/tokio-stream"
    if crate in ("bytes",):
        return "bytes"
    if crate in ("http", "http_body", "http_body_util", "httparse"):
        return "http types"
    if crate in ("tracing", "tracing_core", "tracing_subscriber"):
        return "tracing (logging)"
    if crate in ("prometheus",):
        return "metrics (prometheus)"
    if crate in ("ours", "konnectivity_server"):
        r = rel.replace("::", "/")
        r = re.sub(r"^konnectivity_server/", "", r)
        if r.startswith("authority") or r.startswith("hpack"):
            return "ours: authority mending (authority.rs, hpack.rs)"
        if r.startswith("frontend"):
            return "ours: frontend/"
        if r.startswith("backend"):
            return "ours: backend/"
        if r.startswith("tunnel"):
            return "ours: tunnel.rs (queues)"
        if r.startswith("listen"):
            return "ours: listen.rs (accept)"
        if r.startswith("agent_service"):
            return "ours: agent_service.rs"
        if r.startswith("metrics"):
            return "metrics (prometheus)"
        if r.startswith("proto") or "proto" in r:
            return "prost encode/decode (generated)"
        return "ours: other (%s)" % r.split("/")[0].split(".")[0]
    if crate == "loona_hpack":
        return "ours: authority mending (loona_hpack)"
    if crate in ("socket2", "mio", "libc"):
        return "tokio: net/io/other"
    if crate in ("slab", "indexmap", "smallvec", "fnv", "parking_lot", "parking_lot_core", "lock_api", "crossbeam_utils", "arc_swap"):
        return "misc collections/locks (%s)" % crate
    return "other: %s" % crate


groups = defaultdict(int)
detail = defaultdict(lambda: defaultdict(int))
for (fl, fn, ob), ir in self_file_fn.items():
    c = component(fl, fn, ob)
    groups[c] += ir
    detail[c][fn] += ir

print(f"Self instructions (Ir) per {label}, by component: {total:,} Ir in the dump over {count} {label}s "
      f"= **{total / count:,.0f} Ir per {label}** (user space only; the kernel's share of a syscall is not counted).\n")
print(f"| component | Ir per {label} | share | top functions (self) |")
print("|---|---:|---:|---|")
for c, ir in sorted(groups.items(), key=lambda x: -x[1]):
    if ir / count < 500:
        continue
    top = sorted(detail[c].items(), key=lambda x: -x[1])[:2]
    tops = "; ".join(f"`{re.sub(r'[|`]', '', fn)[:70]}` {v / count:,.0f}" for fn, v in top)
    print(f"| {c} | {ir / count:,.0f} | {100 * ir / total:.1f}% | {tops} |")
small = sum(ir for ir in groups.values() if ir / count < 500)
print(f"| (components under 500 Ir each) | {small / count:,.0f} | {100 * small / total:.1f}% | |")

# Inclusive cost of entry points that name a layer (self + everything they call).
entries = [
    ("frontend connection reads (listen::Tracked, incl. authority)", r"konnectivity_server::listen::Tracked"),
    ("authority mending (AuthorityScrub)", r"konnectivity_server::authority::"),
    ("rustls: read/decrypt + write/encrypt", r"^rustls::conn::"),
    ("h2 codec: FramedRead poll_next", r"h2::codec::framed_read::FramedRead<.*>.*poll_next|h2::codec::framed_read::decode_frame"),
    ("h2 HPACK decoder", r"h2::hpack::decoder::Decoder::decode"),
    ("h2 HPACK encoder", r"h2::hpack::encoder::Encoder::encode"),
    ("our Proxy handler (frontend::grpc)", r"konnectivity_server::frontend::grpc::"),
    ("dial (frontend::dial)", r"konnectivity_server::frontend::dial::"),
    ("backend dispatch (agent packets)", r"konnectivity_server::backend::dispatch::"),
    ("prost decode/encode", r"prost::encoding::|::merge_field|as prost::message::Message"),
    ("tokio worker: run a task", r"tokio::runtime::scheduler::multi_thread::worker::Context::run_task"),
    ("tokio: I/O driver turn", r"tokio::runtime::io::driver::Driver::turn"),
    ("jemalloc malloc/free", r"^_rjem_|^je_|jemalloc"),
]
incl = {}
for fn, s in self_fn.items():
    incl[fn] = s + calls_from.get(fn, 0)
print(f"\nInclusive Ir per {label} of functions matching each entry (max over matching functions; "
      "self + callees; recursion can overcount):\n")
print(f"| entry point | Ir per {label} | function |")
print("|---|---:|---|")
for what, rx in entries:
    cands = [(fn, v) for fn, v in incl.items() if re.search(rx, fn)]
    if not cands:
        print(f"| {what} | n/a | |")
        continue
    fn, v = max(cands, key=lambda x: x[1])
    print(f"| {what} | {v / count:,.0f} | `{re.sub(r'[|`]', '', fn)[:90]}` |")
