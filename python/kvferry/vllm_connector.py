"""vLLM KV connector: a request's paged KV blocks saved to and loaded from
the kvferry store, straight from and into vLLM's KV cache tensors.

vLLM loads it from ``--kv-transfer-config``::

    {"kv_connector": "KvferryConnector",
     "kv_connector_module_path": "kvferry.vllm_connector",
     "kv_role": "kv_both",
     "kv_connector_extra_config": {"master": "127.0.0.1:7700"}}

(``kv_load_failure_policy`` is vLLM's: its default, ``fail``, ends a
request whose blocks did not load with an error; ``recompute`` computes
them again, which vLLM does correctly only on its V1 model runner with
async scheduling off: see :func:`recompute_hazard`.)

``KVConnectorFactory`` imports ``kv_connector_module_path`` and takes the
class named by ``kv_connector``; it builds one instance in the scheduler
process (role SCHEDULER) and one in each worker (role WORKER).

- Scheduler: :meth:`get_num_new_matched_tokens` asks the store how many
  leading full blocks of the prompt it holds (one ``exists`` batch of the
  chunks' manifests; the last prompt token is always computed by vLLM);
  :meth:`update_state_after_alloc` records the blocks vLLM allocated for
  them; :meth:`build_connector_meta` hands the worker this step's loads
  and the full prompt blocks computed by the end of this step (saves).
- Worker: :meth:`register_kv_caches` registers the KV cache (CPU or
  CUDA) with the store's engine: each layer's tensor where a layer is
  one dense run (layer-compact layouts, ``[2, num_blocks, ...]``), else
  the whole run of blocks where each block holds every layer's page
  (block-outermost layouts); :meth:`start_load_kv` loads the
  step's blocks (every layer, one batched, verified get per request);
  :meth:`wait_for_save` saves the step's blocks once the forward pass
  has written every layer. A block that fails to load (missing, wrong
  checksum, dead store) is reported by
  :meth:`get_block_ids_with_load_errors`, so vLLM recomputes it; when
  vLLM schedules the request again from that block, the scheduler side
  saves the recomputed blocks again.

Keys are :mod:`kvferry.kv`'s: a chained hash of the prompt's token
chunks (vLLM's block size) under a fingerprint of everything that decides
a block's bytes (model, dtype, layers, block geometry, KV layout,
tensor-parallel rank). Prefill-decode hand-off: a ``kv_producer``
instance saves each prompt's blocks while it prefills; a ``kv_consumer``
instance given the same prompt finds and loads them (``kv_both`` does
both, a shared prefix cache).

Against vLLM's real base class when ``vllm`` is importable; otherwise a
stand-in base with the same constructor and methods lets the module
import and be tested without vLLM.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .errors import KvferryError
from .kv import LAYOUT_VERSION, KVCache, KVLayout, chunk_keys
from .store import BATCH_MAX, Store

try:  # the real interface, when vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorMetadata."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorBase_V1 (same constructor)."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


log = logging.getLogger("kvferry.vllm_connector")


@dataclass
class LoadSpec:
    """Blocks a worker loads for one request: chunks [start, end) of
    ``tokens`` into ``block_ids[start:end]``."""

    req_id: str
    tokens: List[int]
    block_ids: List[int]
    start: int
    end: int


@dataclass
class SaveSpec:
    """Blocks a worker saves for one request: the full chunks of
    ``tokens``, chunk i from ``block_ids[i]`` (chunks already stored are
    skipped)."""

    req_id: str
    tokens: List[int]
    block_ids: List[int]


@dataclass
class KvferryConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers for one step."""

    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)


@dataclass
class _Tracked:
    """A running request as the scheduler side follows it for saving."""

    tokens: List[int]
    block_ids: List[int]
    saved_chunks: int = 0


def _get(obj: Any, path: str) -> Any:
    for attr in path.split("."):
        obj = getattr(obj, attr, None)
    return obj


def _extra(cfg: Any) -> Dict[str, Any]:
    return dict(getattr(cfg, "kv_connector_extra_config", None) or {})


def _group(kv_cache_config: Any) -> Tuple[Any, List[str]]:
    """(spec, layer names) of the single KV cache group."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) != 1:
        raise ValueError("kvferry connector: one KV cache group is supported, the model has %d "
                         "(hybrid models need vLLM's hybrid allocator support)" % len(groups))
    return groups[0].kv_cache_spec, list(groups[0].layer_names)


def identity(vllm_config: Any, kv_cache_config: Any, tp_rank: int) -> str:
    """32 hex digits over everything that decides a block's bytes, the
    same in the scheduler and in each worker: model, dtype, KV cache spec
    (kind, block size, heads, head size), the layers, vLLM's KV cache
    layout name (which orders the bytes inside a page), tensor-parallel
    rank and size, the key format version."""
    spec, layers = _group(kv_cache_config)
    extra = _extra(getattr(vllm_config, "kv_transfer_config", None))
    model = _get(vllm_config, "model_config.model") or extra.get("model", "")
    kv_layout = (getattr(kv_cache_config, "kv_cache_layout", None)
                 or _get(vllm_config, "cache_config.kv_cache_layout") or "default")
    desc = {
        "v": LAYOUT_VERSION, "model": str(model), "spec": type(spec).__name__,
        "dtype": str(getattr(spec, "dtype", "")).replace("torch.", ""),
        "block_size": int(spec.block_size), "heads": int(getattr(spec, "num_kv_heads", 1)),
        "head_size": int(getattr(spec, "head_size", 0)), "layers": layers,
        "kv_layout": kv_layout, "tp_rank": int(tp_rank),
        "tp_size": int(_get(vllm_config, "parallel_config.tensor_parallel_size") or 1),
        "cache_dtype": str(_get(vllm_config, "cache_config.cache_dtype") or ""),
    }
    blob = json.dumps(desc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


@dataclass(frozen=True)
class _ConnectorLayout(KVLayout):
    """A KVLayout whose fingerprint is the connector's :func:`identity`
    (which the scheduler computes without the tensors); the byte map
    (kind, geometry) is the tensors'. A byte map that differs under one
    identity differs in piece count or checksums: a verified miss."""

    ident: str = ""

    def fingerprint(self) -> str:
        return self.ident


def recompute_hazard(vllm_config: Any) -> Optional[str]:
    """Why vLLM's ``recompute`` load-failure policy is unsafe in this
    configuration, or None. Measured on an H200 with vLLM 0.26.0 (and the
    code is the same in 0.33.0): after a failed load its V2 GPU model
    runner recomputes from a stale token count and makes wrong tokens
    (vLLM issue 49250), and async scheduling with a synchronous load
    crashes the V1 runner (vLLM issue 34484). The V1 runner with async
    scheduling off recomputed correctly there, as vLLM's CPU build does."""
    cfg = getattr(vllm_config, "kv_transfer_config", None)
    if str(getattr(cfg, "kv_load_failure_policy", "fail")) != "recompute":
        return None
    why = []
    try:
        if getattr(vllm_config, "use_v2_model_runner", False) is True:
            why.append("vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=0 selects V1)")
    except Exception:  # the property reads the model config; absent in tests
        pass
    if _get(vllm_config, "scheduler_config.async_scheduling") is True:
        why.append("async scheduling (async_scheduling=False turns it off)")
    if not why:
        return None
    return ("kvferry connector: kv_load_failure_policy 'recompute' with %s: vLLM recomputes "
            "a block that failed to load wrongly there; use 'fail' (vLLM's default) or "
            "change that" % " and ".join(why))


def _tp_rank(vllm_config: Any) -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return int(_get(vllm_config, "parallel_config.rank") or 0)


def _physical(t: Any) -> Any:
    """The tensor with its dimensions in memory order (vLLM may permute
    the logical shape, e.g. an HND layout): contiguous, same memory.
    Arrays without torch's methods (numpy) must be C-contiguous."""
    if not hasattr(t, "is_contiguous") or t.is_contiguous():
        return t
    order = sorted(range(t.dim()), key=lambda i: -t.stride(i))
    p = t.permute(*order)
    if not p.is_contiguous():
        raise ValueError("kvferry connector: a KV cache tensor with gaps (strides %s)"
                         % (tuple(t.stride()),))
    return p


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def layout_of(tensors: Sequence[Any], block_size: int, num_blocks: int, dtype: str,
              ident: str) -> KVLayout:
    """The byte map of per-layer KV tensors, each dense in memory order:
    K/V outermost ``[2, num_blocks, ...]`` (a block is a K and a V piece
    per layer) or blocks outermost (vLLM's ``[B, H, N, C]`` pages, MLA's
    latents: one piece per block and layer)."""
    shape = tuple(tensors[0].shape)
    for t in tensors:
        if tuple(t.shape) != shape:
            raise ValueError("kvferry connector: layers of different shapes (%s, %s)"
                             % (shape, tuple(t.shape)))
    total = _numel(shape)
    if len(shape) >= 3 and shape[0] == 2 and shape[1] == num_blocks:
        kind, elems = "vllm", total // (2 * num_blocks)
    elif shape and shape[0] % num_blocks == 0:
        kind, elems = "mla", total // num_blocks
    else:
        raise ValueError("kvferry connector: KV cache shape %s has no outer block dimension of %d"
                         % (shape, num_blocks))
    if elems % block_size:
        raise ValueError("kvferry connector: a block of %d elements is not %d tokens"
                         % (elems, block_size))
    return _ConnectorLayout(kind, "vllm", dtype, len(tensors), num_blocks, block_size, 1,
                            elems // block_size, ident=ident)


def packed_layout_of(tensors: Sequence[Any], block_size: int, num_blocks: int, dtype: str,
                     ident: str) -> Tuple[KVLayout, Any]:
    """Block-outermost caches (vLLM's BLHNC/BLNHC layouts): each layer's
    view is strided, but block b holds every layer's page side by side,
    one dense run. Returns the layout (one piece per block: the run) and
    a flat tensor over the whole run of blocks, to register."""
    t0 = tensors[0]
    nl = len(tensors)
    page = _numel(t0.shape) // num_blocks
    esz = t0.element_size()
    sub = t0.shape[0] // num_blocks
    for l, t in enumerate(tensors):
        if t.data_ptr() != t0.data_ptr() + l * page * esz or t.stride(0) * sub != nl * page:
            raise ValueError("kvferry connector: a KV cache layout that is neither layer- nor "
                             "block-compact (strides %s)" % (tuple(t.stride()),))
        if sub == 1:
            _physical(t[0])  # a page must be one dense run
    if page % (2 * block_size):
        raise ValueError("kvferry connector: a page of %d elements is not 2 x %d tokens"
                         % (page, block_size))
    flat = t0.as_strided((num_blocks * nl * page,), (1,))
    lay = _ConnectorLayout("lmcache", "vllm", dtype, nl, num_blocks, block_size, 1,
                           page // (2 * block_size), ident=ident)
    return lay, flat


class KvferryConnector(KVConnectorBase_V1):
    """vLLM ``KVConnectorBase_V1`` over a kvferry store.

    ``kv_connector_extra_config`` keys: ``master`` (the store's master,
    default the ``master`` config key), ``namespace`` (key prefix, default
    "vllm"; instances share blocks when it and the identity agree),
    ``timeout_ms``, ``replicas``, ``model`` (the model's name where
    vLLM's model config has none).
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        extra = _extra(cfg)
        kv_role = str(getattr(cfg, "kv_role", "kv_both"))
        self.saves = kv_role in ("kv_producer", "kv_both")
        self.loads = kv_role in ("kv_consumer", "kv_both")
        self.namespace = str(extra.get("namespace", "vllm"))
        self.replicas = int(extra.get("replicas", 0))
        self._kv_cache_cfg = kv_cache_config
        spec, _ = _group(kv_cache_config)
        self.block_size = int(spec.block_size)
        hazard = recompute_hazard(vllm_config)
        if hazard:
            log.warning("%s", hazard)
        self._lock = threading.Lock()
        self.store: Optional[Store] = Store.connect(extra.get("master"), extra.get("timeout_ms"))
        # scheduler side
        self._ident0 = identity(vllm_config, kv_cache_config, 0)
        self._matched: Dict[str, Tuple[int, int]] = {}  # req -> (local computed, stored hit)
        self._loads: Dict[str, LoadSpec] = {}
        self._tracked: Dict[str, _Tracked] = {}
        # worker side
        self.cache: Optional[KVCache] = None
        self._gpu = False
        self._failed: Set[int] = set()
        self._step_failed: Set[int] = set()
        self.stats = {"lookups": 0, "hit_tokens": 0, "loaded_tokens": 0, "load_failures": 0,
                      "saved_chunks": 0}

    # ==================================================================
    # scheduler side
    # ==================================================================

    def _manifest_keys(self, tokens: Sequence[int]) -> List[str]:
        # KVCache's own key format, computed without a cache's buffers
        probe = KVCache.__new__(KVCache)
        probe.namespace, probe.fingerprint = self.namespace, self._ident0
        return [probe.manifest_key(ck) for ck in chunk_keys(tokens, self.block_size, self._ident0)]

    def lookup(self, tokens: Sequence[int]) -> int:
        """Leading tokens of ``tokens`` whose full blocks the store holds."""
        keys = self._manifest_keys(tokens)
        hit = 0
        for a in range(0, len(keys), BATCH_MAX):
            for found in self.store.exists_batch(keys[a:a + BATCH_MAX]):
                if not found:
                    return hit * self.block_size
                hit += 1
        return hit * self.block_size

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> Tuple[Optional[int], bool]:
        """Tokens beyond num_computed_tokens that the store holds (whole
        blocks; never the prompt's last token, which vLLM computes)."""
        prompt = getattr(request, "prompt_token_ids", None)
        if not self.loads or not prompt or self.store is None:
            return 0, False
        limit = (len(prompt) - 1) // self.block_size * self.block_size
        if limit <= num_computed_tokens:
            return 0, False
        try:
            hit = self.lookup(list(prompt[:limit]))
        except KvferryError as e:  # a dead store is a miss: vLLM computes
            log.warning("kvferry connector: lookup failed: %s", e)
            hit = 0
        with self._lock:
            self.stats["lookups"] += 1
            self._matched[request.request_id] = (num_computed_tokens, hit)
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Records the blocks vLLM allocated for the tokens to load."""
        rid = request.request_id
        matched = self._matched.pop(rid, None)
        if num_external_tokens <= 0 or matched is None:
            return
        local = matched[0]
        ids = list(blocks.get_block_ids()[0])
        start = local // self.block_size
        end = (local + num_external_tokens) // self.block_size
        tokens = list(request.prompt_token_ids[:end * self.block_size])
        self._loads[rid] = LoadSpec(rid, tokens, ids[:end], start, end)
        with self._lock:
            self.stats["hit_tokens"] += num_external_tokens

    def _note_progress(self, meta: KvferryConnectorMetadata, rid: str, computed: int) -> None:
        tr = self._tracked.get(rid)
        if tr is None:
            return
        full = min(computed, len(tr.tokens), len(tr.block_ids) * self.block_size) // self.block_size
        if full > tr.saved_chunks:
            meta.saves.append(SaveSpec(rid, tr.tokens[:full * self.block_size], tr.block_ids[:full]))
            tr.saved_chunks = full

    def build_connector_meta(self, scheduler_output: Any) -> KvferryConnectorMetadata:
        """This step's loads, and the prompt blocks complete after it."""
        meta = KvferryConnectorMetadata(loads=list(self._loads.values()))
        self._loads = {}
        for rid in getattr(scheduler_output, "finished_req_ids", None) or ():
            self._tracked.pop(rid, None)
        if not self.saves:
            return meta
        sched = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            if not new.prompt_token_ids:
                continue
            self._tracked[new.req_id] = _Tracked(list(new.prompt_token_ids), list(new.block_ids[0]))
            self._note_progress(meta, new.req_id, new.num_computed_tokens + sched.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for i, rid in enumerate(cached.req_ids):
            tr = self._tracked.get(rid)
            if tr is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in resumed:
                tr.block_ids, tr.saved_chunks = list(new_ids[0]) if new_ids else [], 0
            elif new_ids:
                tr.block_ids += list(new_ids[0])
            done = cached.num_computed_tokens[i]
            if done < tr.saved_chunks * self.block_size:
                # vLLM computes blocks again (a load of them failed, under
                # kv_load_failure_policy "recompute"): save them again
                tr.saved_chunks = done // self.block_size
            self._note_progress(meta, rid, done + sched.get(rid, 0))
        return meta

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Frees the request's state. Saves ran in the steps that computed
        the blocks (the worker waits for them), so the blocks are free at
        once; a producer returns how many prompt tokens it stored."""
        tr = self._tracked.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        if not self.saves or tr is None:
            return False, None
        return False, {"kvferry": {"namespace": self.namespace,
                                   "stored_tokens": tr.saved_chunks * self.block_size}}

    # ==================================================================
    # worker side
    # ==================================================================

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Registers every layer's KV tensor with the store's engine."""
        _, names = _group(self._kv_cache_cfg)
        order = names if set(names) == set(kv_caches) else list(kv_caches)
        views = [kv_caches[n] for n in order]
        num_blocks = int(getattr(self._kv_cache_cfg, "num_blocks", 0) or 0)
        if not num_blocks:
            num_blocks = views[0].shape[1] if views[0].shape[0] == 2 else views[0].shape[0]
        dtype = str(views[0].dtype).replace("torch.", "")
        ident = identity(self._vllm_config, self._kv_cache_cfg, _tp_rank(self._vllm_config))
        try:
            tensors = [_physical(t) for t in views]
            layout = layout_of(tensors, self.block_size, num_blocks, dtype, ident)
        except ValueError:
            if not hasattr(views[0], "as_strided"):
                raise
            layout, flat = packed_layout_of(views, self.block_size, num_blocks, dtype, ident)
            tensors = [flat]
        if self.cache is not None:
            self.cache.close()
        self.cache = KVCache(self.store, layout, tensors, namespace=self.namespace,
                             replicas=self.replicas)
        self._gpu = any(r.is_gpu for r in self.cache.regions)

    def _sync_device(self) -> None:
        if self._gpu:
            import torch

            torch.cuda.current_stream().synchronize()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Loads this step's blocks, every layer, before the forward pass."""
        self._step_failed = set()
        if self.cache is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not getattr(meta, "loads", None):
            return
        self._sync_device()
        for ld in meta.loads:
            got = self.cache.load(ld.tokens, ld.block_ids, start=ld.start)
            done = ld.start + got // self.block_size
            with self._lock:
                self.stats["loaded_tokens"] += got
            if done < ld.end:
                self._load_failed(ld, done)

    def _load_failed(self, ld: LoadSpec, done: int) -> None:
        """Blocks [done, end) of a load did not load: vLLM recomputes them,
        this step saves none of them (they hold no verified bytes), and
        the chunks are removed from the store (a corrupt or incomplete
        chunk would otherwise be a hit that fails again) so that a later
        save writes them anew."""
        bad = ld.block_ids[done:ld.end]
        with self._lock:
            self.stats["load_failures"] += 1
            self._failed.update(bad)
        self._step_failed.update(bad)
        cache = self.cache
        keys = cache.chunk_keys(ld.tokens)[done:ld.end]
        doomed = [k for ck in keys for k in [cache.manifest_key(ck)] + cache.piece_keys(ck)]
        try:
            for a in range(0, len(doomed), BATCH_MAX):
                self.store.remove_batch(doomed[a:a + BATCH_MAX], check=False)
        except KvferryError as e:  # a dead store: nothing to clean
            log.warning("kvferry connector: removing failed chunks: %s", e)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: start_load_kv loaded every layer."""
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Nothing per layer: wait_for_save saves every layer of the
        step's blocks in one batch once the forward pass wrote them."""
        return None

    def wait_for_save(self) -> None:
        """Saves the step's complete prompt blocks (every layer)."""
        if self.cache is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not getattr(meta, "saves", None):
            return
        self._sync_device()
        failed = self._step_failed
        for sv in meta.saves:
            ids = sv.block_ids
            for i, b in enumerate(ids):
                if b in failed:  # a block whose load failed this step
                    ids = ids[:i]
                    break
            try:
                n = self.cache.save(sv.tokens[:len(ids) * self.block_size], ids)
            except KvferryError as e:  # a lost save is a later miss
                log.warning("kvferry connector: save failed: %s", e)
                continue
            with self._lock:
                self.stats["saved_chunks"] += n

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """Loads and saves end within their step: nothing asynchronous."""
        return None, None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        """Blocks whose load failed since the last call (vLLM recomputes them)."""
        with self._lock:
            out, self._failed = self._failed, set()
        return out

    def shutdown(self) -> None:
        """Deregisters the KV tensors and closes the store."""
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        if self.store is not None:
            self.store.close()
            self.store = None


__all__ = ["KvferryConnector", "KvferryConnectorMetadata", "LoadSpec", "SaveSpec", "identity",
           "layout_of", "HAVE_VLLM"]
