#!/usr/bin/env python3
"""Traffic through a kube-proxy Service for the packaging tests (packaging/nspawn, packaging/oci);
runs in a network namespace (`ip netns exec`). Standard library only.

serve NAME PORT
    TCP server on PORT (IPv4). A connection is answered line by line: each line it receives
    comes back as "NAME PEER_IP LINE", so a client knows which pod answered and whether its
    address was masqueraded. Prints "ready" once listening.

once TARGET TIMEOUT
    One connection to TARGET (ip:port): sends "hello", prints the answer (exit 0), or the
    error (exit 1).

hold COUNT TARGET STOPFILE
    COUNT long-lived connections to TARGET. Each sends a numbered line every 100 ms and waits up
    to 2 s for its echo; a connection that errors, closes, times out or gets a wrong answer is
    broken (and not reopened). Runs until STOPFILE exists, then prints one JSON line:
    {"connections": COUNT, "ok": [lines echoed per connection], "broken": [reasons],
     "max_wait_ms": the longest wait for an echo}. Prints "open" once every connection has had
    its first echo (or broke trying).

dial TARGET STOPFILE
    A new connection to TARGET every 50 ms, each one "hello" and its answer (timeout 2 s), until
    STOPFILE exists; prints {"ok": N, "failed": N, "errors": [the first few]}.
"""
import json
import os
import socket
import sys
import threading
import time

INTERVAL = 0.1
ECHO_TIMEOUT = 2.0


def parse(target):
    addr, port = target.rsplit(":", 1)
    return addr, int(port)


def serve(name, port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(256)
    print("ready", flush=True)

    def handle(conn, peer):
        with conn:
            f = conn.makefile("rb")
            try:
                for line in f:
                    conn.sendall(f"{name} {peer[0]} {line.decode().strip()}\n".encode())
            except OSError:
                pass

    while True:
        conn, peer = srv.accept()
        threading.Thread(target=handle, args=(conn, peer), daemon=True).start()


def exchange(sock, f, text):
    sock.sendall(f"{text}\n".encode())
    line = f.readline()
    if not line:
        raise ConnectionError("closed by the peer")
    words = line.decode().split()
    if len(words) < 3 or words[-1] != text:
        raise ConnectionError(f"wrong answer {line!r}")
    return words


def once(target, timeout):
    try:
        with socket.create_connection(parse(target), timeout=float(timeout)) as s:
            words = exchange(s, s.makefile("rb"), "hello")
            print(" ".join(words))
            return 0
    except (OSError, ConnectionError) as e:
        print(f"ERROR {e}")
        return 1


def hold(count, target, stopfile):
    ok = [0] * count
    broken = []
    waits = [0.0]
    lock = threading.Lock()
    opened = threading.Barrier(count + 1)

    def run(i):
        first = True
        try:
            with socket.create_connection(parse(target), timeout=ECHO_TIMEOUT) as s:
                f = s.makefile("rb")
                n = 0
                while True:
                    t0 = time.monotonic()
                    exchange(s, f, f"c{i}-{n}")
                    with lock:
                        ok[i] += 1
                        waits[0] = max(waits[0], time.monotonic() - t0)
                    if first:
                        first = False
                        opened.wait()
                    if os.path.exists(stopfile):
                        return
                    n += 1
                    time.sleep(INTERVAL)
        except (OSError, ConnectionError) as e:
            with lock:
                broken.append(f"connection {i} after {ok[i]} echoes: {e}")
            if first:
                opened.wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    opened.wait()
    print("open", flush=True)
    for t in threads:
        t.join()
    print(json.dumps({"connections": count, "ok": ok, "broken": broken,
                      "max_wait_ms": round(waits[0] * 1000)}), flush=True)


def dial(target, stopfile):
    ok, failed, errors = 0, 0, []
    while not os.path.exists(stopfile):
        try:
            with socket.create_connection(parse(target), timeout=ECHO_TIMEOUT) as s:
                exchange(s, s.makefile("rb"), "hello")
            ok += 1
        except (OSError, ConnectionError) as e:
            failed += 1
            if len(errors) < 5:
                errors.append(f"{time.strftime('%H:%M:%S')} {e}")
        time.sleep(0.05)
    print(json.dumps({"ok": ok, "failed": failed, "errors": errors}), flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve(args[0], int(args[1]))
    elif mode == "once":
        sys.exit(once(args[0], args[1]))
    elif mode == "hold":
        hold(int(args[0]), args[1], args[2])
    elif mode == "dial":
        dial(args[0], args[1])
    else:
        sys.exit(f"unknown mode {mode}")
