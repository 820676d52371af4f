"""redis-py (the version python/run-tests.sh installs, 8.x today) against a
real ``kvferry resp``: the handshake redis-py 8 makes (HELLO 3 with AUTH,
answered as a RESP2-only Redis answers it, then AUTH), no warning when
the client asks for RESP2, and its default pipeline() (a MULTI/EXEC
transaction) with values byte for byte.
"""

import logging
import os
import uuid

import pytest

from kvferry.procs import Resp

redis = pytest.importorskip("redis")


def major():
    return int(redis.__version__.split(".")[0])


@pytest.fixture()
def door(master, tmp_path):
    pw = uuid.uuid4().hex
    pw_file = tmp_path / "resp.pw"
    pw_file.write_text(pw + "\n")
    pw_file.chmod(0o600)
    with Resp(master, "--password-file", str(pw_file), "--pool", "32M") as d:
        host, port = d.address.rsplit(":", 1)
        yield host, int(port), pw


def redis_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("redis") and r.levelno >= logging.WARNING]


def test_redis_py_version():
    """The venv holds the redis-py the door is tested with (>= 5)."""
    assert major() >= 5, redis.__version__


def test_resp2_no_warning_and_pipeline(door, caplog):
    """protocol=2 (what a RESP2-only server asks for): the handshake is
    AUTH alone, no warning; pipeline() is a MULTI/EXEC transaction whose
    replies come back in order."""
    host, port, pw = door
    caplog.set_level(logging.DEBUG, logger="redis")
    r = redis.Redis(host=host, port=port, password=pw, protocol=2)
    vals = [os.urandom(n) for n in (0, 1, 4096, 70000, 1 << 20)]
    try:
        assert r.ping()
        p = r.pipeline()  # transaction=True: MULTI ... EXEC
        for i, v in enumerate(vals):
            p.set("rc:%d" % i, v)
        for i in range(len(vals)):
            p.get("rc:%d" % i)
        p.exists("rc:0", "rc:none")
        got = p.execute()
        assert got[:len(vals)] == [True] * len(vals)
        assert got[len(vals):2 * len(vals)] == vals
        assert got[-1] == 1
        p = r.pipeline(transaction=False)
        p.get("rc:3")
        p.delete("rc:3")
        assert p.execute() == [vals[3], 1]
        with pytest.raises(redis.ResponseError):
            r.execute_command("EXEC")  # EXEC without MULTI
    finally:
        r.close()
    assert redis_warnings(caplog) == []


def test_default_protocol_handshake(door, caplog):
    """redis-py's default handshake: HELLO <its protocol> AUTH default
    <password>. A RESP2-only Redis answers HELLO 3 -NOPROTO; redis-py then
    falls back to AUTH and RESP2 (logging that it did, unless protocol=2
    is set), and every command works."""
    host, port, pw = door
    caplog.set_level(logging.DEBUG, logger="redis")
    r = redis.Redis(host=host, port=port, password=pw)
    try:
        v = os.urandom(5000)
        assert r.set("rc:default", v)
        assert r.get("rc:default") == v
        with r.pipeline() as p:
            p.set("rc:d2", b"x")
            p.get("rc:d2")
            assert p.execute() == [True, b"x"]
    finally:
        r.close()
    warned = redis_warnings(caplog)
    # the only warning allowed is redis-py's own note of the fallback
    assert all("does not support HELLO" in w for w in warned), warned


def test_wrong_password(door):
    host, port, _ = door
    r = redis.Redis(host=host, port=port, password="not-it", protocol=2)
    with pytest.raises(redis.AuthenticationError):
        r.ping()
    r.close()
