#!/usr/bin/env python3
"""Small network agent for the kube-proxy side-by-side harness; runs under `ip netns exec`.

serve NAME PORT...   TCP and UDP echo on every PORT, IPv4 and IPv6. Each answer is one line,
                     "NAME PEER_IP PORT" (the pod's name, the source address it saw and the port
                     that answered), so a test knows which pod answered, on which port, and
                     whether the source was masqueraded. Also a line echo on TCP port
                     LINE_PORT (8090): the connection stays open and each line received is
                     answered with "NAME PEER_IP LINE", for tests that hold one connection
                     across changes. Prints "ready" once listening.
probe COUNT TIMEOUT FIRST_ALONE TARGET...   TARGET is proto:addr:port (IPv6 addresses in
                     brackets). Prints one JSON line per target: {"target": T, "answers": [...]},
                     each answer the server's line, "REFUSED" or "TIMEOUT". All attempts run at
                     once, so a target that times out costs one timeout, not COUNT; with
                     FIRST_ALONE=1 the first attempt to a target runs alone before the others (so
                     that a ClientIP affinity entry exists before they start).
seq COUNT TIMEOUT TARGET [SOURCE]   COUNT attempts one after another (each a new connection,
                     the next one starting when the last one ended), from SOURCE when given (an
                     address of this namespace to bind to). Prints one JSON line like probe's,
                     with the answers in the order they came: for schedulers that pick by turn
                     or by the client's address, where the order and the source matter.
"""
import json
import selectors
import socket
import sys
import threading

# The port of the line echo: connections stay open and every line is answered.
LINE_PORT = 8090


def serve(name, ports):
    sel = selectors.DefaultSelector()
    for port in ports:
        for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            for typ in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = socket.socket(fam, typ)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if fam == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((addr, port))
                if typ == socket.SOCK_STREAM:
                    s.listen(128)
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, (typ, port))
    for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((addr, LINE_PORT))
        s.listen(128)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, ("line-listen", LINE_PORT))
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            typ, port = key.data
            try:
                if typ == "line-listen":
                    c, peer = s.accept()
                    c.setblocking(False)
                    sel.register(c, selectors.EVENT_READ, ("line", (peer[0], b"")))
                elif typ == "line":
                    peer, held = port
                    data = s.recv(4096)
                    if not data:
                        sel.unregister(s)
                        s.close()
                        continue
                    held += data
                    while b"\n" in held:
                        line, held = held.split(b"\n", 1)
                        s.sendall(f"{name} {peer} {line.decode(errors='replace')}\n".encode())
                    sel.modify(s, selectors.EVENT_READ, ("line", (peer, held)))
                elif typ == socket.SOCK_STREAM:
                    c, peer = s.accept()
                    c.setblocking(True)
                    c.settimeout(2)
                    c.sendall(f"{name} {peer[0]} {port}\n".encode())
                    c.close()
                else:
                    _, peer = s.recvfrom(2048)
                    s.sendto(f"{name} {peer[0]} {port}\n".encode(), peer)
            except OSError:
                if typ == "line":
                    sel.unregister(s)
                    s.close()


def parse_target(t):
    proto, rest = t.split(":", 1)
    addr, port = rest.rsplit(":", 1)
    fam = socket.AF_INET
    if addr.startswith("["):
        addr, fam = addr[1:-1], socket.AF_INET6
    return proto, fam, addr, int(port)


def attempt(target, timeout, source=None):
    proto, fam, addr, port = parse_target(target)
    typ = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(fam, typ)
    s.settimeout(timeout)
    try:
        if source:
            s.bind((source, 0))
        s.connect((addr, port))
        if typ == socket.SOCK_DGRAM:
            s.send(b"hello\n")
            data = s.recv(2048)
        else:
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(2048)
                if not chunk:
                    break
                data += chunk
        line = data.decode().strip()
        return line if line else "EMPTY"
    except ConnectionRefusedError:
        return "REFUSED"
    except (socket.timeout, TimeoutError):
        return "TIMEOUT"
    except OSError as e:
        return f"ERROR {e.errno}"
    finally:
        s.close()


def probe(count, timeout, first_alone, targets):
    results = {t: [] for t in targets}
    lock = threading.Lock()

    def run(t):
        a = attempt(t, timeout)
        with lock:
            results[t].append(a)

    def per_target(t):
        n = count
        if first_alone:
            run(t)
            n -= 1
        rest = [threading.Thread(target=run, args=(t,)) for _ in range(n)]
        for th in rest:
            th.start()
        for th in rest:
            th.join()

    threads = [threading.Thread(target=per_target, args=(t,)) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in targets:
        print(json.dumps({"target": t, "answers": results[t]}))


def seq(count, timeout, target, source):
    answers = [attempt(target, timeout, source) for _ in range(count)]
    print(json.dumps({"target": target, "answers": answers}))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], [int(p) for p in sys.argv[3:]])
    elif sys.argv[1] == "probe":
        probe(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:])
    elif sys.argv[1] == "seq":
        seq(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
