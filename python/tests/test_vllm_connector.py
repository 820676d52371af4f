"""kvferry.vllm_connector against a real master and node.

The connector's scheduler side (lookup, allocation, per-step metadata,
request end) and worker side (KV tensor registration, load, save, load
errors) are driven the way vLLM's scheduler and model runner call them,
with caches in vLLM's per-layer layout (in host memory, and in GPU memory
where torch sees a GPU), and every loaded byte compared.
Where vLLM is importable (python/integrations/install.sh vllm), the
connector is built by vLLM's own KVConnectorFactory from a real
VllmConfig with ``kv_connector_module_path``, and driven with vLLM's real
Request, KVCacheBlocks, KVCacheConfig, SchedulerOutput and torch CPU
tensors shaped by vLLM's attention backend; elsewhere the same flow runs
over the module's stand-in base with numpy caches.
"""

import inspect
import time
import types
import uuid

import numpy as np
import pytest

import kvferry
from kvferry import kv_chunks as kc
from kvferry import vllm_connector as vc

BS, HEADS, HD, LAYERS, NBLK = 16, 2, 32, 3, 24


def ns():
    return "vc-" + uuid.uuid4().hex[:10]


OVERLAP = [False]
LOAD_MODE = ["layerwise"]


def extra(master, namespace):
    """The connector's configuration: chunks of 2 blocks in 2 layer groups
    (objects, tails and groups all occur with a few blocks); loads and
    saves on the mover thread or in the caller's (the overlap fixture)."""
    return {"master": master, "namespace": namespace, "model": "tiny",
            "chunk_tokens": 2 * BS, "layer_groups": 2, "overlap": OVERLAP[0],
            "load_mode": LOAD_MODE[0]}


@pytest.fixture(params=["inline", "overlap"], autouse=True)
def overlap(request):
    OVERLAP[0] = request.param == "overlap"
    yield
    OVERLAP[0] = False


def chunk_blocks(spec):
    return sum(c.blocks for c in spec.chunks)


# -- stand-in world (no vLLM): plain objects with vLLM's attribute names ------


class Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def plain_world(master, namespace, role, device=None):
    spec = types.SimpleNamespace(block_size=BS, num_kv_heads=HEADS, head_size=HD, dtype="float16")
    names = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
    kvcc = types.SimpleNamespace(num_blocks=NBLK, kv_cache_groups=[
        types.SimpleNamespace(kv_cache_spec=spec, layer_names=names)])
    tcfg = types.SimpleNamespace(kv_role=role, kv_connector_extra_config=extra(master, namespace))
    vcfg = types.SimpleNamespace(kv_transfer_config=tcfg, model_config=None, parallel_config=None,
                                 cache_config=None)

    def make(r):
        return vc.KvferryConnector(vcfg, r, kvcc)

    def caches(seed):
        rng = np.random.default_rng(seed)
        arrs = {n: rng.integers(0, 1 << 16, (2, NBLK, BS, HEADS, HD), dtype=np.uint16)
                .view(np.float16) for n in names}
        if device is None:
            return arrs
        import torch  # GPU caches: the same bytes in torch tensors on the device

        return {n: torch.from_numpy(a.view(np.int16)).to(device).view(torch.float16)
                for n, a in arrs.items()}

    def same(a, b):
        if device is None:
            return np.array_equal(a.view(np.uint16), b.view(np.uint16))
        import torch

        return torch.equal(a.view(torch.int16), b.view(torch.int16))

    def request(rid, tokens):
        return types.SimpleNamespace(request_id=rid, prompt_token_ids=list(tokens))

    def sched_out(new=(), cached=(), finished=(), preempted=()):
        nr = [types.SimpleNamespace(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids,
                                    block_ids=(list(ids),), num_computed_tokens=c)
              for r, ids, c, _ in new]
        cr = types.SimpleNamespace(req_ids=[r.request_id for r, _, _, _ in cached],
                                   resumed_req_ids=set(),
                                   new_block_ids=[(list(ids),) for _, ids, _, _ in cached],
                                   num_computed_tokens=[c for _, _, c, _ in cached])
        sched = {r.request_id: n for r, _, _, n in list(new) + list(cached)}
        return types.SimpleNamespace(scheduled_new_reqs=nr, scheduled_cached_reqs=cr,
                                     num_scheduled_tokens=sched, finished_req_ids=set(finished),
                                     preempted_req_ids=set(preempted))

    return types.SimpleNamespace(make=make, caches=caches, request=request, sched_out=sched_out,
                                 blocks=Blocks, scheduler=0, worker=1, names=names,
                                 block=lambda t, x: t[:, x], same=same,
                                 copy_block=lambda t, dst, src: t.__setitem__(
                                     (slice(None), dst), t[:, src]))


# -- the real vLLM world -----------------------------------------------------


def vllm_caches(torch, names, spec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, layout_name):
    """vLLM's KV cache config, a caches(seed) that allocates the caches
    as its model runner does, and the axis of a layer's tensor that
    indexes blocks: with vLLM's own allocator in one of its layouts
    (vLLM 0.32 and later; per-layer ``[B, H, N, C]`` views, blocks
    first), else (vLLM 0.26, the release run on the GPU machine) one
    ``[2, blocks, block_size, heads, head_dim]`` tensor per layer, its
    attention backend's shape."""
    page = spec.page_size_bytes
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.worker.utils import allocate_kv_cache
    except ImportError:
        if layout_name != "LBHNC":
            pytest.skip("this vLLM has one KV cache layout")
        kvcc = KVCacheConfig(num_blocks=NBLK,
                             kv_cache_tensors=[KVCacheTensor(size=page * NBLK, shared_by=[n])
                                               for n in names],
                             kv_cache_groups=[KVCacheGroupSpec(names, spec)])

        def allocate():
            return {n: torch.zeros((2, NBLK, BS, HEADS, HD), dtype=torch.float16) for n in names}
        axis = 1
    else:
        lay = KVCacheLayout[layout_name]
        if lay.is_layer_compact:
            strides = dict(layer_stride=page * NBLK, block_stride=page)
        else:
            strides = dict(layer_stride=page, block_stride=page * LAYERS)
        kvcc = KVCacheConfig(num_blocks=NBLK,
                             kv_cache_tensors=[KVCacheTensor(size=page * NBLK * LAYERS,
                                                             layers=names, **strides)],
                             kv_cache_groups=[KVCacheGroupSpec(names, spec)])
        kvcc.kv_cache_layout = layout_name

        def allocate():
            # vLLM's own allocator: per-layer [B, H, N, C] views of one buffer
            return allocate_kv_cache(kvcc, torch.device("cpu"), lay)
        axis = 0

    def caches(seed):
        kv = allocate()
        g = torch.Generator().manual_seed(seed)
        for t in kv.values():
            t.view(torch.int16).copy_(torch.randint(-(1 << 15), 1 << 15, tuple(t.shape),
                                                    generator=g, dtype=torch.int16))
        return kv

    return kvcc, caches, axis


def vllm_world(master, namespace, role, layout_name="LBHNC"):
    torch = pytest.importorskip("torch")
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            KVCacheTensor)
    from vllm.v1.request import Request

    names = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HD, dtype=torch.float16)
    kvcc, caches, axis = vllm_caches(torch, names, spec, KVCacheConfig, KVCacheGroupSpec,
                                     KVCacheTensor, layout_name)

    def block(t, x):
        return t.select(axis, x)
    tcfg = KVTransferConfig(kv_connector="KvferryConnector",
                            kv_connector_module_path="kvferry.vllm_connector", kv_role=role,
                            kv_connector_extra_config=extra(master, namespace))
    vcfg = VllmConfig(cache_config=CacheConfig(block_size=BS), kv_transfer_config=tcfg,
                      device_config=DeviceConfig(device="cpu"))

    def make(r):
        return KVConnectorFactory.create_connector(config=vcfg, role=r, kv_cache_config=kvcc)

    def request(rid, tokens):
        return Request(request_id=rid, prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=1), pooling_params=None)

    def sched_out(new=(), cached=(), finished=(), preempted=()):
        nr = []
        for r, ids, c, _ in new:
            r.num_computed_tokens = c
            if "prefill_token_ids" in inspect.signature(NewRequestData.from_request).parameters:
                nr.append(NewRequestData.from_request(r, (list(ids),), list(r.prompt_token_ids)))
            else:  # before vLLM 0.34
                nr.append(NewRequestData.from_request(r, (list(ids),)))
        cr = CachedRequestData.make_empty()
        for r, ids, c, _ in cached:
            cr.req_ids.append(r.request_id)
            cr.new_block_ids.append((list(ids),))
            cr.num_computed_tokens.append(c)
            cr.num_output_tokens.append(0)
        out = SchedulerOutput.make_empty()
        out.scheduled_new_reqs, out.scheduled_cached_reqs = nr, cr
        out.num_scheduled_tokens = {r.request_id: n for r, _, _, n in list(new) + list(cached)}
        out.finished_req_ids = set(finished)
        out.preempted_req_ids = set(preempted)
        return out

    def blocks(ids):
        return KVCacheBlocks(blocks=([KVCacheBlock(block_id=i) for i in ids],))

    return types.SimpleNamespace(make=make, caches=caches, request=request, sched_out=sched_out,
                                 blocks=blocks, scheduler=KVConnectorRole.SCHEDULER,
                                 worker=KVConnectorRole.WORKER, names=names,
                                 block=block,
                                 copy_block=lambda t, dst, src: block(t, dst).copy_(block(t, src)),
                                 same=lambda a, b: torch.equal(a.view(torch.int16), b.view(torch.int16)))


@pytest.fixture(params=["plain", "plain-cuda", "vllm-LBHNC", "vllm-LBNHC", "vllm-BLHNC"])
def world(request, master):
    """world(namespace, kv_role, master=...) -> the objects of one
    connector configuration: plain objects (caches in host memory, or in
    GPU memory where torch sees a GPU: the connector's direct GPU save
    and load), or vLLM's real ones with caches in one of vLLM's layouts
    (layer-compact, or block-outermost)."""
    if request.param == "plain-cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("no GPU that torch sees")
        return lambda name, role, m=master: plain_world(m, name, role, "cuda")
    if request.param.startswith("vllm"):
        pytest.importorskip("vllm")
        assert vc.HAVE_VLLM
        lay = request.param.split("-")[1]
        return lambda name, role, m=master: vllm_world(m, name, role, lay)
    return lambda name, role, m=master: plain_world(m, name, role)


def step(w, conn_s, conn_w, out):
    """One engine step: the scheduler's metadata to the worker, then the
    forward pass's calls (load, per-layer wait and save, save wait)."""
    meta = conn_s.build_connector_meta(out)
    conn_w.bind_connector_metadata(meta)
    conn_w.start_load_kv(None)
    for n in w.names:
        conn_w.wait_for_layer_load(n)
        conn_w.save_kv_layer(n, None, None)
    conn_w.wait_for_save()
    conn_w.clear_connector_metadata()
    return meta


def blocks_equal(w, a, b, ids_a, ids_b):
    for n in w.names:
        for x, y in zip(ids_a, ids_b):
            if not w.same(w.block(a[n], x), w.block(b[n], y)):
                return False
    return True


def test_prefill_decode_handoff(world):
    """A producer prefills a prompt in two chunks and saves its blocks; a
    consumer with other caches finds them, loads them into its own
    blocks, byte for byte, and vLLM computes only the last token."""
    name = ns()
    wp, wd = world(name, "kv_producer"), world(name, "kv_consumer")
    p_s, p_w = wp.make(wp.scheduler), wp.make(wp.worker)
    d_s, d_w = wd.make(wd.scheduler), wd.make(wd.worker)
    try:
        assert type(p_s) is vc.KvferryConnector and isinstance(p_s, vc.KVConnectorBase_V1)
        p_kv, d_kv = wp.caches(1), wd.caches(2)
        p_w.register_kv_caches(p_kv)
        d_w.register_kv_caches(d_kv)
        tokens = list(range(1000, 1000 + 5 * BS + 3))  # 5 full blocks and 3 tokens
        req = wp.request("p1", tokens)
        assert p_s.get_num_new_matched_tokens(req, 0) == (0, False)  # producer: no loads
        p_s.update_state_after_alloc(req, wp.blocks([]), 0)
        p_ids = [7, 3, 11, 0, 19, 5]
        # chunked prefill: 40 tokens, then the rest
        m1 = step(wp, p_s, p_w, wp.sched_out(new=[(req, p_ids[:3], 0, 40)]))
        assert [chunk_blocks(s) for s in m1.saves] == [2] and not m1.loads
        m2 = step(wp, p_s, p_w, wp.sched_out(cached=[(req, p_ids[3:], 40, len(tokens) - 40)]))
        # the second chunk and a tail of the fifth block
        assert [[c.blocks for c in s.chunks] for s in m2.saves] == [[2, 1]]
        assert p_w.flush()
        assert p_w.stats["saved_chunks"] == 3 and p_w.stats["saved_objects"] == 6
        defer, params = p_s.request_finished(req, p_ids)
        # the blocks stay vLLM's until the worker's gathers are done: the
        # next step names the request, the worker reports it once
        assert defer is True and params["kvferry"]["stored_tokens"] == 5 * BS
        m3 = step(wp, p_s, p_w, wp.sched_out(finished=["p1"]))
        assert m3.release == ["p1"] and not m3.wait_saves and not m3.saves
        assert p_w.get_finished({"p1"}) == ({"p1"}, None)
        assert p_w.get_finished(set()) == (None, None)

        dreq = wd.request("d1", tokens)
        n, is_async = d_s.get_num_new_matched_tokens(dreq, 0)
        assert (n, is_async) == (5 * BS, False)
        d_ids = [2, 9, 14, 21, 4, 16]
        d_s.update_state_after_alloc(dreq, wd.blocks(d_ids), n)
        m = step(wd, d_s, d_w, wd.sched_out(new=[(dreq, d_ids, n, len(tokens) - n)]))
        assert len(m.loads) == 1 and not m.saves           # consumer: no saves
        assert d_w.get_block_ids_with_load_errors() == set()
        assert d_w.stats["loaded_tokens"] == 5 * BS
        # one engine's scheduler and worker count together (vLLM builds both
        # in one process): the worker's stats show the scheduler's lookup
        assert d_w.stats["lookups"] == 1 and d_w.stats["hit_tokens"] == 5 * BS
        assert blocks_equal(wd, p_kv, d_kv, p_ids[:5], d_ids[:5])
        # the sixth block (partial) was neither saved nor loaded
        assert not blocks_equal(wd, p_kv, d_kv, p_ids[5:], d_ids[5:])
        assert d_s.request_finished(dreq, d_ids) == (False, None)
    finally:
        for c in (p_s, p_w, d_s, d_w):
            c.shutdown()


def test_gathers_hold_blocks_not_steps(world):
    """A step does not wait for the last step's gathers while the blocks
    they read stay the requests' (running, or finished and held until
    get_finished names them); a preempted request's blocks go back to
    vLLM at once, so that step waits for every gather first."""
    name = ns()
    w = world(name, "kv_both")
    s, wk = w.make(w.scheduler), w.make(w.worker)
    try:
        wk.register_kv_caches(w.caches(5))
        a, b = w.request("ga", list(range(4 * BS))), w.request("gb", list(range(7, 7 + 4 * BS)))
        m1 = step(w, s, wk, w.sched_out(new=[(a, [1, 2, 3, 4], 0, 2 * BS)]))
        assert m1.saves and not m1.wait_saves
        m2 = step(w, s, wk, w.sched_out(new=[(b, [5, 6, 7, 8], 0, BS)]))
        assert not m2.wait_saves and not m2.release
        # a, which saved, is preempted: its blocks may be rewritten now
        m3 = step(w, s, wk, w.sched_out(preempted=["ga"]))
        assert m3.wait_saves
        # b never saved a chunk: its end releases nothing and holds nothing
        assert s.request_finished(b, [5, 6, 7, 8])[0] is False
        assert s.request_finished(a, [1, 2, 3, 4])[0] is True
        m4 = step(w, s, wk, w.sched_out(finished=["ga", "gb"]))
        assert m4.release == ["ga"] and not m4.wait_saves
        assert wk.flush()
        assert wk.get_finished({"ga", "gb"}) == ({"ga"}, None)
        assert wk.get_finished(set()) == (None, None)
    finally:
        s.shutdown()
        wk.shutdown()


def test_local_prefix_and_last_token(world):
    """Blocks vLLM holds locally are not loaded again; a prompt of whole
    blocks leaves its last block to vLLM."""
    name = ns()
    w = world(name, "kv_both")
    s, wk = w.make(w.scheduler), w.make(w.worker)
    try:
        kv = w.caches(3)
        wk.register_kv_caches(kv)
        tokens = list(range(4 * BS))
        r = w.request("a", tokens)
        step(w, s, wk, w.sched_out(new=[(r, [1, 2, 3, 4], 0, len(tokens))]))
        s.request_finished(r, [1, 2, 3, 4])
        assert wk.flush()
        r2 = w.request("b", tokens)
        # 4 blocks stored, the last token is vLLM's: 3 blocks; 1 is local
        assert s.get_num_new_matched_tokens(r2, BS) == (2 * BS, False)
        s.update_state_after_alloc(r2, w.blocks([1, 6, 7, 8]), 2 * BS)
        before = {n: w.block(t, 1).clone() if hasattr(t, "clone") else w.block(t, 1).copy()
                  for n, t in kv.items()}
        m = step(w, s, wk, w.sched_out(new=[(r2, [1, 6, 7, 8], 3 * BS, BS)]))
        assert [(ld.start, ld.end) for ld in m.loads] == [(BS, 3 * BS)]
        assert blocks_equal(w, kv, kv, [2, 3], [6, 7])
        for n in w.names:
            assert w.same(w.block(kv[n], 1), before[n])
        assert s.get_num_new_matched_tokens(w.request("c", tokens[:BS]), 0) == (0, False)
    finally:
        s.shutdown()
        wk.shutdown()


def test_corrupt_and_missing_blocks_are_load_errors(world, store):
    """A chunk object replaced by other bytes, or removed after the
    lookup: the worker reports those blocks, vLLM recomputes them."""
    name = ns()
    w = world(name, "kv_both")
    s, wk = w.make(w.scheduler), w.make(w.worker)
    try:
        kv = w.caches(4)
        wk.register_kv_caches(kv)
        tokens = list(range(500, 500 + 4 * BS + 1))
        r = w.request("a", tokens)
        step(w, s, wk, w.sched_out(new=[(r, [0, 1, 2, 3, 4], 0, len(tokens))]))
        assert wk.flush()
        cache = wk.cache
        chunks = cache.chunks_of(tokens, 4 * BS)
        assert [c.blocks for c in chunks] == [2, 2]
        # chunk 1, group 0: its first block's first piece gets other bytes
        key = cache.object_key(chunks[1].key, 2, 0)
        raw = bytearray(store.get_bytes(key))
        at = kc.header_bytes(len(cache.map.group_parts(0)), 2)  # piece 0 of block 0
        raw[at:at + 8] = b"\x5a" * 8
        store.remove(key)
        store.put(key, bytes(raw))
        r2 = w.request("b", tokens)
        n, _ = s.get_num_new_matched_tokens(r2, 0)
        assert n == 4 * BS                     # every object is there
        s.update_state_after_alloc(r2, w.blocks([10, 11, 12, 13, 14]), n)
        store.remove(cache.object_key(chunks[1].key, 2, 1))
        step(w, s, wk, w.sched_out(new=[(r2, [10, 11, 12, 13, 14], n, 1)]))
        assert wk.get_block_ids_with_load_errors() == {12, 13}
        assert wk.get_block_ids_with_load_errors() == set()
        assert cache.stats.corrupt_misses == 1
        assert blocks_equal(w, kv, kv, [0, 1], [10, 11])
        # the failed chunk left the store, and the step's save did not
        # write the failed blocks back under their keys
        assert wk.flush()
        assert s.get_num_new_matched_tokens(w.request("c", tokens), 0) == (2 * BS, False)
        # vLLM (kv_load_failure_policy "recompute") computes the request
        # again from its first failed block: the next step schedules it
        # with fewer computed tokens, and the recomputed chunk is saved
        for nm in w.names:  # what the forward pass writes
            w.copy_block(kv[nm], 12, 2)
            w.copy_block(kv[nm], 13, 3)
        m = step(w, s, wk, w.sched_out(cached=[(r2, [], 2 * BS, 2 * BS + 1)]))
        assert [chunk_blocks(x) for x in m.saves] == [2]
        assert wk.flush()
        assert s.get_num_new_matched_tokens(w.request("e", tokens), 0) == (4 * BS, False)
        r3 = w.request("f", tokens)
        n, _ = s.get_num_new_matched_tokens(r3, 0)
        s.update_state_after_alloc(r3, w.blocks([20, 21, 22, 23, 24]), n)
        step(w, s, wk, w.sched_out(new=[(r3, [20, 21, 22, 23, 24], n, 1)]))
        assert wk.get_block_ids_with_load_errors() == set()
        assert blocks_equal(w, kv, kv, [0, 1, 2, 3], [20, 21, 22, 23])
    finally:
        s.shutdown()
        wk.shutdown()


def test_other_layout_is_a_miss(world, master):
    """Another namespace or model: no hit."""
    name = ns()
    w = world(name, "kv_both")
    s, wk = w.make(w.scheduler), w.make(w.worker)
    other = world(name + "x", "kv_both").make(w.scheduler)
    try:
        wk.register_kv_caches(w.caches(5))
        tokens = list(range(3 * BS))
        r = w.request("a", tokens)
        step(w, s, wk, w.sched_out(new=[(r, [0, 1, 2], 0, len(tokens))]))
        assert wk.flush()
        assert s.get_num_new_matched_tokens(w.request("b", tokens), 0)[0] == 2 * BS
        assert other.get_num_new_matched_tokens(w.request("c", tokens), 0)[0] == 0
    finally:
        for c in (s, wk, other):
            c.shutdown()


def test_dead_store_is_a_miss(world):
    """A store that dies: lookups answer 0 (vLLM computes), saves are
    dropped, loads report their blocks; no master at start: an error."""
    from kvferry.procs import Master, Node

    tokens = list(range(3 * BS + 1))
    with Master() as m, Node(m.address, pool="16M"):
        w = world(ns(), "kv_both", m.address)
        s, wk = w.make(w.scheduler), w.make(w.worker)
        wk.register_kv_caches(w.caches(6))
        step(w, s, wk, w.sched_out(new=[(w.request("a", tokens), [0, 1, 2, 3], 0, len(tokens))]))
        assert wk.flush()
        r = w.request("b", tokens)
        assert s.get_num_new_matched_tokens(r, 0) == (3 * BS, False)
        s.update_state_after_alloc(r, w.blocks([4, 5, 6, 7]), 3 * BS)
        m.kill()
    try:
        assert s.get_num_new_matched_tokens(w.request("c", tokens), 0) == (0, False)
        step(w, s, wk, w.sched_out(new=[(r, [4, 5, 6, 7], 3 * BS, 1),
                                       (w.request("d", tokens[::-1]), [8, 9, 10, 11], 0, len(tokens))]))
        assert wk.get_block_ids_with_load_errors() == {4, 5, 6}
    finally:
        s.shutdown()
        wk.shutdown()
    with pytest.raises(kvferry.KvferryError):
        w.make(w.scheduler)


def test_no_leak(world):
    """Connectors that saved and loaded, shut down: the library's
    allocations and the process's descriptors are back where they were."""
    import gc

    from conftest import open_fds

    w = world(ns(), "kv_both")
    caches = w.caches(7)
    gc.collect()
    base, fds = kvferry.alloc_stats(), open_fds()
    s, wk = w.make(w.scheduler), w.make(w.worker)
    wk.register_kv_caches(caches)
    tokens = list(range(2 * BS + 1))
    step(w, s, wk, w.sched_out(new=[(w.request("a", tokens), [0, 1, 2], 0, len(tokens))]))
    assert wk.flush()
    r = w.request("b", tokens)
    n, _ = s.get_num_new_matched_tokens(r, 0)
    s.update_state_after_alloc(r, w.blocks([3, 4, 5]), n)
    step(w, s, wk, w.sched_out(new=[(r, [3, 4, 5], n, 1)]))
    assert wk.stats["loaded_tokens"] == 2 * BS
    s.shutdown()
    wk.shutdown()
    del s, wk
    gc.collect()
    assert kvferry.alloc_stats() == base
    assert open_fds() == fds


def test_recompute_hazard_named_and_logged(master, caplog):
    """vLLM's recompute after a failed load is wrong on its V2 GPU model
    runner and with async scheduling (measured on an H200, vLLM 0.26.0):
    the connector names the hazard and logs it when it is built so."""
    def cfg(policy, v2, async_sched):
        return types.SimpleNamespace(
            kv_transfer_config=types.SimpleNamespace(kv_load_failure_policy=policy),
            use_v2_model_runner=v2,
            scheduler_config=types.SimpleNamespace(async_scheduling=async_sched))

    assert vc.recompute_hazard(cfg("fail", True, True)) is None
    assert vc.recompute_hazard(cfg("recompute", False, False)) is None
    only_v2 = vc.recompute_hazard(cfg("recompute", True, False))
    assert "V2 model runner" in only_v2 and "async" not in only_v2
    only_async = vc.recompute_hazard(cfg("recompute", False, True))
    assert "async scheduling" in only_async and "V2" not in only_async
    assert vc.recompute_hazard(types.SimpleNamespace()) is None

    w = plain_world(master, ns(), "kv_both")
    conn = w.make(w.scheduler)
    conn.shutdown()
    assert "recompute" not in caplog.text
    conn._vllm_config.kv_transfer_config.kv_load_failure_policy = "recompute"
    conn._vllm_config.scheduler_config = types.SimpleNamespace(async_scheduling=True)
    with caplog.at_level("WARNING", logger="kvferry.vllm_connector"):
        w.make(w.scheduler).shutdown()
    assert "kv_load_failure_policy 'recompute' with async scheduling" in caplog.text


def test_tensor_parallel_ranks(master):
    """Tensor parallel: each rank's worker saves its own heads under its
    own keys; the scheduler finds a hit only when every rank's objects are
    there, and a server of another parallel size never finds them."""
    name = ns()
    spec = types.SimpleNamespace(block_size=BS, num_kv_heads=HEADS, head_size=HD, dtype="float16")
    names = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
    kvcc = types.SimpleNamespace(num_blocks=NBLK, kv_cache_groups=[
        types.SimpleNamespace(kv_cache_spec=spec, layer_names=names)])

    def conn(role, tp, rank):
        tcfg = types.SimpleNamespace(kv_role="kv_both", kv_connector_extra_config=extra(master, name))
        par = types.SimpleNamespace(tensor_parallel_size=tp, rank=rank, pipeline_parallel_size=1)
        vcfg = types.SimpleNamespace(kv_transfer_config=tcfg, model_config=None,
                                     parallel_config=par, cache_config=None)
        return vc.KvferryConnector(vcfg, role, kvcc)

    def caches(seed):
        rng = np.random.default_rng(seed)
        return {n: rng.integers(0, 1 << 16, (2, NBLK, BS, HEADS, HD), dtype=np.uint16)
                .view(np.float16) for n in names}

    tokens = list(range(700, 700 + 4 * BS + 1))
    req = types.SimpleNamespace(request_id="r", prompt_token_ids=tokens)
    sched, sched1 = conn(0, 2, 0), conn(0, 1, 0)
    w0, w1 = conn(1, 2, 0), conn(1, 2, 1)
    kv0, kv1 = caches(1), caches(2)
    w0.register_kv_caches(kv0)
    w1.register_kv_caches(kv1)
    ids = [0, 1, 2, 3, 4]
    out = types.SimpleNamespace(
        scheduled_new_reqs=[types.SimpleNamespace(req_id="r", prompt_token_ids=tokens,
                                                  block_ids=(ids,), num_computed_tokens=0)],
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[], resumed_req_ids=set(),
                                                    new_block_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={"r": len(tokens)}, finished_req_ids=set())
    try:
        meta = sched.build_connector_meta(out)
        for w in (w0,):  # rank 0 alone: no hit yet
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            w.wait_for_save()
            w.flush()
        assert sched.get_num_new_matched_tokens(types.SimpleNamespace(
            request_id="a", prompt_token_ids=tokens), 0) == (0, False)
        w1.bind_connector_metadata(meta)
        w1.start_load_kv(None)
        w1.wait_for_save()
        w1.flush()
        assert sched.get_num_new_matched_tokens(req, 0) == (4 * BS, False)
        assert sched1.get_num_new_matched_tokens(types.SimpleNamespace(
            request_id="b", prompt_token_ids=tokens), 0) == (0, False)
        # each rank loads its own heads into other blocks
        sched.update_state_after_alloc(req, Blocks([10, 11, 12, 13, 14]), 4 * BS)
        lmeta = vc.KvferryConnectorMetadata(loads=list(sched._loads.values()))
        for w in (w0, w1):
            w.bind_connector_metadata(lmeta)
            w.start_load_kv(None)
            w.wait_for_save()
            assert w.get_block_ids_with_load_errors() == set()
        for kv in (kv0, kv1):
            for n in names:
                assert np.array_equal(kv[n][:, [0, 1, 2, 3]].view(np.uint16),
                                      kv[n][:, [10, 11, 12, 13]].view(np.uint16))
    finally:
        for c in (sched, sched1, w0, w1):
            c.shutdown()


def test_async_loads(world):
    """load_mode "async": the lookup answers an asynchronous load, the
    worker loads between steps and get_finished names the request once
    its blocks are in the cache (byte for byte); a damaged chunk's
    blocks are reported by then."""
    name = ns()
    LOAD_MODE[0] = "async"
    try:
        w = world(name, "kv_both")
        s, wk = w.make(w.scheduler), w.make(w.worker)
    finally:
        LOAD_MODE[0] = "layerwise"
    try:
        kv = w.caches(8)
        wk.register_kv_caches(kv)
        tokens = list(range(900, 900 + 4 * BS + 1))
        step(w, s, wk, w.sched_out(new=[(w.request("a", tokens), [0, 1, 2, 3, 4], 0, len(tokens))]))
        assert wk.flush()
        r = w.request("b", tokens)
        assert s.may_load_async(r)
        assert s.get_num_new_matched_tokens(r, 0) == (4 * BS, True)
        s.update_state_after_alloc(r, w.blocks([10, 11, 12, 13, 14]), 4 * BS)
        # the step that starts the load computes nothing of the request
        meta = s.build_connector_meta(w.sched_out())
        assert [ld.is_async for ld in meta.loads] == [True]
        wk.bind_connector_metadata(meta)
        wk.start_load_kv(None)
        wk.wait_for_save()
        done = set()
        for _ in range(200):
            _, recved = wk.get_finished(set())
            done |= recved or set()
            if "b" in done:
                break
            time.sleep(0.01)
        assert done == {"b"}
        assert wk.get_block_ids_with_load_errors() == set()
        assert blocks_equal(w, kv, kv, [0, 1, 2, 3], [10, 11, 12, 13])
        s.update_state_after_alloc(r, w.blocks([]), 0)  # vLLM's second call
    finally:
        s.shutdown()
        wk.shutdown()
