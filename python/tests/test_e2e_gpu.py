"""The end-to-end harness's GPU tiers (kvferry.kv's and kvferry.kv_chunks'
paged GPU paths).

On a GPU (skipped elsewhere): with a tiny model, the local tier
(LocalKVCache, verifying scatter kernel) and the remote tiers (ChunkStore
over GPU buffers: store over shm read in place through views, the pool
registered at set-up; over tcp and throttled by the fault transport,
through the pinned stage) load a saved prefix bitwise equal to the
computed one, group by group (layer by layer for local) and in one call;
a corrupted chunk is refused by the kernel's checksums (shortened load,
corrupt_misses) and the engine recomputes to the same output.

Everywhere: the paged source's control flow (layer-wise loader thread,
sequential load, a verification failure in the middle of an overlapped
pass) runs on CPU against a stand-in for LocalKVCache that compares
bytes instead of checksums, and the remote tier runs on CPU (host
buffers, real master and node) through the engine: hit equal to the
miss, loaded group by group beside the forward pass or before it, a
damaged piece refused, recomputed and stored anew.
"""

import sys

try:
    import pytest
except ImportError:  # the GPU host runs this file as a script
    pytest = None
if pytest is not None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
else:
    import torch

from kvferry import kv_gpu  # noqa: E402
from kvferry.e2e import caches  # noqa: E402
from kvferry.e2e.caches import CHUNK, PagedSource  # noqa: E402
from kvferry.e2e.engine import Engine  # noqa: E402
from kvferry.e2e.model import build  # noqa: E402
from kvferry.e2e.policy import Policy  # noqa: E402
from kvferry.e2e.remote import RemoteTier  # noqa: E402
from kvferry.kv import KVStats  # noqa: E402


def _gpu() -> bool:
    try:
        return torch.cuda.is_available() and kv_gpu.gpu_count() > 0
    except Exception:
        return False


def _tokens(n, seed=1, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _computed(info, tokens):
    """A DynamicCache of tokens computed by the model."""
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad():
        t = torch.tensor([tokens], device=info.device)
        info.model(input_ids=t, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def _same(src, cache, n, saved):
    """The loaded buffers are bitwise the saved ones, and their [1, H, S,
    D] views hold the KV a fresh prefill of the prefix computes."""
    for b, s in zip(src.bufs, saved):
        assert torch.equal(b[:, : n // CHUNK], s[:, : n // CHUNK])
    for l, layer in enumerate(cache.layers):
        k, v = src.views(l)
        assert torch.allclose(k[:, :, :n], layer.keys[:, :, :n], rtol=1e-4, atol=1e-4), l
        assert torch.allclose(v[:, :, :n], layer.values[:, :, :n], rtol=1e-4, atol=1e-4), l


def _serve(info, tier, overlap, toks):
    """Serves one request of toks (prefix = all but the last 64)."""
    class Req:
        rid, prefix_id, out_tokens, arrival_s = 0, 0, 4, 0.0
        prefix_len = len(toks) - 64

        def tokens(self, seed):
            return toks
    eng = Engine(info, tier, Policy("always", info.shape(), 1, 1), overlap, realtime=False)
    return eng.serve_one(Req(), 0.0, 0.0)


# -- a stand-in for LocalKVCache on CPU -----------------------------------


class _Plan:
    def __init__(self, keys, ok, bs):
        self.keys, self.n, self.ok, self.block_size = keys, ok, ok, bs

    @property
    def tokens(self):
        return self.ok * self.block_size


class _FakeLocal:
    """Chunks kept as tensors; a load copies them into the paged buffers
    and compares them with the copy recorded at save (the checksum)."""

    def __init__(self, bufs):
        self.bufs, self.stats, self.held = bufs, KVStats(), {}

    def chunk_keys(self, tokens):
        return [tuple(tokens[: (i + 1) * CHUNK]) for i in range(len(tokens) // CHUNK)]

    def lookup(self, tokens):
        n = 0
        for k in self.chunk_keys(tokens):
            if k not in self.held:
                break
            n += 1
        return n * CHUNK

    def save(self, tokens, block_ids):
        w = 0
        for i, k in enumerate(self.chunk_keys(tokens)[: len(block_ids)]):
            if k not in self.held:
                data = [b[:, block_ids[i]].clone() for b in self.bufs]
                self.held[k] = (data, [d.clone() for d in data])
                w += 1
        return w

    def plan_load(self, tokens, block_ids):
        keys = self.chunk_keys(tokens)[: len(block_ids)]
        ok = 0
        while ok < len(keys) and keys[ok] in self.held:
            ok += 1
        return _Plan(keys[:ok], ok, CHUNK)

    def load_planned(self, plan, layers=None):
        for l in range(len(self.bufs)) if layers is None else layers:
            for j in range(plan.ok):
                data, sums = self.held[plan.keys[j]]
                self.bufs[l][:, j].copy_(data[l])
                if not torch.equal(data[l], sums[l]):
                    self.stats.corrupt_misses += 1
                    del self.held[plan.keys[j]]
                    plan.ok = j
                    break
        self.stats.bytes_loaded += plan.ok
        return plan.tokens

    def load_layers(self, plan, layer_done):
        """LocalKVCache.load_layers' contract: a layer is handed over as it
        lands, verified after; a bad chunk ends the load with 0."""
        for l in range(len(self.bufs)):
            for j in range(plan.ok):
                self.bufs[l][:, j].copy_(self.held[plan.keys[j]][0][l])
            layer_done(l)
            for j in range(plan.ok):
                data, sums = self.held[plan.keys[j]]
                if not torch.equal(data[l], sums[l]):
                    self.stats.corrupt_misses += 1
                    del self.held[plan.keys[j]]
                    plan.ok = j
                    return 0
        self.stats.bytes_loaded += plan.ok
        return plan.tokens

    def slot_view(self, tokens, chunk):
        k = self.chunk_keys(tokens)[chunk]
        if k not in self.held:
            return None
        return self.held[k][0][0].view(-1).view(torch.uint8).numpy().data

    def close(self):
        pass


class _FakeLocalTier(caches.GpuLocalTier):
    def __init__(self, info, max_tokens):
        self.blocks = max_tokens // CHUNK
        self.bufs = caches._gpu_bufs(info, self.blocks)
        self.kv = _FakeLocal(self.bufs)


def check_paged_source(info, overlap):
    """Paged control flow on CPU: load, layer-wise load, corrupted chunk."""
    tokens = _tokens(4 * CHUNK + 64, vocab=info.vocab)
    tier = _FakeLocalTier(info, 4 * CHUNK)
    first = _serve(info, tier, overlap, tokens)
    assert first.decision == "miss" and tier.lookup(tokens[: 4 * CHUNK]) == 4 * CHUNK
    hit = _serve(info, tier, overlap, tokens)
    assert hit.decision == "load" and hit.loaded_tokens == 4 * CHUNK
    assert hit.output == first.output
    saved = [b.clone() for b in tier.bufs]
    for b in tier.bufs:
        b.zero_()
    src, got, _, _ = tier.fetch(tokens[: 4 * CHUNK], 4 * CHUNK)
    assert got == 4 * CHUNK and src.load_all() == got
    _same(src, _computed(info, tokens[: 4 * CHUNK]), 4 * CHUNK, saved)
    assert tier.corrupt(tokens[: 4 * CHUNK], 2)
    bad = _serve(info, tier, overlap, tokens)
    assert bad.decision == "corrupt" and bad.loaded_tokens == 0
    assert bad.output == first.output and tier.kv.stats.corrupt_misses == 1
    # the dropped chunk was saved again from the recompute
    again = _serve(info, tier, overlap, tokens)
    assert again.decision == "load" and again.output == first.output


def check_verified_speed(info, _=None):
    """The record's verified-load speed: bytes of the largest loaded prefix
    over the scatter kernel's mean time, and its fraction of the H2D."""
    from kvferry.e2e.cli import _verified_speed

    class S:
        def __init__(self, tokens, t, decision="load"):
            self.loaded_tokens, self.decision = tokens, decision
            self.split = {"kv_h2d_verify": t}
    per = info.kv_bytes_per_token()
    got = _verified_speed([S(512, 1.0), S(1024, 2.0), S(1024, 4.0), S(0, 9.0, "miss")], info, 1e-9)
    assert got["verified_load_tokens"] == 1024
    assert abs(got["verified_load_gbs"] - 1024 * per / 3.0 / 1e9) < 1e-12
    assert abs(got["verified_load_vs_h2d"] - 1024 * per / 3.0) < 1e-6
    assert _verified_speed([S(0, 1.0, "miss")], info, 1.0) == {}


def check_chunk_source(info, overlap):
    """The remote tier on CPU through the engine: host buffers, chunk
    objects in a real node over shm, loaded group by group."""
    n = 5 * CHUNK  # a chunk of 1024 tokens and a tail of one block
    tokens = _tokens(n + 64, vocab=info.vocab)
    tier = caches.make("remote-shm", info, n, 64 << 20, "64M", layer_groups=2)
    try:
        assert isinstance(tier, RemoteTier) and tier.resident and not tier.kv.gpu
        assert tier.kv.groups == 2 and tier.kv.chunk_tokens == 1024
        first = _serve(info, tier, overlap, tokens)
        assert first.decision == "miss" and tier.lookup(tokens[:n]) == n
        hit = _serve(info, tier, overlap, tokens)
        assert hit.decision == "load" and hit.loaded_tokens == n
        assert hit.output == first.output
        assert hit.bytes_remote == n * info.kv_bytes_per_token()
        assert {"kv_query", "kv_read", "kv_h2d_verify"} <= set(hit.split)
        assert tier.kv.stats.viewed_objects > 0
        before = tier.kv.stats.corrupt_misses
        assert tier.corrupt(tokens[:n], 2)
        bad = _serve(info, tier, overlap, tokens)
        assert bad.decision == "corrupt" and bad.loaded_tokens == 0
        assert bad.output == first.output
        assert tier.kv.stats.corrupt_misses == before + 1
        again = _serve(info, tier, overlap, tokens)  # stored anew by the recompute
        assert again.decision == "load" and again.output == first.output
    finally:
        tier.close()


# -- the real tiers on a GPU ----------------------------------------------

GPU_TIERS = ["local", "local-engines", "remote-shm", "remote-shm-piped", "remote-tcp",
             "remote-tcp-throttled"]


def _load_all(src):
    return src.load_all() if hasattr(src, "load_all") else src.load()


def _load_in_steps(src, layers):
    """Layer by layer (local) or group by group (remote), each step
    verifying every token."""
    if hasattr(src, "load_layers"):
        seen = []
        assert src.load_layers(seen.append) == src.tokens
        assert seen == list(range(layers))
        return
    seen = []
    assert src.load(group_done=seen.append) == src.tokens
    assert seen == list(range(src.groups))


def _remote_paths(tier, name, times, nbytes, n, info):
    """The remote tier's path: views and put views over shm (the pool
    registered at set-up), the stage over tcp."""
    assert tier.kv.gpu and tier.resident
    assert nbytes == n * info.kv_bytes_per_token()
    s = tier.kv.stats
    if name.startswith("remote-shm"):
        assert tier.mappings >= 1 and tier.kv._pipeline == name.endswith("-piped")
        assert s.viewed_objects > 0 and s.put_viewed_objects > 0 and times["kv_read"] == 0
    else:
        assert s.viewed_objects == 0 and times["kv_read"] > 0


def check_piped_name(info, _=None):
    """remote-shm-piped is remote-shm with the ChunkStore's pipeline (inert
    without a GPU); no other tier takes the suffix."""
    tier = caches.make("remote-shm-piped", info, 4 * CHUNK, 64 << 20, "64M")
    try:
        assert tier.name == "remote-shm-piped" and tier.kv._pipeline
        assert tier.describe()["pipeline"] is True
    finally:
        tier.close()
    for bad in ("remote-tcp-piped", "local-piped", "remote-shm-fast"):
        with pytest.raises(ValueError):
            caches.make(bad, info, 4 * CHUNK, 64 << 20, "64M")


def check_gpu_tier(info, name):
    """A real GPU tier: load (one call, in steps), verify, corruption.
    "local-engines": the local tier with the copy-engine checksum mode
    (its overlapped loads post the DMAs of later layers ahead)."""
    n = 8 * CHUNK
    tokens = _tokens(n + 64, vocab=info.vocab)
    mode = name.partition("-engines")[1][1:] or None
    kv_gpu.set_sum_mode(mode)
    try:
        tier = caches.make(name.replace("-engines", ""), info, n, 64 << 20, "256M",
                           1.0 if "throttled" in name else 0.0, layer_groups=2)
    finally:
        kv_gpu.set_sum_mode(None)
    if mode:
        assert tier.kv._mover.flags & kv_gpu.SUM_ENGINES
    try:
        assert isinstance(tier, (caches.GpuLocalTier, RemoteTier)), type(tier)
        assert tier.bufs[0].is_cuda
        first = _serve(info, tier, True, tokens)
        assert first.decision == "miss"
        assert tier.lookup(tokens[:n]) == n
        ref = _computed(info, tokens[:n])
        saved = [b.clone() for b in tier.bufs]  # what the save gathered
        # one call (sequential), then layer by layer (overlapped)
        for b in tier.bufs:
            b.zero_()
        torch.cuda.synchronize()
        src, got, _, _ = tier.fetch(tokens[:n], n)
        assert _load_all(src) == n
        _same(src, ref, n, saved)
        for b in tier.bufs:
            b.zero_()
        torch.cuda.synchronize()
        src, _, _, _ = tier.fetch(tokens[:n], n)
        _load_in_steps(src, info.layers)
        _same(src, ref, n, saved)
        times, nbytes = src.done()
        assert times["kv_h2d_verify"] > 0
        if tier.remote:
            _remote_paths(tier, name, times, nbytes, n, info)
        for overlap in (True, False):
            hit = _serve(info, tier, overlap, tokens)
            assert hit.decision == "load" and hit.loaded_tokens == n, overlap
            assert hit.output == first.output
        # a damaged chunk: refused by the kernel, recomputed, same output
        for overlap in (True, False):
            before = tier.kv.stats.corrupt_misses
            assert tier.corrupt(tokens[:n], 3)
            bad = _serve(info, tier, overlap, tokens)
            assert bad.decision == "corrupt" and bad.loaded_tokens == 0, overlap
            assert bad.output == first.output
            assert tier.kv.stats.corrupt_misses == before + 1
            again = _serve(info, tier, overlap, tokens)  # saved again after the recompute
            assert again.output == first.output
    finally:
        tier.close()


if pytest is not None:
    @pytest.fixture(scope="module")
    def cpu_info():
        return build("tiny", "cpu", "float32", 0)

    @pytest.fixture(scope="module")
    def gpu_info():
        return build("tiny", "cuda", "float32", 0)

    @pytest.mark.parametrize("overlap", [True, False])
    def test_paged_source_loads_and_recomputes_a_corrupted_chunk(cpu_info, overlap):
        check_paged_source(cpu_info, overlap)

    def test_verified_speed(cpu_info):
        check_verified_speed(cpu_info)

    @pytest.mark.parametrize("overlap", [True, False])
    def test_chunk_source_through_the_engine(cpu_info, overlap):
        check_chunk_source(cpu_info, overlap)

    def test_piped_remote_tier_name(cpu_info):
        check_piped_name(cpu_info)

    @pytest.mark.skipif(not _gpu(), reason="needs a GPU and kvferry's GPU kernels")
    @pytest.mark.parametrize("name", GPU_TIERS)
    def test_gpu_tier_load_verify_corrupt(gpu_info, name):
        check_gpu_tier(gpu_info, name)


if __name__ == "__main__":
    # without pytest (the GPU host): every check, a line each, exit 1 on any failure
    import traceback

    failed = 0
    runs = [("paged source overlap=%s" % o, check_paged_source, "cpu", o) for o in (True, False)]
    runs.append(("verified speed", check_verified_speed, "cpu", None))
    runs += [("chunk source overlap=%s" % o, check_chunk_source, "cpu", o) for o in (True, False)]
    if _gpu():
        runs += [("gpu tier %s" % n, check_gpu_tier, "cuda", n) for n in GPU_TIERS]
    else:
        print("SKIP: gpu tiers (no GPU or no GPU kernels in the library)")
    infos = {}
    for label, fn, dev, arg in runs:
        try:
            if dev not in infos:
                infos[dev] = build("tiny", dev, "float32", 0)
            fn(infos[dev], arg)
            print("PASS: %s" % label, flush=True)
        except Exception as e:
            traceback.print_exc()
            print("FAIL: %s: %r" % (label, e), flush=True)
            failed += 1
    print("FAIL: test_e2e_gpu" if failed else "PASS: test_e2e_gpu")
    sys.exit(1 if failed else 0)
