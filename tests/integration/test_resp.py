#!/usr/bin/env python3
"""kvferry resp against real Redis clients: a master, a node and the RESP
door as real processes on loopback; redis-cli and redis-py round trips, a
random 1 MiB binary value, malformed input on raw sockets (each answered
with an error or a closed connection while a real client keeps being
served), a 10,000-command pipeline, concurrent clients whose commands the
door batches (values checked byte for byte), AUTH with the password
derived from the cluster secret and with a password file, and the refusal
of a non-loopback address without a cluster secret."""
import os
import hashlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("KVF_BIN", "build/kvferry")
FAILS = []
PW = ""  # the door's AUTH password (derived from the cluster secret)


def auth_cmd(pw=None):
    pw = (PW if pw is None else pw).encode()
    return b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)


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


def cli(port, *args, stdin=None, pw=None):
    env = dict(os.environ)
    env.pop("REDISCLI_AUTH", None)
    if (PW if pw is None else pw):
        env["REDISCLI_AUTH"] = PW if pw is None else pw
    r = subprocess.run(["redis-cli", "-p", str(port)] + list(args),
                       input=stdin, capture_output=True, timeout=60, env=env)
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
    r = redis.Redis(host="127.0.0.1", port=port, password=PW)
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
    req = auth_cmd() + b"".join(b"*3\r\n$3\r\nSET\r\n$4\r\nsp:%d\r\n$%d\r\n%s\r\n" % (
        i, len(v), v) for i, v in enumerate(vals))
    req += b"".join(b"*2\r\n$3\r\nGET\r\n$4\r\nsp:%d\r\n" % i
                    for i in range(len(vals)))
    want = b"+OK\r\n" * (len(vals) + 1) + b"".join(
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
    env = dict(os.environ)
    env.pop("REDISCLI_AUTH", None)
    out = subprocess.run(["redis-cli", "-p", str(port), "--pipe"],
                         input=auth_cmd() + cmds, capture_output=True,
                         timeout=300, env=env).stdout
    check(b"errors: 0, replies: 10001" in out, "redis-cli --pipe 10000 SETs")
    check(cli(port, "GET", "pipe:9999") == b"x" * (9999 % 97) + b"\n",
          "value of the pipeline's last SET")
    # a client that sends 10,000 GETs before reading a reply
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(auth_cmd() + b"*2\r\n$3\r\nGET\r\n$6\r\npipe:1\r\n" * 10000)
    want = b"+OK\r\n" + b"$1\r\nx\r\n" * 10000
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
    check(cli(port, "GET", "x", pw="").startswith(b"NOAUTH"),
          "NOAUTH before AUTH")
    check(cli(port, "PING", pw="") == b"PONG\n", "PING before AUTH")
    check(cli(port, "AUTH", "wrong", pw="").startswith(b"WRONGPASS"),
          "wrong AUTH")
    got, _ = raw(port, auth_cmd(PW) + b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n",
                 1.0)
    check(got.startswith(b"-WRONGPASS"),
          "a password file replaces the derived password")
    got, _ = raw(port, b"*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n"
                 b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\nb\r\n", 1.0)
    check(got == b"+OK\r\n+OK\r\n", "AUTH then SET")
    check(cli(port, "-a", "s3cret", "--no-auth-warning", "GET", "a", pw="")
          == b"b\n", "redis-cli -a")
    try:
        import redis
        r = redis.Redis(host="127.0.0.1", port=port, password="s3cret")
        check(r.get("a") == b"b", "redis-py with a password")
        r.close()
    except ImportError:
        pass
    check(stop(p) == 0, "resp (auth) stops cleanly")


def test_auth_secret(port, master, tmp):
    """The password derived from the cluster secret, as Redis's
    requirepass: every command but AUTH, PING, QUIT, HELLO is refused
    until AUTH gives it."""
    check(len(PW) == 64, "kvferry resp --print-password prints a token")
    for cmd in (("GET", "k"), ("SET", "k", "v"), ("EXISTS", "k"),
                ("DEL", "k"), ("ECHO", "x")):
        check(cli(port, *cmd, pw="").startswith(b"NOAUTH"),
              "NOAUTH for %s before AUTH" % cmd[0])
    check(cli(port, "PING", pw="") == b"PONG\n", "PING before AUTH")
    got, _ = raw(port, auth_cmd("x" * 64) + b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                 1.0)
    check(got.startswith(b"-WRONGPASS") and b"-NOAUTH" in got,
          "wrong password: WRONGPASS, then NOAUTH")
    pw = PW.encode()
    got, _ = raw(port, b"*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$%d\r\n%s\r\n"
                 b"*1\r\n$4\r\nPING\r\n" % (len(pw), pw), 1.0)
    check(got == b"+OK\r\n+PONG\r\n", "AUTH default <password>")
    # a non-loopback address needs a cluster secret (or insecure=1)
    env = dict(os.environ)
    env.pop("KVF_SECRET_FILE", None)
    env.pop("KVF_INSECURE", None)
    r = subprocess.run([BIN, "resp", "--master", master, "--listen",
                        "0.0.0.0:0", "--pool", "16M"], capture_output=True,
                       timeout=30, env=env)
    check(r.returncode != 0 and b"secret" in r.stderr,
          "non-loopback listen without a cluster secret is refused")
    home = os.environ.get("KVF_SECRET_FILE") or \
        os.path.expanduser("~/.kvferry/secret")
    if not os.path.exists(home):
        return
    sec = os.path.join(tmp, "secret")
    shutil.copyfile(home, sec)
    os.chmod(sec, 0o600)
    env["KVF_SECRET_FILE"] = sec
    pw2 = subprocess.run([BIN, "resp", "--listen", "0.0.0.0:0",
                          "--print-password"], capture_output=True,
                         text=True, env=env, timeout=30).stdout.strip()
    check(pw2 == PW, "the same secret gives the same password")
    p = subprocess.Popen([BIN, "resp", "--master", master, "--listen",
                          "0.0.0.0:0", "--pool", "16M"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    line = p.stdout.readline()
    check(line.startswith("resp="), "non-loopback listen with a secret")
    if line.startswith("resp="):
        port2 = int(line.split()[0].rsplit(":", 1)[1])
        check(cli(port2, "GET", "k", pw="").startswith(b"NOAUTH"),
              "non-loopback door: NOAUTH before AUTH")
        check(cli(port2, "SET", "nl", "v") == b"OK\n",
              "non-loopback door: served after AUTH")
    check(stop(p) == 0, "resp (secret file) stops cleanly")


def test_concurrent(port):
    """Many clients at once, so the door batches their SETs and GETs:
    distinct keys, and one key every client overwrites; every value read
    is byte for byte one that was written."""
    try:
        import redis
    except ImportError:
        print("skip concurrent clients: python3-redis is not installed")
        return
    errs = []
    written = set()  # digests of every value SET under the shared key
    sizes = (0, 1, 5000, 65536, 200000)

    def worker(t):
        try:
            r = redis.Redis(host="127.0.0.1", port=port, password=PW)
            rng = random.Random(t)
            mine = {}
            for i in range(60):
                k = "cc:%d:%d" % (t, i % 7)
                v = rng.randbytes(sizes[i % len(sizes)])
                if not r.set(k, v):
                    errs.append("set %s" % k)
                mine[k] = v
                if r.get(k) != v:
                    errs.append("get %s after its set" % k)
                shared = b"%d:" % t + rng.randbytes(70000)
                written.add(hashlib.sha1(shared).digest())
                r.set("cc:shared", shared)
                got = r.get("cc:shared")
                # an overwrite replaces the key at commit: a GET reads
                # the old value or the new, never a miss or torn bytes
                if got is None:
                    errs.append("shared value missing during overwrites")
                elif hashlib.sha1(got).digest() not in written:
                    errs.append("shared value torn")
            for k, v in mine.items():
                if r.get(k) != v:
                    errs.append("final %s" % k)
            if r.exists(*mine.keys()) != len(mine):
                errs.append("exists")
            r.close()
        except Exception as e:  # noqa: BLE001
            errs.append("%d: %r" % (t, e))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not errs, "16 concurrent clients, values byte for byte %s" %
          errs[:3])
    bench = shutil.which("redis-benchmark")
    if bench:
        env = dict(os.environ)
        out = subprocess.run([bench, "-p", str(port), "-a", PW, "-t",
                              "set,get", "-d", "65536", "-c", "8", "-n",
                              "2000", "-q"], capture_output=True,
                             timeout=120, env=env).stdout
        check(b"SET:" in out and b"GET:" in out,
              "redis-benchmark -c 8 runs against the door")
        v = cli(port, "--raw", "GET", "key:__rand_int__")
        check(len(v) == 65537, "redis-benchmark's value read back")


def test_handoff(port):
    """Clients on both loops (this door gives connections to its loops in
    turn) take turns overwriting one key, one command at a time: each GET reads the
    last SET, so no SET was answered without being stored while no other
    SET of its key ran."""
    try:
        import redis
    except ImportError:
        print("skip one key over two loops: python3-redis is not installed")
        return
    rs = [redis.Redis(host="127.0.0.1", port=port, password=PW)
          for _ in range(4)]
    rng = random.Random(7)
    bad = 0
    for i in range(80):
        v = rng.randbytes(70000 if i % 2 else 3000)
        if not rs[i % 4].set("ho:key", v) or \
                rs[(i + 1) % 4].get("ho:key") != v:
            bad += 1
    for r in rs:
        r.close()
    check(bad == 0, "one key overwritten in turn from both loops, "
          "each GET reads the last SET (%d wrong)" % bad)


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
    for h in held:  # both accepted, authenticated and served
        h.sendall(auth_cmd() + b"*1\r\n$4\r\nPING\r\n")
        h.settimeout(10)
        got = b""
        while not got.endswith(b"+PONG\r\n"):
            got += h.recv(100)
    # (unauthenticated connections would be closed to make room: see
    # test_resp_hostile.py)
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
        # this door keeps each connection on the loop that accepted it
        # (the others started below give them to the loops in turn, the
        # default)
        os.environ["KVF_RESP_SPREAD"] = "0"
        r, addr = start(["resp", "--master", master, "--listen",
                         "127.0.0.1:0", "--pool", "64M", "--max-value", "8M",
                         "--idle", "3s", "--threads", "2"], "resp")
        del os.environ["KVF_RESP_SPREAD"]
        procs.append(r)
        port = int(addr.rsplit(":", 1)[1])
        global PW
        PW = subprocess.run([BIN, "resp", "--listen", "127.0.0.1:0",
                             "--print-password"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
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
        test_concurrent(port)
        test_handoff(port)
        test_auth_secret(port, master, tmp)
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
