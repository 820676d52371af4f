"""The vLLM, LMCache and SGLang modules against a real master and node.

Each module is driven here through the engine's own interface. Where the
engine package is importable (python/integrations/install.sh installs
them), the module derives from the engine's real base class and is
loaded through the engine's own plugin mechanism (vLLM's
SecondaryTierFactory, LMCache's ConnectorManager plugin adapter,
SGLang's StorageBackendFactory); where it is not, those tests skip and
the module runs over its stand-in base, with the same methods.
"""

import asyncio
import os
from types import SimpleNamespace
import signal
import threading
import time
import uuid

import numpy as np
import pytest

import kvferry
from kvferry import lmcache as kl
from kvferry import sglang as ks
from kvferry import vllm_tier as kv
from kvferry.procs import Master, Node, Resp


def ns():
    return "it-" + uuid.uuid4().hex[:10]


# -- vLLM -----------------------------------------------------------------


def wait_jobs(tier, n, timeout=10):
    out, end = [], time.time() + timeout
    while len(out) < n and time.time() < end:
        out += list(tier.get_finished_jobs())
        time.sleep(0.005)
    return {r.job_id: r for r in out}


def make_tier(master, nslots=16, slot=4096, **kw):
    primary = np.zeros((nslots, slot), dtype=np.uint8)
    tier = kv.KvferryTier(offloading_spec=None, primary_kv_view=memoryview(primary),
                          tier_type="KvferryTier", master=master, **kw)
    return primary, tier


def job(job_id, keys, slots, promotion=False):
    return kv.TransferJob(job_id=job_id, keys=keys, chunk_ids=np.array(slots, dtype=np.int64),
                          is_promotion=promotion, req_context=None)


def test_vllm_tier_store_lookup_load(master):
    name = ns()
    primary, tier = make_tier(master, namespace=name)
    try:
        rng = np.random.default_rng(0)
        primary[:] = rng.integers(0, 256, primary.shape, dtype=np.uint8)
        keys = [uuid.uuid4().bytes + (0).to_bytes(4, "big") for _ in range(6)]
        assert tier.lookup(keys[0], None) == kv.LookupResult.RETRY   # async by default
        tier.drain_jobs()
        assert tier.lookup(keys[0], None) == kv.LookupResult.MISS
        tier.submit_store(job(1, keys, [0, 1, 2, 3, 4, 5]))
        tier.drain_jobs()
        res = wait_jobs(tier, 1)
        assert res[1].success and res[1].transfer_bytes == 6 * 4096
        assert all(tier.lookup(k, None) == kv.LookupResult.HIT for k in keys)
        before = primary[:6].copy()
        primary[8:] = 0
        tier.submit_load(job(2, keys[:4], [8, 9, 10, 11], promotion=True))
        tier.drain_jobs()
        res = wait_jobs(tier, 1)
        assert res[2].success
        assert (primary[8:12] == before[:4]).all()
        # one key missing: the job fails and names the keys that loaded
        missing = uuid.uuid4().bytes + b"\0\0\0\0"
        tier.submit_load(job(3, [keys[0], missing], [12, 13], promotion=True))
        tier.drain_jobs()
        res = wait_jobs(tier, 1)
        assert not res[3].success and list(res[3].successful_keys) == [keys[0]]
        # storing the same keys again succeeds (already present)
        tier.submit_store(job(4, keys[:2], [0, 1]))
        tier.drain_jobs()
        assert wait_jobs(tier, 1)[4].success
        # another tier with the same namespace sees the keys (sync lookup)
        _, tier2 = make_tier(master, namespace=name, lookup="sync")
        assert tier2.lookup(keys[3], None) == kv.LookupResult.HIT
        assert tier2.lookup(missing, None) == kv.LookupResult.MISS
        tier2.shutdown()
        # another slot size is another namespace: a miss
        _, tier3 = make_tier(master, slot=2048, lookup="sync")
        assert tier3.lookup(keys[3], None) == kv.LookupResult.MISS
        tier3.shutdown()
        assert isinstance(tier.on_new_request(None), kv.RequestOffloadingContext)
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_vllm_tier_via_factory(master):
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.tiering import base as tier_base
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    if not hasattr(tier_base, "TransferJob"):
        pytest.skip("this vLLM's secondary tier interface is older than 0.33's (no TransferJob)")
    assert kv.HAVE_VLLM
    primary = np.zeros((4, 1024), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "KvferryTier", "module_path": "kvferry.vllm_tier", "master": master,
         "namespace": ns()}, memoryview(primary), None)
    try:
        from vllm.v1.kv_offload.tiering.base import SecondaryTierManager, TransferJob

        assert isinstance(tier, SecondaryTierManager)
        key = uuid.uuid4().bytes + b"\0\0\0\0"
        primary[1] = 7
        tier.submit_store(TransferJob(job_id=1, keys=[key], chunk_ids=np.array([1]),
                                      is_promotion=False, req_context=None))
        tier.drain_jobs()
        assert wait_jobs(tier, 1)[1].success
    finally:
        tier.shutdown()


def test_vllm_tier_options_via_factory(master):
    """The factory's options (0.33, 0.34): a backpressure detector built
    by vLLM from the tier's entry, the entry's locality, the tier's medium."""
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.tiering import base as tier_base
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    if not hasattr(tier_base.SecondaryTierManager, "bp_detector"):
        pytest.skip("this vLLM's secondary tiers take no backpressure detector")
    primary = np.zeros((4, 1024), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "KvferryTier", "module_path": "kvferry.vllm_tier", "master": master,
         "namespace": ns(), "locality": "REMOTE",
         "backpressure": {"backpressure_cls": "EMABackpressureDetector"}},
        memoryview(primary), None)
    try:
        from vllm.v1.kv_offload.base import Locality, Medium
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        assert type(tier.bp_detector).__name__ == "EMABackpressureDetector"
        assert tier.locality is Locality.REMOTE
        assert tier.medium is Medium.CPU and tier.cache_hit_source is CacheHitSource.HOST
    finally:
        tier.shutdown()


@pytest.fixture()
def own_store():
    """A master and node of the test's own, so that it may stop the master."""
    with Master() as m, Node(m.address, pool="16M") as n:
        yield m, n


def pause(pid, timeout=5):
    """SIGSTOP, then wait until every thread of pid has stopped."""
    os.kill(pid, signal.SIGSTOP)
    end = time.time() + timeout
    while time.time() < end:
        states = []
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(st == "T" for st in states):
            return
        time.sleep(0.005)
    raise AssertionError("process %d did not stop" % pid)


def wait_running(tier, job_id=None, timeout=5):
    """Waits until the tier's worker has taken job job_id (any job: None);
    its store call then waits on the stopped master."""
    end = time.time() + timeout
    while time.time() < end:
        running = tier._running
        if running is not None and job_id in (None, running.meta.job_id):
            return
        time.sleep(0.005)
    raise AssertionError("job %s did not start" % job_id)


def stored_tier(master, nslots, slot, keys, **kw):
    """A tier whose keys are stored from slots 0.. (random bytes)."""
    primary, tier = make_tier(master, nslots=nslots, slot=slot, namespace=ns(), **kw)
    primary[:] = np.random.default_rng(1).integers(0, 256, primary.shape, dtype=np.uint8)
    tier.submit_store(job(1, keys, list(range(len(keys)))))
    assert wait_jobs(tier, 1)[1].success
    return primary, tier


@pytest.mark.parametrize("defer", [True, False], ids=["deferred", "no-deferral"])
def test_vllm_tier_stalled_load_defers_release(own_store, monkeypatch, defer):
    """A store that stops answering: the waiting loads fail after
    load_timeout_ms. The queued one fails at once and is never read; the
    running one fails with a deferred_release event (where vLLM's
    JobResult has the field) that is set only once its read has ended.
    no-deferral: as with 0.33's JobResult, the running load reports when
    its read ends."""
    if defer and not kv.CAN_DEFER_RELEASE:
        pytest.skip("this vLLM's JobResult has no deferred_release")
    monkeypatch.setattr(kv, "CAN_DEFER_RELEASE", defer)
    m, _ = own_store
    keys = [uuid.uuid4().bytes + b"\0\0\0\0" for _ in range(4)]
    primary, tier = stored_tier(m.address, 8, 65536, keys, load_timeout_ms=300,
                                timeout_ms=8000)
    try:
        want = primary[:4].copy()
        primary[4:] = 0
        pause(m.pid)
        try:
            tier.submit_load(job(2, keys[:2], [4, 5], promotion=True))
            wait_running(tier, 2)
            tier.submit_load(job(3, keys[2:], [6, 7], promotion=True))
            res = wait_jobs(tier, 2 if defer else 1, timeout=3)
            assert not res[3].success and not res[3].successful_keys
            assert getattr(res[3], "deferred_release", None) is None
            if defer:
                ev = res[2].deferred_release
                assert not res[2].success and not res[2].successful_keys
                assert ev is not None and not ev.is_set()
                time.sleep(0.5)
                assert not ev.is_set()      # the read still waits on the master
            else:
                assert 2 not in res
            assert tier.has_pending_work()
            # loads just expired: lookups miss (vLLM recomputes) until the store answers
            assert tier.lookup(keys[0], None) == kv.LookupResult.MISS
        finally:
            os.kill(m.pid, signal.SIGCONT)
        if defer:
            assert ev.wait(8)
            assert wait_jobs(tier, 1, timeout=0.5) == {}    # job 2 reported once
        else:
            late = wait_jobs(tier, 1, timeout=8)
            assert late[2].success
        # the late read wrote its slots before the event; the expired job's never
        assert (primary[4:6] == want[:2]).all()
        assert not primary[6:8].any()
        assert tier.stats["expired_loads"] == (2 if defer else 1)
        assert tier.lookup(keys[0], None) == kv.LookupResult.HIT
        tier.drain_jobs()
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_vllm_tier_drain_jobs(own_store):
    """drain_jobs returns once every job has ended: each result is in
    get_finished_jobs() exactly once, the bytes are in place, and every
    deferred_release event handed out is set. While the store stalls it
    fails the queued jobs and waits for the running call only."""
    m, _ = own_store
    keys = [uuid.uuid4().bytes + b"\0\0\0\0" for _ in range(8)]
    primary, tier = stored_tier(m.address, 16, 65536, keys[:4], load_timeout_ms=300,
                                timeout_ms=8000)
    try:
        want = primary[:8].copy()
        tier.submit_store(job(2, keys[4:], [4, 5, 6, 7]))
        tier.submit_load(job(3, keys[:4], [8, 9, 10, 11], promotion=True))
        for k in keys:
            tier.lookup(k, None)
        tier.drain_jobs()
        res = wait_jobs(tier, 2, timeout=0.5)
        assert set(res) == {2, 3} and res[2].success and res[3].success
        assert (primary[8:12] == want[:4]).all()
        assert all(tier.lookup(k, None) == kv.LookupResult.HIT for k in keys)
        assert not tier.has_pending_work()
        # a stalled store: drain fails the queued jobs, waits for the running one
        primary[8:] = 0
        pause(m.pid)
        done = threading.Event()
        try:
            tier.submit_load(job(4, keys[4:6], [8, 9], promotion=True))
            wait_running(tier, 4)
            tier.submit_store(job(5, keys[:2], [0, 1]))
            tier.submit_load(job(6, keys[6:], [10, 11], promotion=True))
            threading.Thread(target=lambda: (tier.drain_jobs(), done.set()), daemon=True).start()
            assert not done.wait(1.0)       # the running read waits on the master
        finally:
            os.kill(m.pid, signal.SIGCONT)
        assert done.wait(8)
        res = wait_jobs(tier, 3, timeout=0.5)
        assert set(res) == {4, 5, 6}
        assert not res[5].success and not res[6].success
        if kv.CAN_DEFER_RELEASE:
            assert not res[4].success and res[4].deferred_release.is_set()
        else:
            assert res[4].success
        assert (primary[8:10] == want[4:6]).all() and not primary[10:12].any()
        assert wait_jobs(tier, 1, timeout=0.2) == {} and not tier.has_pending_work()
    finally:
        tier.shutdown()


def vllm_tiering():
    """vLLM's tiering manager and its CPU primary tier, or a skip."""
    pytest.importorskip("vllm")
    if not kv.HAVE_VLLM:
        pytest.skip("this vLLM's tier interface is older than 0.33's: the stand-in base is used")
    try:
        from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
        from vllm.v1.kv_offload.tiering import manager
        from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
    except ImportError as e:
        pytest.skip("this vLLM has no tiering manager of 0.33's shape: %s" % e)
    if not hasattr(manager, "CPUPrimaryTierOffloadingManager"):
        pytest.skip("this vLLM has no CPUPrimaryTierOffloadingManager")
    return SimpleNamespace(region=SharedOffloadRegion, manager=manager, hit=LookupResult,
                           ctx=ReqContext, end=ScheduleEndContext)


def steps_until(mgr, v, cond, timeout=10):
    """Engine steps (on_schedule_end) until cond() holds."""
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        mgr.on_schedule_end(v.end((), ()))
        time.sleep(0.01)
    return cond()


def test_vllm_tier_under_vllm_manager(own_store):
    """The tier under vLLM's own TieringOffloadingManager and CPU primary
    tier (a shared-memory region as vLLM makes it): chunks stored by vLLM
    cascade to the store, come back by promotion after a cache reset, byte
    for byte; a stalled store: the promotion fails, vLLM keeps the chunks
    out of its free pool until the read has ended (0.34's deferred
    release; 0.33 waits for the read), lookups miss meanwhile, and
    reset_cache (drain_jobs) meets vLLM's assertions."""
    v = vllm_tiering()
    m, _ = own_store
    nchunks, slot = 8, 65536
    region = v.region(uuid.uuid4().hex, nchunks, None, slot, slot)
    primary = v.manager.CPUPrimaryTierOffloadingManager(nchunks, region)
    view = primary.get_kv_memoryview()
    cache = np.asarray(view).view(np.uint8)
    tier = kv.KvferryTier(offloading_spec=None, primary_kv_view=view, tier_type="KvferryTier",
                          master=m.address, namespace=ns(), load_timeout_ms=300,
                          timeout_ms=8000)
    mgr = v.manager.TieringOffloadingManager(primary, [tier])
    try:
        keys = [uuid.uuid4().bytes + b"\0\0\0\0" for _ in range(4)]
        want = np.random.default_rng(3).integers(0, 256, (4, slot), dtype=np.uint8)
        a = v.ctx(req_id="a")
        mgr.on_new_request(a)
        out = mgr.prepare_store(keys, a)
        cache[np.asarray(out.store_spec.chunk_ids)] = want      # vLLM's GPU->CPU copy
        mgr.complete_store(keys, a, True)
        mgr.on_request_finished(a)
        assert steps_until(mgr, v, lambda: not mgr.has_pending_work())
        assert tier.stats["stores"] == 1 and tier.stats["bytes"] == 4 * slot
        mgr.reset_cache()
        mgr.on_reset_flushed()
        cache[:] = 0

        # promotion: the keys come back from the store
        b = v.ctx(req_id="b")
        mgr.on_new_request(b)
        assert steps_until(mgr, v, lambda: all(mgr.lookup(k, b) is v.hit.HIT for k in keys[:2]))
        ids = np.asarray(mgr.prepare_load(keys[:2], b).chunk_ids)
        assert (cache[ids] == want[:2]).all()
        mgr.complete_load(keys[:2], b)

        # a stalled store: the promotion of keys 2 and 3 hangs on the master
        pause(m.pid)
        try:
            assert mgr.lookup(keys[2], b) is v.hit.HIT_PENDING
            assert mgr.lookup(keys[3], b) is v.hit.HIT_PENDING
            mgr.on_schedule_end(v.end((), ()))      # submits the load
            wait_running(tier)
            if kv.CAN_DEFER_RELEASE:
                # failed at once; both chunks held until the read ends
                assert steps_until(mgr, v, lambda: primary.num_deferred_release_chunks == 2,
                                   timeout=3)
                assert mgr.lookup(keys[2], b) is v.hit.MISS and mgr.has_pending_work()
                time.sleep(0.5)
                assert primary.num_deferred_release_chunks == 2
            else:
                time.sleep(1.0)
                assert mgr.lookup(keys[2], b) is v.hit.HIT_PENDING
            # vLLM's reset drains the tier: it returns once the read has ended
            done = threading.Event()
            threading.Thread(target=lambda: (mgr.reset_cache(), done.set()), daemon=True).start()
            assert not done.wait(0.5)
        finally:
            os.kill(m.pid, signal.SIGCONT)
        assert done.wait(10)        # vLLM asserts no job and no deferred release is left
        if kv.CAN_DEFER_RELEASE:
            assert primary.num_deferred_release_chunks == 0
        mgr.on_reset_flushed()
        # the store answers again: the keys promote and load byte for byte
        cache[:] = 0
        assert steps_until(mgr, v, lambda: all(mgr.lookup(k, b) is v.hit.HIT for k in keys))
        ids = np.asarray(mgr.prepare_load(keys, b).chunk_ids)
        assert (cache[ids] == want).all()
        mgr.complete_load(keys, b)
        mgr.on_request_finished(b)
    finally:
        tier.shutdown()
        del cache, view
        mgr.shutdown()


def tier_shape(kv):
    """Public names and abstract methods of the module's base, and the
    fields of its result types."""
    import dataclasses

    base = kv.SecondaryTierManager
    return {"names": sorted(n for n in dir(base) if not n.startswith("_")),
            "abstract": sorted(base.__abstractmethods__),
            "result": [f.name for f in dataclasses.fields(kv.JobResult)],
            "job": [f.name for f in dataclasses.fields(kv.TransferJob)]}


def test_vllm_tier_stand_in_in_step():
    """The stand-in base (the module in a process without vLLM) has the
    names, abstract methods and result types of vLLM 0.34's, where that
    vLLM is installed, else the names 0.34 has."""
    import inspect
    import json
    import subprocess
    import sys

    code = ("import json, sys\n"
            "sys.modules['vllm'] = None  # as if vLLM were not installed\n"
            "from kvferry import vllm_tier as kv\n"
            "assert not kv.HAVE_VLLM and not kv.KvferryTier.__abstractmethods__\n"
            + inspect.getsource(tier_shape) + "\nprint(json.dumps(tier_shape(kv)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    stand_in = json.loads(out.stdout.splitlines()[-1])
    if kv.HAVE_VLLM and kv.CAN_DEFER_RELEASE:
        real = tier_shape(kv)
        # cache_hit_source: vLLM derives it from medium with its own enum
        assert set(real["names"]) - set(stand_in["names"]) == {"cache_hit_source"}
        assert set(stand_in["names"]) <= set(real["names"])
        assert stand_in["abstract"] == real["abstract"]
        assert stand_in["result"] == real["result"] and stand_in["job"] == real["job"]
        return
    assert stand_in["abstract"] == ["drain_jobs", "get_finished_jobs", "lookup",
                                    "on_new_request", "submit_load", "submit_store"]
    assert "deferred_release" in stand_in["result"] and "touch" not in stand_in["names"]
    for name in ("has_pending_work", "take_events", "on_request_finished",
                 "serve_external_requests", "on_schedule_end", "shutdown", "bp_detector",
                 "block_size_bytes", "tolerates_off_thread_polling", "medium", "get_stats",
                 "build_metric_definitions", "config_info_keys", "config_info"):
        assert name in stand_in["names"], name


# -- LMCache --------------------------------------------------------------


class FakeMemoryObj:
    """What LMCache's connectors use of a MemoryObj: byte_array, refs."""

    def __init__(self, n):
        self.buf = bytearray(n)
        self.byte_array = memoryview(self.buf)
        self.refs = 1

    def ref_count_down(self):
        self.refs -= 1


class FakeCPUBackend:
    def __init__(self, n, config):
        self.n, self.config, self.metadata = n, config, None
        self.live = []

    def allocate(self, shapes, dtypes, fmt):
        o = FakeMemoryObj(self.n)
        self.live.append(o)
        return o


class FakeConfig:
    def __init__(self, master):
        self.extra_config = {"kvferry.master": master, "kvferry.timeout_ms": 5000}


class Key:
    def __init__(self, s):
        self.s = s

    def to_string(self):
        return self.s


@pytest.mark.skipif(kl.HAVE_LMCACHE, reason="stand-in test; the real class is tested below")
def test_lmcache_connector_stand_in(master, store):
    backend = FakeCPUBackend(4096, FakeConfig(master))
    conn = kl.KvferryConnector(loop=None, local_cpu_backend=backend, config=backend.config)

    async def go():
        keys = [Key("m@1@0@%s@bfloat16" % uuid.uuid4().hex) for _ in range(5)]
        objs = [FakeMemoryObj(4096) for _ in keys]
        for i, o in enumerate(objs):
            o.buf[:] = bytes([i + 1]) * 4096
        assert not await conn.exists(keys[0])
        await conn.put(keys[0], objs[0])
        assert await conn.exists(keys[0]) and conn.exists_sync(keys[0])
        got = await conn.get(keys[0])
        assert bytes(got.buf) == bytes(objs[0].buf)
        await conn.batched_put(keys[1:4], objs[1:4])
        assert conn.batched_contains(keys) == 4
        assert await conn.batched_async_contains("l", keys) == 4
        gots = await conn.batched_get(keys)
        assert [bytes(g.buf) == bytes(o.buf) for g, o in zip(gots[:4], objs)] == [True] * 4
        assert gots[4] is None
        part = await conn.batched_get_non_blocking("l", [keys[0], keys[4], keys[1]])
        assert len(part) == 1
        assert await conn.get(keys[4]) is None and conn.stats["misses"] >= 2
        # a put of an existing key is not an error
        await conn.put(keys[0], objs[1])
        assert bytes((await conn.get(keys[0])).buf) == bytes(objs[0].buf)
        assert conn.remove_sync(keys[0]) and not conn.remove_sync(keys[0])
        assert await conn.ping() == 0 and conn.support_ping()
        assert keys[1].s in await conn.list()
        await conn.close()

    asyncio.run(go())


def test_lmcache_plugin_via_create_connector(master):
    """LMCache's own CreateConnector builds the plugin from its config
    (remote_url plugin://kvferry) and drives it through its
    InstrumentedRemoteConnector, with LMCache's real memory objects."""
    pytest.importorskip("lmcache")
    torch = pytest.importorskip("torch")
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_allocators.ad_hoc_memory_allocator import AdHocMemoryAllocator
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import CreateConnector
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

    assert kl.HAVE_LMCACHE and issubclass(kl.KvferryConnector, RemoteConnector)
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=256, remote_url="plugin://kvferry", remote_serde="naive",
        remote_storage_plugins=["kvferry"],
        extra_config={"remote_storage_plugin.kvferry.module_path": "kvferry.lmcache",
                      "remote_storage_plugin.kvferry.class_name": "KvferryConnector",
                      "kvferry.master": master})
    meta = LMCacheMetadata(model_name=ns(), world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.bfloat16,
                           kv_shape=(2, 2, 256, 2, 16))
    alloc = AdHocMemoryAllocator(device="cpu")

    class Backend:
        config, metadata = cfg, meta

        def allocate(self, shapes, dtypes, fmt=None, *a, **k):
            return alloc.allocate(shapes, dtypes, fmt) if fmt is not None else \
                alloc.allocate(shapes, dtypes)

    loop = asyncio.new_event_loop()
    try:
        conn = CreateConnector("plugin://kvferry", loop, Backend(), cfg, meta, "kvferry")
        key = CacheEngineKey(meta.model_name, 1, 0, 12345, torch.bfloat16)
        obj = Backend().allocate(meta.get_shapes(), meta.get_dtypes(), conn.meta_fmt
                                 if hasattr(conn, "meta_fmt") else None)
        raw = obj.raw_data.view(torch.uint8).view(-1)
        raw.copy_(torch.randint(0, 255, (raw.numel(),), dtype=torch.uint8))
        want = bytes(obj.byte_array)
        assert len(want) == 65536
        other = CacheEngineKey(meta.model_name, 1, 0, 999, torch.bfloat16)

        async def go():
            assert not await conn.exists(key)
            await conn.put(key, obj)
            assert await conn.exists(key) and conn.exists_sync(key)
            got = await conn.get(key)
            assert got is not None and bytes(got.byte_array) == want
            got.ref_count_down()
            assert await conn.get(other) is None
        loop.run_until_complete(go())
        loop.run_until_complete(conn.close())
        obj.ref_count_down()
    finally:
        loop.close()


def test_lmcache_resp_door_via_create_connector(master, tmp_path):
    """LMCache's built-in resp:// connector (its C++ client, lmcache_redis)
    built by its own CreateConnector against ``kvferry resp`` with a
    password, its event loop in a thread as LMCache runs it: batched puts
    and gets of LMCache's memory objects come back byte for byte; a
    wrong password gets no data through."""
    pytest.importorskip("lmcache")
    torch = pytest.importorskip("torch")
    import threading

    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_allocators.ad_hoc_memory_allocator import AdHocMemoryAllocator
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import CreateConnector
    from lmcache.v1.storage_backend.native_clients import resp_client

    if not resp_client.REDIS_AVAILABLE:
        pytest.skip("this LMCache has no lmcache_redis extension")
    pw = uuid.uuid4().hex
    pw_file = tmp_path / "resp.pw"
    pw_file.write_text(pw + "\n")
    pw_file.chmod(0o600)
    meta = LMCacheMetadata(model_name=ns(), world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.bfloat16,
                           kv_shape=(2, 2, 256, 2, 16))
    alloc = AdHocMemoryAllocator(device="cpu")

    class Backend:
        metadata = meta

        def __init__(self, password):
            self.config = LMCacheEngineConfig.from_defaults(
                chunk_size=256, remote_url="resp://" + door.address, remote_serde="naive",
                save_unfull_chunk=False,
                extra_config={"password": password, "resp_num_threads": 2})

        def allocate(self, shapes, dtypes, fmt=None, *a, **k):
            return alloc.allocate(shapes, dtypes, fmt) if fmt is not None else \
                alloc.allocate(shapes, dtypes)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coro, timeout=20):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def connect(password):
        b = Backend(password)
        return CreateConnector("resp://" + door.address, loop, b, b.config, meta)

    def close(c):
        # RESPConnector.close() of LMCache 0.5.6 blocks its own loop (a
        # synchronous executor shutdown awaited on the loop): close the
        # native client as that method would after it
        c._connector.client.close()

    objs = []
    try:
        with Resp(master, "--password-file", str(pw_file)) as door:
            keys = [CacheEngineKey(meta.model_name, 1, 0, 1000 + i, torch.bfloat16)
                    for i in range(6)]
            for _ in keys:
                obj = alloc.allocate(meta.get_shapes(), meta.get_dtypes())
                raw = obj.raw_data.view(torch.uint8).view(-1)
                raw.copy_(torch.randint(0, 255, (raw.numel(),), dtype=torch.uint8))
                objs.append(obj)
            want = [bytes(o.byte_array) for o in objs]
            conn = connect(pw)
            assert not on_loop(conn.exists(keys[0]))
            on_loop(conn.batched_put(keys[:4], objs[:4]))
            on_loop(conn.put(keys[4], objs[4]))
            assert [on_loop(conn.exists(k)) for k in keys] == [True] * 5 + [False]
            got = on_loop(conn.batched_get(keys[:5]))
            assert [bytes(g.byte_array) for g in got] == want[:5]
            one = on_loop(conn.get(keys[2]))
            assert bytes(one.byte_array) == want[2]
            for g in got + [one]:
                g.ref_count_down()
            close(conn)

            # a wrong password: refused at connect or on the first command
            bad = None
            try:
                bad = connect("not-the-password")
                res = on_loop(bad.get(keys[0]))
            except Exception:
                res = None
            assert res is None or bytes(res.byte_array) != want[0]
            if bad is not None:
                close(bad)
            # the door keeps serving clients with the password
            conn = connect(pw)
            assert on_loop(conn.exists(keys[1]))
            close(conn)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        for o in objs:
            o.ref_count_down()


# -- SGLang ---------------------------------------------------------------


class FakeHostPool:
    """SGLang's MHA host pool, page-first layout: kv_buffer [2, size,
    layers, heads, dim], get_page_buffer_meta as SGLang computes it."""

    def __init__(self, size=64, page_size=4, layers=3, heads=2, dim=8, itemsize=2):
        self.size, self.page_size, self.layer_num = size, page_size, layers
        self.token_bytes = layers * heads * dim * itemsize
        self.kv_buffer = np.zeros(2 * size * self.token_bytes, dtype=np.uint8)
        self.layout = "page_first"

    def get_page_buffer_meta(self, indices):
        base = self.kv_buffer.ctypes.data
        v_off = self.size * self.token_bytes
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            k = base + int(indices[i]) * self.token_bytes
            ptrs += [k, k + v_off]
        return ptrs, [self.page_size * self.token_bytes] * len(ptrs)

    def page(self, first_token):
        n = self.page_size * self.token_bytes
        k = first_token * self.token_bytes
        v = k + self.size * self.token_bytes
        return bytes(self.kv_buffer[k:k + n]) + bytes(self.kv_buffer[v:v + n])


class FakeStorageConfig:
    def __init__(self, master, name):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = 0, 1, 0, 1
        self.is_mla_model = False
        self.model_name = name
        self.extra_config = {"backend_name": "kvferry", "module_path": "kvferry.sglang",
                             "class_name": "KvferryHiCacheStorage", "master": master}


def test_sglang_backend_v1(master):
    name = ns()
    a = ks.KvferryHiCacheStorage(FakeStorageConfig(master, name), {})
    b = ks.KvferryHiCacheStorage(FakeStorageConfig(master, name), {})
    pa, pb = FakeHostPool(), FakeHostPool()
    pa.kv_buffer[:] = np.random.default_rng(2).integers(0, 256, pa.kv_buffer.size, dtype=np.uint8)
    a.register_mem_pool_host(pa)
    b.register_mem_pool_host(pb)
    try:
        keys = [uuid.uuid4().hex for _ in range(4)]
        idx = np.arange(8, 24)                      # pages at tokens 8, 12, 16, 20
        assert a.batch_exists(keys) == 0
        assert a.batch_set_v1(keys[:3], idx[:12]) == [True] * 3
        assert a.batch_set_v1(keys[:3], idx[:12]) == [True] * 3   # again: present
        assert b.batch_exists(keys) == 3 and b.exists(keys[0]) and not b.exists(keys[3])
        dst = np.arange(40, 56)
        assert b.batch_get_v1(keys, dst) == [True, True, True, False]
        for j in range(3):
            assert pb.page(40 + 4 * j) == pa.page(8 + 4 * j)
        assert b.get_stats()["hits"] == 3
        # the older one-key forms
        val = np.arange(100, dtype=np.uint8)
        assert a.set("one-" + name, val)
        out = np.zeros(100, dtype=np.uint8)
        assert b.get("one-" + name, out) is out and (out == val).all()
        assert b.get("none-" + name, out) is None
        assert a.batch_set(["x-" + name, "y-" + name], [val, val])
        assert [o is not None for o in b.batch_get(["x-" + name, "z-" + name],
                                                   [out, out.copy()])] == [True, False]
        a.clear()
        assert b.batch_exists(keys) == 0
    finally:
        a.close()
        b.close()


def test_sglang_via_backend_factory(master):
    pytest.importorskip("sglang")
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=ns(),
        extra_config={"backend_name": "kvferry", "module_path": "kvferry.sglang",
                      "class_name": "KvferryHiCacheStorage", "master": master})
    backend = StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert isinstance(backend, HiCacheStorage)
    pool = FakeHostPool()
    backend.register_mem_pool_host(pool)
    keys = [uuid.uuid4().hex]
    assert backend.batch_set_v1(keys, np.arange(0, 4)) == [True]
    assert backend.batch_exists(keys) == 1
    backend.close()


def test_modules_import_without_engines():
    for mod, flag in ((kv, "HAVE_VLLM"), (kl, "HAVE_LMCACHE"), (ks, "HAVE_SGLANG")):
        assert isinstance(getattr(mod, flag), bool)
    assert kvferry.Store is kv.Store
