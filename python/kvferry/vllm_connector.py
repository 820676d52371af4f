"""vLLM KV connector: a request's paged KV saved to and loaded from the
kvferry store as chunk objects (:mod:`kvferry.kv_chunks`), straight from
and into vLLM's KV cache tensors, layer group by layer group.

vLLM loads it from ``--kv-transfer-config``::

    {"kv_connector": "KvferryConnector",
     "kv_connector_module_path": "kvferry.vllm_connector",
     "kv_role": "kv_both",
     "kv_connector_extra_config": {"master": "127.0.0.1:7700"}}

``KVConnectorFactory`` imports ``kv_connector_module_path`` and takes the
class named by ``kv_connector``; it builds one instance in the scheduler
process (role SCHEDULER) and one in each worker (role WORKER).

Scheduler side: :meth:`get_num_new_matched_tokens` asks the store how many
leading tokens of the prompt it holds (one ``exists`` batch of the chunk
objects' keys: one master round trip; the prompt's last token is always
computed by vLLM); :meth:`update_state_after_alloc` records the blocks
vLLM allocated for them; :meth:`build_connector_meta` hands the worker
this step's loads and the chunks of the prompts that are complete after
this step (saves).

Worker side, one step:

- :meth:`start_load_kv` hands the step's loads to the connector's mover
  thread, which views the chunk objects in the store node's pool and
  scatters them into vLLM's blocks one layer group at a time (one copy
  kernel per group, every piece checked against its checksum);
  :meth:`wait_for_layer_load` waits only for the group of the layer about
  to run, so group g+1 moves while group g computes.
- :meth:`save_kv_layer` notes, at the last layer of each group, where
  vLLM's stream stands (a CUDA event); the mover then gathers that
  group's blocks of the step's complete chunks straight into the node's
  pool (put views) while the next layers compute. :meth:`wait_for_save` only releases the groups the forward did
  not reach: the step's output leaves while the last gathers run, and the
  next step's :meth:`start_load_kv` (where every forward pass, the only
  writer of vLLM's blocks, begins) waits for them. The commits (the
  store's checksum of each object, then making it visible) run on a
  committer thread.

A block that fails to load (missing, damaged, a dead store) is reported
by :meth:`get_block_ids_with_load_errors`, so vLLM recomputes it (policy
``recompute``) or fails the request (``fail``, vLLM's default); the
damaged chunks are removed from the store so that a later save writes
them anew.

``kv_connector_extra_config`` keys: ``master`` (``"embedded"``: a master
and a node of ``embedded_pool`` bytes, default "8G", inside the vLLM
process, :mod:`kvferry.embedded`), ``namespace`` (key
prefix: a tenant; default "vllm"), ``timeout_ms``, ``replicas``,
``model`` and ``revision`` (the model's name and weights revision where
vLLM's model config has none), ``chunk_tokens`` (default 256),
``layer_groups`` (default 4), ``views`` (default true: store views and
put views where the node is on this host), ``sum_mode`` (the GPU copies'
checksum mode), ``stage_bytes``, ``gpu_stage_bytes`` (GPU memory whole
objects are copied through by the copy engines; 0: the kernels reach
the node's pool directly), ``stage_pipeline`` (default true: that
stage in halves, the copy engines moving one while the kernels work on
the other; false: one after the other), ``stage_slice_bytes`` (the
most one DMA of that pipeline moves, default 64 MiB), ``overlap`` (loads and saves on the
mover thread, overlapped with the forward pass: default on for GPU
caches).

Against vLLM's real base class when ``vllm`` is importable; otherwise a
stand-in base with the same constructor and methods lets the module
import and be tested without vLLM.
"""

from __future__ import annotations

import atexit
import enum
import hashlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .errors import KvferryError
from .kv import LAYOUT_VERSION
from .kv_chunks import (CHUNK_TOKENS, LAYER_GROUPS, PIPE_SLICE, Chunk, ChunkIndex, ChunkStore,
                        LoadReq, SaveReq, effective_groups)
from .store import Store

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

try:  # vLLM 0.34: how a connector reaches the KV cache
    from vllm.config.kv_transfer import KVCacheAccess
except Exception:  # pragma: no cover - older vLLM
    KVCacheAccess = None


log = logging.getLogger("kvferry.vllm_connector")

#: Longest a worker waits for one step's load or save work (seconds).
STEP_WAIT_S = 120.0


@dataclass
class LoadSpec:
    """Tokens [start, end) of a request to load into its blocks: the
    chunks the lookup found (keyed for rank 0; each worker keys them for
    its own rank from tokens)."""

    req_id: str
    chunks: List[Chunk]
    block_ids: List[int]
    start: int
    end: int
    tokens: List[int] = field(default_factory=list)
    #: loaded between steps: reported by get_finished when done
    is_async: bool = False


@dataclass
class SaveSpec:
    """Chunks of a request to save, from its blocks (keyed as LoadSpec's)."""

    req_id: str
    chunks: List[Chunk]
    block_ids: List[int]
    tokens: List[int] = field(default_factory=list)


@dataclass
class KvferryConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers for one step."""

    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
    #: finished requests whose blocks vLLM holds for the workers' saves:
    #: each worker names them in get_finished once its gathers are done
    release: List[str] = field(default_factory=list)
    #: blocks a save may still read were freed for reuse this step (a
    #: preempted request's): the step waits for every gather first
    wait_saves: bool = True


@dataclass
class _Tracked:
    """A running request as the scheduler side follows it for saving:
    its prompt, its blocks, and how many tokens are saved or stored."""

    tokens: List[int]
    block_ids: List[int]
    saved: int = 0


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
    same in the scheduler and in each worker: model and weights revision,
    dtype and KV cache dtype (quantisation), KV cache spec (kind, block
    size, heads, head size), the layers, vLLM's KV cache layout name
    (which orders the bytes inside a page), tensor- and pipeline-parallel
    rank and size, the key format version."""
    spec, layers = _group(kv_cache_config)
    extra = _extra(getattr(vllm_config, "kv_transfer_config", None))
    model = _get(vllm_config, "model_config.model") or extra.get("model", "")
    revision = _get(vllm_config, "model_config.revision") or extra.get("revision", "")
    kv_layout = (getattr(kv_cache_config, "kv_cache_layout", None)
                 or _get(vllm_config, "cache_config.kv_cache_layout") or "default")
    desc = {
        "v": LAYOUT_VERSION, "model": str(model), "revision": str(revision),
        "spec": type(spec).__name__,
        "dtype": str(getattr(spec, "dtype", "")).replace("torch.", ""),
        "block_size": int(spec.block_size), "heads": int(getattr(spec, "num_kv_heads", 1)),
        "head_size": int(getattr(spec, "head_size", 0)), "layers": layers,
        "kv_layout": kv_layout, "tp_rank": int(tp_rank),
        "tp_size": int(_get(vllm_config, "parallel_config.tensor_parallel_size") or 1),
        "pp_rank": int(_get(vllm_config, "parallel_config.rank") or 0)
        // int(_get(vllm_config, "parallel_config.tensor_parallel_size") or 1),
        "pp_size": int(_get(vllm_config, "parallel_config.pipeline_parallel_size") or 1),
        "cache_dtype": str(_get(vllm_config, "cache_config.cache_dtype") or ""),
    }
    blob = json.dumps(desc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


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


def _num_blocks(kv_cache_config: Any, t: Any) -> int:
    n = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
    if n:
        return n
    return int(t.shape[1] if t.shape[0] == 2 else t.shape[0])


# counters shared by the scheduler and worker instances of one vLLM engine
# in one process (vLLM builds one of each)
_STATS_LOCK = threading.Lock()
_STATS: Dict[str, Dict[str, int]] = {}


def _engine_stats(cfg: Any) -> Dict[str, int]:
    """The counters of the engine cfg (vLLM's kv_transfer_config) belongs
    to: by its engine_id, else kept on the config object itself."""
    engine_id = getattr(cfg, "engine_id", None)
    if engine_id:
        return _shared_stats(str(engine_id))
    stats = getattr(cfg, "_kvferry_stats", None)
    if stats is None:
        stats = _new_stats()
        try:
            setattr(cfg, "_kvferry_stats", stats)
        except Exception:  # a frozen config: this instance's own
            pass
    return stats


def _new_stats() -> Dict[str, int]:
    # wait_load_us / wait_save_us: how long vLLM's thread waited for a
    # layer group's load / for the last step's gathers
    return {"lookups": 0, "hit_tokens": 0, "loaded_tokens": 0, "load_failures": 0,
            "saved_chunks": 0, "saved_objects": 0, "wait_load_us": 0, "wait_save_us": 0}


def _shared_stats(engine_id: str) -> Dict[str, int]:
    with _STATS_LOCK:
        return _STATS.setdefault(engine_id, _new_stats())


class _Step:
    """One forward step's work on the worker side."""

    def __init__(self, groups: int):
        self.load_done = [threading.Event() for _ in range(groups)]
        self.load_finished = threading.Event()
        self.loads: List[Tuple[LoadSpec, LoadReq]] = []
        self.save_ready = [threading.Event() for _ in range(groups)]
        self.save_events: List[Any] = [None] * groups
        self.save_gathered = threading.Event()
        self.saves: List[SaveSpec] = []
        self.finished = False


class KvferryConnector(KVConnectorBase_V1):
    """vLLM ``KVConnectorBase_V1`` over a kvferry store (see the module's
    documentation for the configuration keys)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        extra = _extra(cfg)
        kv_role = str(getattr(cfg, "kv_role", "kv_both"))
        self.saves = kv_role in ("kv_producer", "kv_both")
        self.loads = kv_role in ("kv_consumer", "kv_both")
        self.namespace = str(extra.get("namespace", "vllm"))
        self.replicas = int(extra.get("replicas", 0))
        self.chunk_tokens = int(extra.get("chunk_tokens", CHUNK_TOKENS))
        self.layer_groups = int(extra.get("layer_groups", LAYER_GROUPS))
        self.use_views = bool(extra.get("views", True))
        self.sum_mode = extra.get("sum_mode")
        self.stage_bytes = int(extra.get("stage_bytes", 256 << 20))
        self.gpu_stage_bytes = int(extra.get("gpu_stage_bytes", 512 << 20))
        self.stage_pipeline = bool(extra.get("stage_pipeline", True))
        self.stage_slice_bytes = int(extra.get("stage_slice_bytes", PIPE_SLICE))
        # "layerwise": loads inside the step, layer group by layer group;
        # "async": between steps (the request waits, the batch goes on)
        self.load_mode = str(extra.get("load_mode", "layerwise"))
        if self.load_mode not in ("layerwise", "async"):
            raise ValueError("kvferry connector: load_mode is 'layerwise' or 'async', got %r"
                             % self.load_mode)
        self._extra = extra
        self._overlap = False
        self._kv_cache_cfg = kv_cache_config
        spec, layers = _group(kv_cache_config)
        self.block_size = int(spec.block_size)
        if self.chunk_tokens % self.block_size:  # a chunk holds whole blocks
            self.chunk_tokens = max(1, self.chunk_tokens // self.block_size) * self.block_size
        self.layer_names = layers
        hazard = recompute_hazard(vllm_config)
        if hazard:
            log.warning("%s", hazard)
        self.stats = _engine_stats(cfg)
        self._lock = threading.Lock()
        master = extra.get("master")
        if master == "embedded":  # a store inside this process
            from .embedded import parse_size, shared

            master = shared(parse_size(extra.get("embedded_pool", "8G"))).address
        self.store: Optional[Store] = Store.connect(master, extra.get("timeout_ms"))
        # scheduler side
        groups = effective_groups(self.layer_groups, len(layers))
        # one index per tensor-parallel rank: each rank's worker saves its
        # own heads under its own fingerprint, and a hit needs all of them
        tp = int(_get(vllm_config, "parallel_config.tensor_parallel_size") or 1)
        self.indexes = [ChunkIndex(self.store, self.block_size,
                                   identity(vllm_config, kv_cache_config, r),
                                   self.namespace, self.chunk_tokens, groups)
                        for r in range(max(1, tp))]
        self.index = self.indexes[0]
        self._matched: Dict[str, Tuple[int, int, List[Chunk]]] = {}
        self._loads: Dict[str, LoadSpec] = {}
        self._tracked: Dict[str, _Tracked] = {}
        #: requests the workers may still be gathering blocks of (a save
        #: was scheduled), and finished ones to release in the next step
        self._saving: Set[str] = set()
        self._release: List[str] = []
        # worker side
        self.cache: Optional[ChunkStore] = None
        self._torch: Any = None
        self._step: Optional[_Step] = None
        self._failed: Set[int] = set()
        self._mover_q: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._async_q: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._recved: Set[str] = set()
        self._commit_q: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._threads: List[threading.Thread] = []
        self._group_last: Dict[str, int] = {}
        self._group_of: Dict[str, int] = {}
        #: finished requests whose blocks vLLM holds until this worker's
        #: gathers are done, with the last step that had saves then
        self._held: List[Tuple[str, Optional[_Step]]] = []
        self._last_saving: Optional[_Step] = None

    # ==================================================================
    # vLLM class-level questions
    # ==================================================================

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:
        """The workers read and write the KV cache in their own process
        (copy kernels launched by this connector): vLLM may allocate it as
        it likes."""
        if KVCacheAccess is None:  # pragma: no cover - older vLLM
            return None
        return KVCacheAccess.IN_PROCESS

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        """Layer-wise loads and saves run Python between layers."""
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        """A cache: a dropped save is a later miss, not a lost hand-off."""
        return False

    def may_load_async(self, request: Any) -> bool:
        """Whether a lookup may answer an asynchronous load (load_mode
        "async"; layer-wise loads run inside the step)."""
        return self.load_mode == "async"

    # ==================================================================
    # scheduler side
    # ==================================================================

    def lookup(self, tokens: Sequence[int], limit: Optional[int] = None) -> int:
        """Leading tokens of ``tokens`` the store holds (at most limit)."""
        if limit is None:
            limit = len(tokens) // self.block_size * self.block_size
        return self._lookup(list(tokens), limit)[0]

    def _lookup(self, tokens: List[int], limit: int) -> Tuple[int, List[Chunk]]:
        """(tokens every rank's store objects hold, rank 0's chunks for
        them): ranks' chunks have the same boundaries, their keys differ."""
        hit, chunks = self.index.lookup(tokens, limit)
        for ix in self.indexes[1:]:
            if hit == 0:
                break
            hit = min(hit, ix.lookup(tokens, hit)[0])
        while chunks and chunks[-1].first_token >= hit:
            chunks.pop()
        return hit, chunks

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
        rid = request.request_id
        seen = self._matched.get(rid)
        if seen is not None and seen[0] == num_computed_tokens:
            n = max(0, seen[1] - num_computed_tokens)
            return n, n > 0 and self.load_mode == "async"
        try:
            hit, chunks = self._lookup(list(prompt), limit)
        except KvferryError as e:  # a dead store is a miss: vLLM computes
            log.warning("kvferry connector: lookup failed: %s", e)
            hit, chunks = 0, []
        with self._lock:
            self.stats["lookups"] += 1
            self.stats["hit_tokens"] += max(0, hit - num_computed_tokens)
        self._matched[rid] = (num_computed_tokens, hit, chunks)
        n = max(0, hit - num_computed_tokens)
        return n, n > 0 and self.load_mode == "async"

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Records the blocks vLLM allocated for the tokens to load."""
        rid = request.request_id
        matched = self._matched.pop(rid, None)
        if num_external_tokens <= 0 or matched is None:
            return
        local, _, chunks = matched
        ids = list(blocks.get_block_ids()[0])
        end = local + num_external_tokens
        last = chunks[-1].first_token + chunks[-1].blocks * self.block_size if chunks else 0
        self._loads[rid] = LoadSpec(rid, chunks, ids[:end // self.block_size], local, end,
                                    list(request.prompt_token_ids[:last]),
                                    self.load_mode == "async")

    def _new_saves(self, rid: str, computed: int) -> Optional[SaveSpec]:
        """The chunks of request rid's prompt complete at computed tokens
        and not saved yet: full chunks, and the tail once the prompt's
        last full block is computed."""
        tr = self._tracked.get(rid)
        if tr is None:
            return None
        bs, n = self.block_size, self.chunk_tokens
        blocks_known = min(len(tr.tokens), len(tr.block_ids) * bs) // bs * bs
        upto = min(computed, blocks_known) // n * n
        if min(computed, len(tr.tokens)) >= len(tr.tokens) // bs * bs:
            upto = min(blocks_known, len(tr.tokens) // bs * bs)
        if upto <= tr.saved:
            return None
        chunks = [c for c in self.index.chunks_of(tr.tokens, upto) if c.first_token >= tr.saved]
        tr.saved = upto
        return SaveSpec(rid, chunks, list(tr.block_ids), tr.tokens[:upto]) if chunks else None

    def build_connector_meta(self, scheduler_output: Any) -> KvferryConnectorMetadata:
        """This step's loads, and the prompt chunks complete after it."""
        meta = KvferryConnectorMetadata(loads=list(self._loads.values()), release=self._release)
        self._loads, self._release = {}, []
        # a preempted request's blocks go back to vLLM now, unasked: if a
        # gather may still read them, the step waits for the gathers
        # (unknown on a vLLM without preempted_req_ids: always)
        preempted = getattr(scheduler_output, "preempted_req_ids", None)
        meta.wait_saves = preempted is None or bool(self._saving & set(preempted))
        for rid in getattr(scheduler_output, "finished_req_ids", None) or ():
            self._tracked.pop(rid, None)
            self._matched.pop(rid, None)
        if not self.saves:
            return meta
        sched = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            if not new.prompt_token_ids:
                continue
            tr = _Tracked(list(new.prompt_token_ids), list(new.block_ids[0]))
            # what the store already holds (the loaded prefix) is not saved
            tr.saved = new.num_computed_tokens // self.chunk_tokens * self.chunk_tokens
            self._tracked[new.req_id] = tr
            self._add_save(meta, new.req_id, new.num_computed_tokens + sched.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for i, rid in enumerate(cached.req_ids):
            tr = self._tracked.get(rid)
            if tr is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in resumed:
                tr.block_ids, tr.saved = (list(new_ids[0]) if new_ids else []), 0
            elif new_ids:
                tr.block_ids += list(new_ids[0])
            done = cached.num_computed_tokens[i]
            if done < tr.saved:
                # vLLM computes blocks again (a load of them failed, under
                # kv_load_failure_policy "recompute"): save them again
                tr.saved = done // self.chunk_tokens * self.chunk_tokens
            self._add_save(meta, rid, done + sched.get(rid, 0))
        return meta

    def _add_save(self, meta: KvferryConnectorMetadata, rid: str, computed: int) -> None:
        sv = self._new_saves(rid, computed)
        if sv is not None:
            meta.saves.append(sv)
            self._saving.add(rid)

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Frees the request's state. A request that had saves keeps its
        blocks (True) until the workers' gathers have read them: the next
        step's metadata names it, and each worker's get_finished reports
        it once done. A producer returns how many prompt tokens it saved."""
        rid = request.request_id
        tr = self._tracked.pop(rid, None)
        self._matched.pop(rid, None)
        self._loads.pop(rid, None)
        held = rid in self._saving
        if held:
            self._saving.discard(rid)
            self._release.append(rid)
        if not self.saves or tr is None:
            return held, None
        return held, {"kvferry": {"namespace": self.namespace, "stored_tokens": tr.saved}}

    # ==================================================================
    # worker side
    # ==================================================================

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Binds the KV tensors (in layer order) to the store and registers
        the store node's pool with the GPU, ahead of the first transfer."""
        order = self.layer_names if set(self.layer_names) == set(kv_caches) else list(kv_caches)
        tensors = [kv_caches[n] for n in order]
        ident = identity(self._vllm_config, self._kv_cache_cfg, _tp_rank(self._vllm_config))
        if self.cache is not None:
            self.cache.close()
        self.cache = ChunkStore(self.store, tensors, _num_blocks(self._kv_cache_cfg, tensors[0]),
                                self.block_size, ident, namespace=self.namespace,
                                chunk_tokens=self.chunk_tokens, layer_groups=self.layer_groups,
                                replicas=self.replicas, stage_bytes=self.stage_bytes,
                                views=self.use_views, sum_mode=self.sum_mode,
                                gpu_stage_bytes=self.gpu_stage_bytes,
                                pipeline=self.stage_pipeline,
                                slice_bytes=self.stage_slice_bytes)
        self.cache.quota_wait = self._drain_commits
        self._group_of = {n: self.cache.map.group_of[i] for i, n in enumerate(order)}
        self._group_last = {order[ls[-1]]: g for g, ls in enumerate(self.cache.map.groups)}
        # loads and saves on the mover thread, overlapped with the forward
        # pass (GPU caches; host caches when the "overlap" key says so)
        self._overlap = bool(self._extra.get("overlap", self.cache.gpu))
        if self.cache.gpu:
            import torch

            self._torch = torch
            t0 = time.perf_counter()
            n = self.cache.warm()
            log.info("kvferry connector: %d pool mapping(s) registered with the GPU in %.2f s",
                     n, time.perf_counter() - t0)
            if self.cache.warm_error:
                log.warning("kvferry connector: warming the GPU copies failed (%s); "
                            "the stage pipeline, if asked for, is off", self.cache.warm_error)
        self._start_threads()

    def _start_threads(self) -> None:
        if self._threads:
            return
        # a process that ends without shutdown() still commits its saves
        atexit.register(self.flush, 30.0)
        for name, q in (("kvferry-mover", self._mover_q), ("kvferry-commit", self._commit_q),
                        ("kvferry-load", self._async_q)):
            t = threading.Thread(target=self._run, args=(q,), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    @staticmethod
    def _run(q: "queue.Queue[Optional[Callable[[], None]]]") -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a job reports its own outcome; never die
                log.exception("kvferry connector: background job failed")

    def _mark(self) -> Any:
        """Where vLLM's CUDA stream stands now (an event), None on CPU."""
        if self._torch is None:
            return None
        ev = self._torch.cuda.Event()
        ev.record()
        return ev

    @staticmethod
    def _wait_event(ev: Any) -> None:
        if ev is not None:
            ev.synchronize()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Hands this step's loads and saves to the mover thread. The
        last step's gathers go on unless this step may write blocks they
        read (a preempted request's, given back): see _finish_step."""
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        self._finish_step(getattr(meta, "wait_saves", True))
        for rid in getattr(meta, "release", None) or ():
            self._held.append((rid, self._last_saving))
        if self.cache is None or meta is None:
            return
        loads, saves = list(getattr(meta, "loads", None) or ()), list(getattr(meta, "saves", None) or ())
        later = [ld for ld in loads if getattr(ld, "is_async", False)]
        if later:
            self._start_async_loads(later)
            loads = [ld for ld in loads if not getattr(ld, "is_async", False)]
        if not loads and not saves:
            return
        step = _Step(self.cache.groups)
        step.saves = saves
        self._step = step
        if saves:
            self._last_saving = step
        if loads:
            step.loads = [(ld, LoadReq(self._mine(ld), ld.block_ids, ld.start, ld.end))
                          for ld in loads]
            self._submit(self._load_job(step, self._mark()))
        else:
            step.load_finished.set()
            for ev in step.load_done:
                ev.set()
        if not saves:
            step.save_gathered.set()
        elif self._overlap:  # gathers overlap the forward pass
            self._mover_q.put(self._save_job(step))
        # host caches: saved once the forward pass has written them
        # (_end_forward)

    def _mine(self, spec: Any) -> List[Chunk]:
        """A spec's chunks keyed for this worker's rank."""
        if self.cache is None or self.cache.fingerprint == self.index.fingerprint:
            return spec.chunks
        return self.cache.rekey(spec.tokens, spec.chunks)

    def _submit(self, job: Callable[[], None]) -> None:
        if not self._overlap:  # in the caller's thread
            job()
        else:
            self._mover_q.put(job)

    def _start_async_loads(self, loads: List[LoadSpec]) -> None:
        """Loads between steps, on their own thread: the requests wait in
        vLLM (WAITING_FOR_REMOTE_KVS) until get_finished names them."""
        reqs = [(ld, LoadReq(self._mine(ld), ld.block_ids, ld.start, ld.end)) for ld in loads]
        mark = self._mark()

        def job() -> None:
            try:
                self._wait_event(mark)
                self.cache.load([r for _, r in reqs])
            finally:
                self._record_loads_of(reqs)
                with self._lock:
                    self._recved.update(ld.req_id for ld, _ in reqs)
        if self._overlap:
            self._async_q.put(job)
        else:
            job()

    def _load_job(self, step: _Step, mark: Any) -> Callable[[], None]:
        def job() -> None:
            try:
                self._wait_event(mark)  # earlier steps' kernels are done with the blocks
                self.cache.load([r for _, r in step.loads], group_done=lambda g: step.load_done[g].set())
            finally:
                for ev in step.load_done:
                    ev.set()
                step.load_finished.set()
        return job

    def _save_job(self, step: _Step) -> Callable[[], None]:
        def ready(g: int) -> None:
            if self._overlap and not step.save_ready[g].wait(STEP_WAIT_S):
                raise KvferryError(-6, "save", "the forward pass did not reach layer group %d" % g)
            self._wait_event(step.save_events[g])

        def job() -> None:
            try:
                reqs = [SaveReq(self._mine(sv), sv.block_ids) for sv in step.saves]
                # each group's commit queued as soon as its gathers are done
                self.cache.save(reqs, group_ready=ready,
                                on_commit=lambda c: self._commit_q.put(self._commit_job(c)))
            finally:
                step.save_gathered.set()
        return job

    def _drain_commits(self, timeout: float = 2.0) -> None:
        """Waits (at most timeout) for the commits queued so far: a put
        view refused for the client's quota of uncommitted bytes is asked
        again after them."""
        done = threading.Event()
        self._commit_q.put(done.set)
        done.wait(timeout)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Waits until the layer's group is in the cache (or failed)."""
        step = self._step
        if step is None or not step.loads:
            return
        g = self._group_of.get(layer_name, 0)
        if step.load_done[g].is_set():
            return
        t0 = time.perf_counter()
        if not step.load_done[g].wait(STEP_WAIT_S):
            log.error("kvferry connector: layer group %d not loaded in %.0f s", g, STEP_WAIT_S)
        self._count_wait("wait_load_us", t0)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """At the last layer of a group: the group's blocks can be read once
        vLLM's stream gets here (the mover gathers them meanwhile)."""
        step = self._step
        g = self._group_last.get(layer_name)
        if step is None or not step.saves or g is None or step.save_ready[g].is_set():
            return
        step.save_events[g] = self._mark()
        step.save_ready[g].set()

    def wait_for_save(self) -> None:
        """Ends this step's forward pass on the connector's side: every
        layer group released to the save job, the loads waited for. The
        gathers go on meanwhile: the next step's start_load_kv (every
        forward pass, the only writer of the cache, starts there) waits
        for them, so the step's output leaves without their tail."""
        self._end_forward()

    def _end_forward(self) -> Optional[_Step]:
        """The current step's forward pass is over (idempotent): every
        group released to the save job, its loads waited for and their
        failures recorded. Returns the step (None: there is none)."""
        step = self._step
        if step is None or step.finished:
            return step
        step.finished = True
        if step.saves and not self._overlap:
            self._save_job(step)()
        mark = None
        for g, ready in enumerate(step.save_ready):
            if not ready.is_set():  # the forward did not reach it: now
                mark = mark or self._mark()
                step.save_events[g] = mark
                ready.set()
        if not step.load_finished.wait(STEP_WAIT_S):
            log.error("kvferry connector: a step's loads did not end in %.0f s", STEP_WAIT_S)
        self._record_loads(step)
        return step

    def _finish_step(self, gathers: bool = True) -> None:
        """Ends the current step's work: _end_forward, then (gathers) its
        gathers waited for (the cache's blocks read), so that no forward
        pass writes blocks a save has still to read. Without: the blocks
        they read stay the requests' (running, or finished and held until
        get_finished names them). The commits go on in the committer
        thread."""
        step = self._end_forward()
        if not gathers or step is None or step.save_gathered.is_set():
            return
        t0 = time.perf_counter()
        if not step.save_gathered.wait(STEP_WAIT_S):
            log.error("kvferry connector: a step's saves did not gather in %.0f s", STEP_WAIT_S)
        self._count_wait("wait_save_us", t0)

    def _count_wait(self, name: str, since: float) -> None:
        with self._lock:
            self.stats[name] += int((time.perf_counter() - since) * 1e6)

    def _commit_job(self, commit: Callable[[], int]) -> Callable[[], None]:
        def job() -> None:
            n = commit()
            with self._lock:
                self.stats["saved_objects"] += n
                # chunks: objects over groups (a chunk is one object a group)
                groups = self.cache.groups if self.cache else 1
                self.stats["saved_chunks"] = self.stats["saved_objects"] // max(1, groups)
        return job

    def _record_loads(self, step: _Step) -> None:
        self._record_loads_of(step.loads)

    def _record_loads_of(self, loads: List[Tuple[LoadSpec, LoadReq]]) -> None:
        bad_chunks: List[Chunk] = []
        for ld, req in loads:
            with self._lock:
                self.stats["loaded_tokens"] += req.loaded
                if req.failed_blocks:
                    self.stats["load_failures"] += 1
                    self._failed.update(req.failed_blocks)
            if req.failed_blocks:
                first = ld.start + req.loaded
                bad_chunks += [c for c in req.chunks
                               if c.first_token + c.blocks * self.block_size > first]
        if bad_chunks and self.cache is not None:
            cache = self.cache
            # a damaged or incomplete chunk would be a hit that fails again
            self._commit_q.put(lambda: cache.remove(bad_chunks))

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """(finished requests whose held blocks this worker's gathers are
        done with: vLLM frees them; requests whose asynchronous loads
        ended: their failed blocks are reported by
        get_block_ids_with_load_errors no later than this pass)."""
        with self._lock:
            done, self._recved = self._recved, set()
        sent = {rid for rid, st in self._held if st is None or st.save_gathered.is_set()}
        if sent:
            self._held = [(rid, st) for rid, st in self._held if rid not in sent]
        return (sent or None), (done or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        """Blocks whose load failed since the last call (vLLM recomputes them)."""
        self._end_forward()
        with self._lock:
            out, self._failed = self._failed, set()
        return out

    def flush(self, timeout: float = STEP_WAIT_S) -> bool:
        """Waits until every queued save is committed (True) or timeout."""
        self._finish_step()
        done = threading.Event()
        for q in (self._async_q, self._mover_q, self._commit_q):
            if self._threads:
                done.clear()
                q.put(done.set)
                if not done.wait(timeout):
                    return False
        return True

    def shutdown(self) -> None:
        """Commits what is queued, stops the threads, closes the store."""
        if self._threads:
            self.flush()
            for q in (self._mover_q, self._commit_q, self._async_q):
                q.put(None)
            for t in self._threads:
                t.join(STEP_WAIT_S)
            self._threads = []
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        if self.store is not None:
            self.store.close()
            self.store = None


__all__ = ["KvferryConnector", "KvferryConnectorMetadata", "LoadSpec", "SaveSpec", "identity",
           "recompute_hazard", "HAVE_VLLM"]
