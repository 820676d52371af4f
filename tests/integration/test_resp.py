#!/usr/bin/env python3
"""kvferry resp against real Redis clients: a master, a node and the RESP
door as real processes on loopback; redis-cli and redis-py round trips, a
random 1 MiB binary value, malformed input on raw sockets (each answered
with an error or a closed connection while a real client keeps being
served), a 10,000-command pipeline, and AUTH with a password file."""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("KVF_BIN", "build/kvferry")
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def start(args, tag):
    p = subprocess.Popen([BIN] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith(tag + "="):
        p.kill()
        raise SystemExit("%s did not start: %r" % (args[0], line))
    return p, line.split()[0].split("=", 1)[1]


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        return -9


def cli(port, *args, stdin=None):
    r = subprocess.run(["redis-cli", "-p", str(port)] + list(args),
                       input=stdin, capture_output=True, timeout=60)
    return r.stdout


def raw(port, data, wait=3.0):
    """Sends data; returns (what came back, closed by the server)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(wait)
    try:
        s.sendall(data)
    except OSError:
        pass
    got, closed = b"", False
    try:
        while True:
            b = s.recv(65536)
            if not b:
                closed = True
                break
            got += b
    except socket.timeout:
        pass
    except OSError:
        closed = True
    s.close()
    return got, closed


def test_basic(port):
    check(cli(port, "PING") == b"PONG\n", "redis-cli PING")
    check(cli(port, "SET", "k1", "hello") == b"OK\n", "redis-cli SET")
    check(cli(port, "GET", "k1") == b"hello\n", "redis-cli GET")
    check(cli(port, "SET", "k1", "again") == b"OK\n", "SET overwrites")
    check(cli(port, "GET", "k1") == b"again\n", "GET after overwrite")
    check(cli(port, "EXISTS", "k1", "nope") == b"1\n", "redis-cli EXISTS")
    check(cli(port, "DEL", "k1") == b"1\n", "redis-cli DEL")
    check(cli(port, "GET", "k1") == b"\n", "GET after DEL is nil")
    check(cli(port, "EXISTS", "k1") == b"0\n", "EXISTS after DEL")
    check(cli(port, "FLUSHALL").startswith(b"ERR unknown command"),
          "unknown command")
    val = random.Random(1).randbytes(1 << 20)
    check(cli(port, "-x", "SET", "bin", stdin=val) == b"OK\n",
          "redis-cli -x SET 1 MiB")
    check(cli(port, "--raw", "GET", "bin") == val + b"\n",
          "redis-cli GET 1 MiB byte for byte")


def test_redis_py(port):
    try:
        import redis
    except ImportError:
        print("skip redis-py: python3-redis is not installed")
        return
    r = redis.Redis(host="127.0.0.1", port=port)
    check(r.ping(), "redis-py ping")
    val = os.urandom(1 << 20)
    check(r.set("py:bin", val), "redis-py set 1 MiB")
    check(r.get("py:bin") == val, "redis-py get 1 MiB byte for byte")
    check(r.exists("py:bin", "py:none") == 1, "redis-py exists")
    for n in (0, 1, 1024, 4096, 4097, 65536, 3 * 65536 + 7):
        v = os.urandom(n)
        r.set("py:%d" % n, v)
        check(r.get("py:%d" % n) == v, "redis-py value of %d bytes" % n)
    pipe = r.pipeline(transaction=False)
    for i in range(200):
        pipe.set("py:p%d" % i, b"v%d" % i)
    check(all(pipe.execute()), "redis-py pipeline of 200 SETs")
    check(r.get("py:p199") == b"v199", "redis-py pipeline value")
    check(r.delete("py:bin", "py:none") == 1, "redis-py delete")
    check(r.get("py:bin") is None, "redis-py get after delete")
    r.close()


def test_bad_input(port):
    got, closed = raw(port, b"hello world\r\n")
    check(got.startswith(b"-ERR protocol error") and closed,
          "garbage: -ERR protocol error, closed")
    got, closed = raw(port, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$99999999999\r\n")
    check(got.startswith(b"-ERR") and closed, "huge bulk length: error, closed")
    got, closed = raw(port, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$9000000\r\nab")
    check(got.startswith(b"-ERR") and closed,
          "bulk over --max-value: error, closed before the data")
    got, closed = raw(port, b"*99999999\r\n")
    check(got.startswith(b"-ERR") and closed, "huge array: error, closed")
    got, closed = raw(port, b"$3\r\nGET\r\n")
    check(got.startswith(b"-ERR") and closed, "not an array: error, closed")
    got, closed = raw(port, b"+" + b"x" * 300000)
    check(got.startswith(b"-ERR") and closed, "endless line: error, closed")
    got, closed = raw(port, b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n", 1.0)
    check(got == b"+PONG\r\n" and not closed, "half a command: kept open")
    # a half command is closed once idle, and others are served meanwhile
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\nabc")
    check(cli(port, "PING") == b"PONG\n", "served beside a half command")
    half.settimeout(10)
    t0 = time.time()
    try:
        closed = half.recv(100) == b""
    except OSError:
        closed = True
    check(closed and time.time() - t0 < 9, "idle half command closed")
    half.close()
    check(cli(port, "PING") == b"PONG\n", "served after bad input")


def test_split(port):
    """Requests cut at every kind of boundary, long values among them."""
    rng = random.Random(7)
    vals = [rng.randbytes(n) for n in (100000, 16384, 20000, 5, 300000)]
    req = b"".join(b"*3\r\n$3\r\nSET\r\n$4\r\nsp:%d\r\n$%d\r\n%s\r\n" % (
        i, len(v), v) for i, v in enumerate(vals))
    req += b"".join(b"*2\r\n$3\r\nGET\r\n$4\r\nsp:%d\r\n" % i
                    for i in range(len(vals)))
    want = b"+OK\r\n" * len(vals) + b"".join(
        b"$%d\r\n%s\r\n" % (len(v), v) for v in vals)
    for cut in (1, 2, 3, 7, 4096, 65537):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        i = 0
        while i < len(req):
            n = cut if cut > 7 else rng.randint(1, 64 * cut)
            s.sendall(req[i:i + n])
            i += n
            if cut <= 7 and rng.random() < 0.01:
                time.sleep(0.001)
        got = b""
        s.settimeout(30)
        while len(got) < len(want):
            b = s.recv(1 << 20)
            if not b:
                break
            got += b
        s.close()
        check(got == want, "requests cut in pieces of %d" % cut)


def test_pipeline(port):
    cmds = b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(k), k, len(v), v) for k, v in ((b"pipe:%d" % i, b"x" * (i % 97))
                                          for i in range(10000)))
    out = subprocess.run(["redis-cli", "-p", str(port), "--pipe"],
                         input=cmds, capture_output=True, timeout=300).stdout
    check(b"errors: 0, replies: 10000" in out, "redis-cli --pipe 10000 SETs")
    check(cli(port, "GET", "pipe:9999") == b"x" * (9999 % 97) + b"\n",
          "value of the pipeline's last SET")
    # a client that sends 10,000 GETs before reading a reply
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"*2\r\n$3\r\nGET\r\n$6\r\npipe:1\r\n" * 10000)
    want = b"$1\r\nx\r\n" * 10000
    got = b""
    s.settimeout(60)
    while len(got) < len(want):
        b = s.recv(1 << 20)
        if not b:
            break
        got += b
    check(got == want, "10,000 pipelined GETs answered in order")
    s.close()


def test_auth(master, tmp):
    pw = os.path.join(tmp, "pw")
    with open(pw, "w") as f:
        f.write("s3cret\n")
    os.chmod(pw, 0o644)
    r = subprocess.run([BIN, "resp", "--master", master, "--listen",
                        "127.0.0.1:0", "--pool", "16M", "--password-file",
                        pw], capture_output=True, timeout=30)
    check(r.returncode != 0, "a password file others can read is refused")
    os.chmod(pw, 0o600)
    p, addr = start(["resp", "--master", master, "--listen", "127.0.0.1:0",
                     "--pool", "16M", "--password-file", pw], "resp")
    port = int(addr.rsplit(":", 1)[1])
    check(cli(port, "GET", "x").startswith(b"NOAUTH"), "NOAUTH before AUTH")
    check(cli(port, "PING") == b"PONG\n", "PING before AUTH")
    check(cli(port, "AUTH", "wrong").startswith(b"WRONGPASS"), "wrong AUTH")
    got, _ = raw(port, b"*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n"
                 b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\nb\r\n", 1.0)
    check(got == b"+OK\r\n+OK\r\n", "AUTH then SET")
    check(cli(port, "-a", "s3cret", "--no-auth-warning", "GET", "a")
          == b"b\n", "redis-cli -a")
    try:
        import redis
        r = redis.Redis(host="127.0.0.1", port=port, password="s3cret")
        check(r.get("a") == b"b", "redis-py with a password")
        r.close()
    except ImportError:
        pass
    check(stop(p) == 0, "resp (auth) stops cleanly")


def debian_python():
    """Runs again under Debian's python3 when this one lacks redis-py."""
    try:
        import redis  # noqa: F401
    except ImportError:
        if os.path.exists("/usr/bin/python3") and \
                os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and \
                subprocess.run(["/usr/bin/python3", "-c", "import redis"],
                               capture_output=True).returncode == 0:
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)


def test_max_clients(master):
    p, addr = start(["resp", "--master", master, "--listen", "127.0.0.1:0",
                     "--pool", "16M", "--max-clients", "2"], "resp")
    port = int(addr.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    for h in held:  # both accepted and served
        h.sendall(b"*1\r\n$4\r\nPING\r\n")
        h.settimeout(10)
        h.recv(100)
    got, closed = raw(port, b"*1\r\n$4\r\nPING\r\n")
    check(got.startswith(b"-ERR max number of clients") and closed,
          "a client over --max-clients is refused")
    held[0].sendall(b"*1\r\n$4\r\nQUIT\r\n")
    check(held[0].recv(100) == b"+OK\r\n", "QUIT answers +OK")
    held[0].settimeout(10)
    check(held[0].recv(100) == b"", "QUIT closes")
    held[0].close()
    time.sleep(0.2)
    check(cli(port, "PING") == b"PONG\n", "a slot freed by QUIT is reused")
    held[1].close()
    check(stop(p) == 0, "resp (max clients) stops cleanly")


def main():
    debian_python()
    if shutil.which("redis-cli") is None:
        print("skip: redis-cli is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="kvf-resp-")
    procs = []
    try:
        m, master = start(["master", "--listen", "127.0.0.1:0", "--http",
                           "off"], "master")
        procs.append(m)
        n, _ = start(["node", "--master", master, "--pool", "256M"], "node")
        procs.append(n)
        r, addr = start(["resp", "--master", master, "--listen",
                         "127.0.0.1:0", "--pool", "64M", "--max-value", "8M",
                         "--idle", "3s", "--threads", "2"], "resp")
        procs.append(r)
        port = int(addr.rsplit(":", 1)[1])
        deadline = time.time() + 20  # until the node has registered
        while cli(port, "SET", "ready", "1") != b"OK\n":
            if time.time() > deadline:
                raise SystemExit("the store never took a SET")
            time.sleep(0.2)
        test_basic(port)
        test_redis_py(port)
        test_bad_input(port)
        test_split(port)
        test_pipeline(port)
        test_auth(master, tmp)
        test_max_clients(master)
        check(stop(r) == 0, "resp stops cleanly")
        procs.remove(r)
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
