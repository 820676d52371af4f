"""The end-to-end harness's remote tiers without torch: a RemoteTier over
numpy paged buffers ([2, blocks, 256, H, D] per layer, as the model's
cache) against the real master and node processes it starts, over shm
(store views) and tcp (the stage), and throttled by the fault transport.

Checked byte for byte: saves of full chunks and tails, a hit loaded group
by group where a layer of the first group is handed over while the last
group is still held back (the model's layer waits for its group only),
a longer prompt that continues a stored tail, a damaged piece that ends
the load short (counted, the chunk removed, stored anew by the next
save), the load's split (query, link reads, verifying scatter) and the
bounded waits of the group loader.
"""

import os
import sys
import threading
import types

import numpy as np
import pytest

from kvferry.e2e import caches
from kvferry.e2e.overlap import GroupLoad
from kvferry.e2e.remote import RemoteTier

LAYERS, HEADS, HD, BLOCKS = 4, 2, 16, 12
CHUNK = caches.CHUNK
PER_TOKEN = 2 * LAYERS * HEADS * HD * 2  # bytes of KV per token (K and V, 16-bit)


class Info:
    """The model facts a tier reads (a 4-layer model on the CPU)."""

    name, dtype, layers, kv_heads, head_dim = "stub-4l", "float16", LAYERS, HEADS, HD
    device = types.SimpleNamespace(type="cpu")


def bufs():
    return [np.zeros((2, BLOCKS, CHUNK, HEADS, HD), dtype=np.uint16) for _ in range(LAYERS)]


def fill(tier, blocks, seed):
    """Random KV in the tier's blocks 0..blocks; returns a copy of it."""
    rng = np.random.default_rng(seed)
    for b in tier.bufs:
        b[:, :blocks] = rng.integers(0, 1 << 16, b[:, :blocks].shape, dtype=np.uint16)
    return [b[:, :blocks].copy() for b in tier.bufs]


def clear(tier):
    for b in tier.bufs:
        b[...] = 0


def same(tier, want, layers=range(LAYERS)):
    return all(np.array_equal(tier.bufs[l][:, :want[l].shape[1]], want[l]) for l in layers)


def tokens(n, seed):
    return [int(x) for x in np.random.default_rng(seed + 500).integers(1, 30000, n)]


def make(transport="shm", **kw):
    kw.setdefault("chunk_tokens", 1024)
    kw.setdefault("layer_groups", 2)
    return RemoteTier(Info(), BLOCKS * CHUNK, transport, node_pool="64M", bufs=bufs(), **kw)


@pytest.fixture(scope="module", params=["shm", "tcp"])
def tier(request):
    t = make(request.param)
    yield t
    t.close()


def test_layer_waits_for_its_group_only(tier):
    toks = tokens(2560, seed=1)  # 2 chunks of 1024 and a tail of 2 blocks
    want = fill(tier, 10, seed=2)
    assert tier.save_blocks(toks, 2560) == 3 * tier.kv.groups
    assert tier.save_blocks(toks, 2560) == 0  # all stored: nothing moves
    clear(tier)
    viewed0 = tier.kv.stats.viewed_objects
    assert tier.lookup(toks) == 2560
    src, got, times, nbytes = tier.fetch(toks, 2560)
    assert (got, times, nbytes) == (2560, {}, 0) and src.groups == 2
    first = [l for l in range(LAYERS) if src.group_of[l] == 0]
    last = [l for l in range(LAYERS) if src.group_of[l] == 1]
    assert first == [0, 1] and last == [2, 3]
    gate, load = threading.Event(), src.load

    def held(group_done=None):  # group 1 waits until the test lets it go
        def done(g):
            group_done(g)
            if g == 0:
                assert gate.wait(30)
        return load(group_done=done)

    src.load = held
    gl = GroupLoad(src, LAYERS).start()
    try:
        gl.wait(first[-1], timeout=30)
        assert not gl.ready(last[0])
        assert same(tier, want, first)
        assert not any(tier.bufs[l].any() for l in last)
    finally:
        gate.set()
    gl.join(30)
    assert src.verified == 2560 and same(tier, want)
    split, moved = src.done()
    assert moved == 2560 * PER_TOKEN
    assert set(split) == {"kv_query", "kv_read", "kv_h2d_verify"}
    if tier.transport == "shm":
        assert tier.kv.stats.viewed_objects - viewed0 == 3 * tier.kv.groups
        assert split["kv_read"] == 0 and split["kv_query"] > 0
        assert tier.describe()["viewed_objects"] > 0
    else:
        assert tier.kv.stats.viewed_objects == 0 and split["kv_read"] > 0


def test_longer_prompt_continues_a_stored_tail(tier):
    toks = tokens(1280, seed=3)  # a chunk and a tail of 1 block
    want = fill(tier, 5, seed=4)
    assert tier.save_blocks(toks, 1280) == 2 * tier.kv.groups
    longer = toks + tokens(768, seed=5)
    clear(tier)
    assert tier.lookup(longer) == 1280
    src, got, _, _ = tier.fetch(longer, 1280)
    assert src.load() == 1280 and same(tier, want)
    more = fill(tier, 8, seed=6)
    for l in range(LAYERS):  # blocks 0..4 as loaded, 5..7 computed
        tier.bufs[l][:, :5] = want[l]
        more[l][:, :5] = want[l]
    # the chunk below what was loaded is not saved again; the second is
    assert tier.save_blocks(longer, 2048, have=1280) == tier.kv.groups
    clear(tier)
    assert tier.lookup(longer) == 2048
    src, _, _, _ = tier.fetch(longer, 2048)
    assert src.load() == 2048 and same(tier, more)


def test_damaged_piece_ends_the_load_and_is_stored_anew(tier):
    toks = tokens(1280, seed=7)
    want = fill(tier, 5, seed=8)
    tier.save_blocks(toks, 1280)
    assert not tier.corrupt(toks, 40)  # no stored chunk holds block 40
    assert tier.corrupt(toks, 2)  # block 2: inside the first chunk
    clear(tier)
    assert tier.lookup(toks) == 1280  # the store's own checksum agrees
    bad0 = tier.kv.stats.corrupt_misses
    src, _, _, _ = tier.fetch(toks, 1280)
    assert src.load() == 2 * CHUNK and src.verified == 2 * CHUNK
    assert tier.kv.stats.corrupt_misses == bad0 + 1
    # the chunk was removed: the prefix misses until saved again
    assert tier.lookup(toks) == 0
    for l in range(LAYERS):
        tier.bufs[l][:, :5] = want[l]
    assert tier.save_blocks(toks, 1280) == tier.kv.groups  # the chunk; the tail stayed
    clear(tier)
    assert tier.lookup(toks) == 1280
    src, _, _, _ = tier.fetch(toks, 1280)
    assert src.load() == 1280 and same(tier, want)


def test_throttled_tier_goes_through_the_stage():
    before = os.environ.get("KVF_FAULT")
    t = make("tcp", throttle_gbs=0.3)
    try:
        assert t.name == "remote-tcp-throttled" and t.throttle_ms >= 1
        assert os.environ["KVF_FAULT"].startswith("delay_ms=")
        toks = tokens(1024, seed=9)
        want = fill(t, 4, seed=10)
        assert t.save_blocks(toks, 1024) == t.kv.groups
        clear(t)
        assert t.lookup(toks) == 1024
        src, _, _, _ = t.fetch(toks, 1024)
        assert src.load() == 1024 and same(t, want)
        split, moved = src.done()
        assert moved == 1024 * PER_TOKEN and split["kv_read"] > 0
        d = t.describe()
        assert d["viewed_objects"] == 0 and d["throttle_delay_ms"] == t.throttle_ms
        assert "through a stage" in d["path"]
    finally:
        t.close()
    assert os.environ.get("KVF_FAULT") == before


class _Held:
    """A source of 2 groups: group 0 at once, group 1 when released (or
    an error instead)."""

    groups, group_of = 2, {0: 0, 1: 0, 2: 1, 3: 1}

    def __init__(self, fail=False):
        self.fail, self.release = fail, threading.Event()

    def load(self, group_done=None):
        group_done(0)
        if self.fail:
            raise RuntimeError("store gone")
        assert self.release.wait(30)
        group_done(1)


def test_group_load_waits_are_bounded_and_errors_surface():
    old = sys.getswitchinterval()
    src = _Held()
    gl = GroupLoad(src, 4).start()
    gl.wait(1, timeout=30)
    with pytest.raises(TimeoutError):
        gl.wait(2, timeout=0.05)
    src.release.set()
    gl.join(30)
    gl.wait(3)
    assert sys.getswitchinterval() == old
    gl = GroupLoad(_Held(fail=True), 4).start()
    with pytest.raises(RuntimeError):
        gl.wait(3, timeout=30)
    with pytest.raises(RuntimeError):
        gl.join(30)


def test_tier_names_and_cli_geometry_checked():
    with pytest.raises(ValueError):
        caches.make("remote-udp", Info(), 1024, 1 << 20, "64M")
    from kvferry.e2e.cli import _group_counts, main
    assert main(["--chunk-tokens", "300"]) == 2
    assert main(["--layer-groups", "8,0"]) == 2
    assert main(["--layer-groups", "x"]) == 2
    assert _group_counts("") == [] and _group_counts("4,8,16") == [4, 8, 16]
