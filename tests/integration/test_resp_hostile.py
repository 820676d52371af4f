#!/usr/bin/env python3
"""Hostile clients against a real `kvferry resp` (master, node and door as
real processes on loopback; raw sockets, some bound to 127.0.0.2 and
other loopback addresses). Each case performs an attack and checks the
outcome by reply and by what the door's process shows (RssAnon from
/proc, the door's INFO counters, its log), then that a real client is
served:

- crash: two connections announce pool-sized bulks, a third sends PING
  with a 2,000-byte argument (before AUTH, and after AUTH with the pool
  really full): answered, the door alive;
- pool held: connections without the password cannot reserve pool
  space; an authenticated SET goes through;
- memory: unfinished nested arrays, and a bulk sent whole while the pool
  is full, do not grow the door;
- lock-out: 1,030 idle connections from one address, and from many
  addresses, do not keep a real client out; a connection that never
  authenticates is closed after resp_auth_timeout_ms; the per-address
  cap holds for authenticated connections too;
- AUTH guessing: wrong passwords a second from one address are bounded;
  a connection is closed after 3 wrong ones;
- slow readers: 24 readers of 16 MiB values that do not read hold at
  most resp_slow_mem (the rest are refused), bytes right for the others;
- the view lease: a GET sequence logs no lease warning on the door or
  the node;
- a door that lacks the master's secret refuses to start, saying why;
- HELLO as a RESP2-only Redis, MULTI/EXEC/DISCARD, and the NOAUTH
  reason in the door's log.

Run with KVF_BIN=<build>/kvferry; `--only NAME[,NAME]` runs some cases.
Exit 0 pass, 1 fail, 77 skip."""
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("KVF_BIN", "build/kvferry")
FAILS = []
PW = ""


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def auth():
    return cmd("AUTH", PW)


class Proc:
    """A kvferry daemon: its pid, its first stdout line's address, its
    stderr in a file."""

    def __init__(self, args, tag, env=None, tmp="/tmp"):
        fd, self.errfile = tempfile.mkstemp(prefix="kvf-%s-" % tag, dir=tmp)
        os.close(fd)
        self.err = open(self.errfile, "w")
        self.p = subprocess.Popen([BIN] + args, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True,
                                  env=dict(os.environ, **(env or {})))
        line = self.p.stdout.readline().strip()
        if not line.startswith(tag + "="):
            self.p.kill()
            raise SystemExit("%s did not start: %r %s" %
                             (args[0], line, self.log()[-2000:]))
        self.addr = line.split()[0].split("=", 1)[1]
        self.port = int(self.addr.rsplit(":", 1)[1])

    def alive(self):
        return self.p.poll() is None

    def rss_anon(self):
        """Anonymous resident memory in KiB (the door's own; a node's
        memory mapped for views is shared, counted apart)."""
        with open("/proc/%d/status" % self.p.pid) as f:
            for ln in f:
                if ln.startswith("RssAnon:"):
                    return int(ln.split()[1])
        return -1

    def log(self):
        if not self.err.closed:
            self.err.flush()
        with open(self.errfile) as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.close()
        return self.p.returncode


class Conn:
    """A raw RESP connection, optionally from another loopback address
    or with a small receive buffer."""

    def __init__(self, port, src=None, rcvbuf=0, timeout=10):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if src:
            self.s.bind((src, 0))
        self.s.settimeout(timeout)
        self.s.connect(("127.0.0.1", port))
        self.buf = b""

    def send(self, data):
        try:
            self.s.sendall(data)
            return True
        except OSError:
            return False

    def fill(self, n=1 << 16):
        b = self.s.recv(n)
        if not b:
            raise ConnectionError("closed")
        self.buf += b

    def line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def reply(self, chunk=1 << 16):
        """bytes for a bulk, None for nil, a list for an array, str for
        the others."""
        ln = self.line()
        if ln.startswith(b"*"):
            return [self.reply(chunk) for _ in range(int(ln[1:]))]
        if not ln.startswith(b"$"):
            return ln.decode(errors="replace")
        n = int(ln[1:])
        if n < 0:
            return None
        while len(self.buf) < n + 2:
            self.fill(chunk)
        v, self.buf = self.buf[:n], self.buf[n + 2:]
        return v

    def call(self, *args):
        self.send(cmd(*args))
        return self.reply()

    def closed_within(self, secs):
        """Whether the server closes the connection within secs (what it
        sent meanwhile is kept in buf)."""
        self.s.settimeout(0.2)
        end = time.time() + secs
        while time.time() < end:
            try:
                b = self.s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return True
            if not b:
                return True
            self.buf += b
        return False

    def close(self):
        self.s.close()


def served(port, src=None):
    """A real client: AUTH, SET, GET a value byte for byte."""
    try:
        c = Conn(port, src=src, timeout=5)
        v = os.urandom(3000)
        ok = c.call("AUTH", PW) == "+OK" and \
            c.call("SET", "real:client", v) == "+OK" and \
            c.call("GET", "real:client") == v
        c.close()
        return ok
    except (OSError, ConnectionError, ValueError):
        return False


def info(port):
    """The door's INFO fields (an authenticated connection)."""
    c = Conn(port)
    c.call("AUTH", PW)
    r = c.call("INFO")
    c.close()
    if not isinstance(r, bytes):
        return {}
    return dict(ln.split(":", 1) for ln in r.decode().split("\r\n")
                if ":" in ln)


def stopped(d):
    """Stops a door: it must exit 0 (under ASan, with nothing leaked)."""
    rc = d.stop()
    check(rc == 0, "door stops cleanly (rc %s)" % rc)


def door(master, tmp, *extra, env=None):
    return Proc(["resp", "--master", master, "--listen", "127.0.0.1:0"] +
                list(extra), "resp", env=env, tmp=tmp)


# ---- before AUTH: crash, pool held, memory ----------------------------


def test_crash(master, tmp):
    """Two connections announce bulks of half the pool each; a third
    sends PING with a 2,000-byte argument. Before AUTH the announcements
    are refused at once; after AUTH they fill the pool, and the PING is
    answered 'pool full' instead of copying from NULL."""
    d = door(master, tmp, "--pool", "64M", "--max-value", "32M")
    try:
        big = b"*2\r\n$4\r\nPING\r\n$%d\r\n" % (32 << 20)
        holders = [Conn(d.port) for _ in range(2)]
        for h in holders:
            h.send(big)
        arg = os.urandom(2000)
        c = Conn(d.port)
        c.send(cmd("PING", arg))
        r = c.reply() if d.alive() else None
        check(d.alive() and r == arg,
              "before AUTH: PING with 2,000 bytes answered beside two "
              "pool-sized announcements (door alive)")
        first = [h.closed_within(3) for h in holders]
        check(all(first) and all(h.buf.startswith(
            b"-ERR Protocol error: unauthenticated bulk length")
            for h in holders),
            "before AUTH: a bulk over 16 KiB is refused and closed")
        for h in holders:
            h.close()
        # after AUTH: two connections really fill the pool
        holders = [Conn(d.port) for _ in range(2)]
        for h in holders:
            h.send(auth() + big + b"x" * 1000)
            check(h.line() == b"+OK", "holder authenticated")
        time.sleep(0.3)
        c.send(auth() + cmd("PING", arg))
        r1 = c.reply() if d.alive() else None
        r2 = c.reply() if d.alive() else None
        check(d.alive() and r1 == "+OK" and
              isinstance(r2, str) and r2.startswith("-ERR value pool full"),
              "after AUTH, pool full: PING with 2,000 bytes answered "
              "'pool full', door alive (%r)" % (r2,))
        for h in holders:
            h.close()
        c.close()
        time.sleep(0.3)
        check(d.alive() and served(d.port), "a real client served after")
    except (OSError, ConnectionError) as e:
        check(False, "crash case: %r (door alive: %s)" % (e, d.alive()))
    finally:
        rc = d.stop()
        check(rc == 0, "door stops cleanly after the crash case (rc %s)" % rc)


def test_pool_held(master, tmp):
    """Connections without the password cannot hold the pool: with two
    of them announcing pool-sized bulks, an authenticated 1 MiB SET is
    stored, and the pool stays free."""
    d = door(master, tmp, "--pool", "64M", "--max-value", "32M")
    try:
        big = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (32 << 20)
        holders = [Conn(d.port) for _ in range(2)]
        for h in holders:
            h.send(big + b"x" * 100)
        time.sleep(0.3)
        c = Conn(d.port)
        v = os.urandom(1 << 20)
        c.send(auth() + cmd("SET", "held:1", v))
        r = (c.reply(), c.reply())
        check(r == ("+OK", "+OK"),
              "an authenticated 1 MiB SET beside two unauthenticated "
              "pool-sized announcements (%r)" % (r[1],))
        check(c.call("GET", "held:1") == v, "its value byte for byte")
        used = int(info(d.port).get("pool_used_bytes", -1))
        check(0 <= used < (8 << 20),
              "pool used by unauthenticated connections: %d bytes" % used)
        c.close()
        for h in holders:
            h.close()
    finally:
        stopped(d)


def nested_stream(n):
    """An array whose elements are arrays of 4,096 empty arrays, never
    finished: n of them (16 KiB each)."""
    inner = b"*4096\r\n" + b"*0\r\n" * 4096
    return b"*4096\r\n" + inner * n


def test_memory(master, tmp):
    """Unfinished nested arrays (about 15 MB sent, before and after AUTH)
    and a 32 MiB bulk sent whole while the pool is full do not grow the
    door; what they held is given back at close."""
    d = door(master, tmp, "--pool", "64M", "--max-value", "32M")
    try:
        served(d.port)
        rss0 = d.rss_anon()
        peak = rss0
        stream = nested_stream(950)  # 15.6 MB
        for pre in (b"", auth()):
            c = Conn(d.port)
            sent = 0
            c.s.settimeout(2)
            try:
                c.s.sendall(pre)
                for i in range(0, len(stream), 1 << 20):
                    c.s.sendall(stream[i:i + (1 << 20)])
                    sent += 1 << 20
                    peak = max(peak, d.rss_anon())
            except OSError:
                pass
            peak = max(peak, d.rss_anon())
            c.closed_within(2)
            got = c.buf
            c.close()
            # before AUTH its 4,096 elements are over the limit already
            want = b"expected '$', got '*'" if pre else \
                b"unauthenticated multibulk length"
            check(b"-ERR Protocol error: " + want in got,
                  "nested arrays %s AUTH: refused (%d MB taken before)" %
                  ("after" if pre else "before", sent >> 20))
        time.sleep(0.5)
        rss1 = d.rss_anon()
        check(peak - rss0 < 16 << 10 and rss1 - rss0 < 16 << 10,
              "nested arrays: door RssAnon %d -> peak %d -> %d KiB after "
              "close" % (rss0, peak, rss1))
        # the pool full: two authenticated holders; a 32 MiB SET sent
        # whole is dropped as it comes and answered 'pool full'
        announce = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (32 << 20)
        holders = [Conn(d.port) for _ in range(2)]
        for h in holders:
            h.send(auth() + announce + b"y" * 100)
            h.line()
        rss0 = d.rss_anon()
        c = Conn(d.port, timeout=60)
        v = os.urandom(32 << 20)
        c.send(auth() + cmd("SET", "full:big", v))
        r = (c.reply(), c.reply())
        rss1 = d.rss_anon()
        check(r[1].startswith("-ERR value pool full"),
              "a 32 MiB SET with the pool full: %r" % (r[1],))
        check(rss1 - rss0 < 16 << 10,
              "a 32 MiB bulk with the pool full: door RssAnon %d -> %d "
              "KiB" % (rss0, rss1))
        check(c.call("PING") == "+PONG", "its connection still served")
        for h in holders + [c]:
            h.close()
        check(served(d.port), "a real client served after")
    finally:
        stopped(d)


# ---- lock-out -------------------------------------------------------------


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, n))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def open_many(port, srcs, n):
    """n idle connections spread over the source addresses srcs (each
    connect may be refused); returns the sockets."""
    socks = []
    for i in range(n):
        try:
            socks.append(Conn(port, src=srcs[i % len(srcs)], timeout=5))
        except OSError:
            pass
    return socks


def test_lockout(master, tmp):
    """1,030 idle connections from 127.0.0.2, then from 40 addresses,
    then a real client from 127.0.0.1: served within a second. An idle
    connection that never gives the password is closed after
    resp_auth_timeout_ms; one address's authenticated connections are
    capped at resp_conns_per_addr."""
    if raise_nofile(4096) < 2200:
        print("skip lock-out: the descriptor limit is under 2200")
        return
    env = {"KVF_RESP_AUTH_TIMEOUT_MS": "2000",
           "KVF_RESP_CONNS_PER_ADDR": "64"}
    d = door(master, tmp, "--pool", "16M", env=env)
    try:
        for label, srcs in (("one address", ["127.0.0.2"]),
                            ("40 addresses",
                             ["127.0.1.%d" % i for i in range(1, 41)])):
            socks = open_many(d.port, srcs, 1030)
            t0 = time.time()
            ok = served(d.port)
            dt = time.time() - t0
            check(ok and dt < 1.0,
                  "1,030 idle connections from %s: a real client %s in "
                  "%.3f s" % (label, "served" if ok else "NOT served", dt))
            for s in socks:
                s.close()
            time.sleep(0.5)
        i = info(d.port)
        print("  refused per address %s, max clients %s, unauthenticated "
              "closed for room %s" % (i.get("refused_per_addr"),
                                      i.get("refused_max_clients"),
                                      i.get("unauth_evicted")))
        # the AUTH deadline
        c = Conn(d.port)
        t0 = time.time()
        closed = c.closed_within(6)
        dt = time.time() - t0
        check(closed and 1.5 < dt < 4.5 and c.buf.startswith(b"-ERR no AUTH"),
              "an idle unauthenticated connection closed after %.1f s "
              "(resp_auth_timeout_ms 2000): %r" % (dt, c.buf[:40]))
        c.close()
        # authenticated connections from one address: capped at 64
        socks = []
        refused = 0
        for _ in range(70):
            try:
                s = Conn(d.port, src="127.0.0.3", timeout=5)
                s.send(auth())
                r = s.line()
                if r == b"+OK":
                    socks.append(s)
                else:
                    refused += 1
                    s.close()
            except (OSError, ConnectionError):
                refused += 1
        check(len(socks) == 64 and refused == 6,
              "authenticated connections from one address: %d kept, %d "
              "refused (resp_conns_per_addr 64)" % (len(socks), refused))
        check(served(d.port), "a real client from another address served")
        for s in socks:
            s.close()
    finally:
        stopped(d)


# ---- AUTH guessing ---------------------------------------------------------


def guesses(port, secs, nconn=8):
    """Wrong AUTHs answered WRONGPASS in secs from 127.0.0.4, over nconn
    connections each pipelining 1,000 at a time (the next 1,000 once
    they are answered) and reconnecting when closed."""
    count = [0] * nconn
    stop = time.time() + secs
    wrong = cmd("AUTH", "x" * 64) * 1000

    def one(k):
        while time.time() < stop:
            c = None
            try:
                c = Conn(port, src="127.0.0.4", timeout=1)
                while time.time() < stop:
                    c.send(wrong)
                    answered = 0
                    while answered < 1000 and time.time() < stop:
                        try:
                            c.fill()
                        except socket.timeout:
                            continue
                        n = c.buf.count(b"\r\n")
                        answered += n
                        count[k] += c.buf.count(b"-WRONGPASS")
                        c.buf = c.buf[c.buf.rfind(b"\r\n") + 2:]
            except (OSError, ConnectionError):
                pass
            finally:
                if c is not None:
                    c.close()

    ts = [threading.Thread(target=one, args=(k,)) for k in range(nconn)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(secs + 30)
    return sum(count)


def test_auth_guessing(master, tmp):
    """Wrong passwords from one address: a few a second are checked, the
    rest refused unchecked; a connection is closed after 3; once the
    guessing stops a client with the password gets in."""
    d = door(master, tmp, "--pool", "16M")
    try:
        c = Conn(d.port)
        c.send(cmd("AUTH", "wrong1") + cmd("AUTH", "wrong2") +
               cmd("AUTH", "wrong3") + cmd("PING"))
        r = [c.reply() for _ in range(3)]
        check(all(x.startswith("-WRONGPASS") for x in r) and
              c.closed_within(3) and b"PONG" not in c.buf,
              "a connection is closed after 3 wrong AUTHs")
        c.close()
        secs = 3.0
        n = guesses(d.port, secs)
        rate = n / secs
        check(rate <= 3 * 10 + 20,
              "wrong AUTHs checked from one address: %d in %.0f s "
              "(%.0f a second)" % (n, secs, rate))
        time.sleep(1.2)
        check(served(d.port), "the password works once the guessing stops")
        i = info(d.port)
        print("  AUTH wrong %s, refused unchecked %s, connections closed %s" %
              (i.get("auth_wrong"), i.get("auth_throttled"),
               i.get("auth_closed")))
    finally:
        stopped(d)


# ---- after AUTH: slow readers ------------------------------------------------


def test_slow_readers(master, tmp):
    """24 readers GET a 16 MiB value each (6 keys) and do not read for
    2 s, past the view's lease: the door copies the values of those it
    serves before the lease ends, and holds at most resp_slow_mem for
    them; the others are refused with an error; every value read is
    right."""
    size = 16 << 20
    d = door(master, tmp, "--pool", "64M", "--max-value", "16M",
             env={"KVF_RESP_SLOW_MEM": "64M", "KVF_LOG_LEVEL": "info"})
    try:
        vals = {}
        c = Conn(d.port, timeout=60)
        c.call("AUTH", PW)
        for k in range(6):
            vals[k] = os.urandom(size)
            check(c.call("SET", "slow:%d" % k, vals[k]) == "+OK",
                  "SET 16 MiB slow:%d" % k)
        for k in range(6):  # one read each: the pages of the path touched
            c.send(cmd("GET", "slow:%d" % k))
            c.reply(chunk=1 << 20)
        time.sleep(0.5)
        rss0 = d.rss_anon()
        readers = []
        for i in range(24):
            r = Conn(d.port, rcvbuf=4096, timeout=60)
            r.send(auth())
            r.line()
            r.send(cmd("GET", "slow:%d" % (i % 6)))
            readers.append(r)
        peak = rss0
        held = 0
        for _ in range(20):  # 2 s, past the 1 s lease
            time.sleep(0.1)
            peak = max(peak, d.rss_anon())
            held = max(held, int(info(d.port).get("slow_mem_held", 0)))
        good = bad = refused = 0
        for i, r in enumerate(readers):
            v = r.reply(chunk=1 << 20)
            if isinstance(v, str) and "resp_slow_mem" in v:
                refused += 1
            elif v == vals[i % 6]:
                good += 1
            else:
                bad += 1
            r.close()
        check(bad == 0 and good > 0 and good + refused == 24,
              "slow readers: %d values right, %d refused, %d wrong" %
              (good, refused, bad))
        check(held <= 64 << 20, "slow_mem_held at most %d (resp_slow_mem): "
              "%d" % (64 << 20, held))
        check(peak - rss0 < (64 + 32) << 10,
              "24 slow readers of 16 MiB: door RssAnon %d -> peak %d KiB "
              "(resp_slow_mem 64 MiB)" % (rss0, peak))
        c.close()
    finally:
        stopped(d)


# ---- the view lease ------------------------------------------------------------


def test_view_lease(master, node, tmp):
    """A sequence of GETs through the door (views on: the node is on this
    host), then 6.5 s idle: neither the door nor the node logs a lease
    warning."""
    mark = len(node.log())
    d = door(master, tmp, "--pool", "16M")
    try:
        c = Conn(d.port)
        c.call("AUTH", PW)
        v = os.urandom(100000)
        c.call("SET", "lease:k", v)
        got = [c.call("GET", "lease:k") == v for _ in range(5)]
        check(all(got), "GETs through the door, byte for byte")
        c.close()
        time.sleep(6.5)
    finally:
        stopped(d)
    text = d.log() + node.log()[mark:]
    bad = [ln for ln in text.splitlines()
           if "did not hold" in ln or "outlived" in ln or "held too long"
           in ln or "timed out" in ln]
    check(not bad, "no lease warning on the door or the node %s" % bad[:2])


# ---- start-up, HELLO, MULTI, NOAUTH -------------------------------------------


def test_insecure_door(master, tmp):
    """`kvferry resp --insecure` against a master that requires the
    secret refuses to start, saying why."""
    env = dict(os.environ)
    env.pop("KVF_SECRET_FILE", None)
    try:
        r = subprocess.run([BIN, "resp", "--insecure", "--master", master,
                            "--listen", "127.0.0.1:0", "--pool", "16M"],
                           capture_output=True, text=True, timeout=20,
                           env=env)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", e.stderr or ""
        out = out if isinstance(out, str) else out.decode()
        err = err if isinstance(err, str) else err.decode()
    check(rc not in (None, 0) and "resp=" not in out and "secret" in err,
          "a door without the master's secret refuses to start (rc %s): %s"
          % (rc, err.strip().splitlines()[-1:] if err else ""))


def test_hello_multi(master, tmp):
    d = door(master, tmp, "--pool", "16M")
    try:
        c = Conn(d.port)
        check(c.call("HELLO", "3") ==
              "-NOPROTO sorry, this protocol version is not supported.",
              "HELLO 3: Redis's reply for an unsupported version")
        r = c.call("HELLO")
        check(isinstance(r, str) and r.startswith("-NOAUTH HELLO must be"),
              "HELLO before AUTH: -NOAUTH, as Redis")
        r = c.call("HELLO", "2", "AUTH", "default", PW)
        check(isinstance(r, list) and r[:6] == [b"server", b"redis",
                                                 b"version", b"7.0.0",
                                                 b"proto", ":2"],
              "HELLO 2 AUTH default <password>: the RESP2 map as an array")
        check(c.call("SET", "h:k", "v") == "+OK",
              "HELLO ... AUTH authenticates")
        c.send(cmd("MULTI") + cmd("SET", "m:a", "1") + cmd("GET", "m:a") +
               cmd("EXISTS", "m:a", "m:b") + cmd("EXEC"))
        r = [c.reply() for _ in range(5)]
        check(r == ["+OK", "+QUEUED", "+QUEUED", "+QUEUED",
                    ["+OK", b"1", ":1"]],
              "MULTI, SET, GET, EXISTS, EXEC: queued, run in order %r" % r)
        c.send(cmd("MULTI") + cmd("SET", "m:b", "2") + cmd("DISCARD") +
               cmd("GET", "m:b"))
        r = [c.reply() for _ in range(4)]
        check(r == ["+OK", "+QUEUED", "+OK", None], "DISCARD drops the queue")
        c.send(cmd("MULTI") + cmd("NOSUCH") + cmd("SET", "m:c", "3") +
               cmd("EXEC") + cmd("GET", "m:c"))
        r = [c.reply() for _ in range(5)]
        check(r[0] == "+OK" and r[1].startswith("-ERR unknown command") and
              r[3].startswith("-EXECABORT") and r[4] is None,
              "an unknown command in MULTI: EXECABORT, nothing run")
        check(c.call("EXEC") == "-ERR EXEC without MULTI" and
              c.call("DISCARD") == "-ERR DISCARD without MULTI",
              "EXEC and DISCARD without MULTI")
        c.close()
        try:
            import redis
        except ImportError:
            redis = None
            print("skip redis-py pipeline: python3-redis is not installed")
        if redis is not None:
            try:
                r = redis.Redis(host="127.0.0.1", port=d.port, password=PW)
                p = r.pipeline()  # a transaction: MULTI ... EXEC
                p.set("py:t", b"x" * 5000)
                p.get("py:t")
                got = p.execute()
                r.close()
            except redis.RedisError as e:
                got = e
            check(got == [True, b"x" * 5000],
                  "redis-py %s pipeline() (MULTI/EXEC): %r" %
                  (redis.__version__, got if not isinstance(got, list)
                   else "ok"))
        # a client with no password: -NOAUTH, and the door says why
        c = Conn(d.port)
        check(c.call("EXISTS", "k").startswith("-NOAUTH"), "EXISTS: -NOAUTH")
        c.close()
        time.sleep(0.2)
        check("sent EXISTS before AUTH" in d.log() and
              "no password set" in d.log(),
              "the door's log says the client sent no password")
    finally:
        stopped(d)


CASES = {
    "crash": lambda m, n, t: test_crash(m, t),
    "pool": lambda m, n, t: test_pool_held(m, t),
    "memory": lambda m, n, t: test_memory(m, t),
    "lockout": lambda m, n, t: test_lockout(m, t),
    "auth": lambda m, n, t: test_auth_guessing(m, t),
    "slow": lambda m, n, t: test_slow_readers(m, t),
    "lease": lambda m, n, t: test_view_lease(m, n, t),
    "insecure": lambda m, n, t: test_insecure_door(m, t),
    "hello": lambda m, n, t: test_hello_multi(m, t),
}


def debian_python():
    """Runs again under Debian's python3 when this one lacks redis-py."""
    try:
        import redis  # noqa: F401
    except ImportError:
        deb = "/usr/bin/python3"
        if os.path.exists(deb) and \
                os.path.realpath(sys.executable) != os.path.realpath(deb) and \
                subprocess.run([deb, "-c", "import redis"],
                               capture_output=True).returncode == 0:
            os.execv(deb, [deb] + sys.argv)


def main():
    global PW
    debian_python()
    only = None
    if len(sys.argv) > 2 and sys.argv[1] == "--only":
        only = sys.argv[2].split(",")
    tmp = tempfile.mkdtemp(prefix="kvf-resph-")
    procs = []
    try:
        m = Proc(["master", "--listen", "127.0.0.1:0", "--http", "off"],
                 "master", env={"KVF_LEASE_MS": "1000"}, tmp=tmp)
        procs.append(m)
        n = Proc(["node", "--master", m.addr, "--pool", "512M"], "node",
                 tmp=tmp)
        procs.append(n)
        PW = subprocess.run([BIN, "resp", "--listen", "127.0.0.1:0",
                             "--print-password"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
        for name, fn in CASES.items():
            if only is None or name in only:
                print("-- %s" % name, flush=True)
                fn(m.addr, n, tmp)
    finally:
        for p in reversed(procs):
            p.stop()
        subprocess.run(["rm", "-rf", tmp])
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
