"""vLLM secondary offloading tier: vLLM's CPU tier slots in the kvferry store.

vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec`` loads it
from ``--kv-transfer-config``::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {
       "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8000000000,
       "secondary_tiers": [{"type": "KvferryTier",
                            "module_path": "kvferry.vllm_tier",
                            "master": "127.0.0.1:7700"}]}}

``SecondaryTierFactory`` imports ``module_path`` and takes the class
named by ``type``; the remaining keys of the tier's entry (``master``,
``timeout_ms``, ``replicas``, ``namespace``, ``lookup``) come to the
constructor as keyword arguments.

vLLM's primary tier is a CPU buffer of slots (``primary_kv_view``, one
slot = ``strides[0]`` bytes); the tier moves whole slots between it and
the store, one store object per ``OffloadKey``. The buffer is registered
once with the store's engine, so a job is one batched put or get of
``(region, slot * slot_bytes, slot_bytes)`` spans, without copies, run
on a worker thread: every method the scheduler calls returns at once.
Keys carry a namespace (model, slot size, tensor-parallel rank where
vLLM's config tells them, else the ``namespace`` option) so that caches
of another layout do not meet. The store verifies each object's checksum
on get; a load that fails in any way reports the keys that did load
(``successful_keys``) and vLLM recomputes the rest.

Against vLLM's real classes when ``vllm`` is importable; otherwise a
stand-in base and stand-in result types with the same names let the
module import and be tested without vLLM.
"""

from __future__ import annotations

import enum
import hashlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Collection, Iterable, List, Optional, Set

from .errors import ERR_EXISTS, OK, KvferryError
from .store import BATCH_MAX, Store

try:  # the real interface, when vLLM is installed
    from vllm.v1.kv_offload.base import LookupResult, RequestOffloadingContext
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

    HAVE_VLLM = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_VLLM = False

    class LookupResult(enum.Enum):  # type: ignore[no-redef]
        MISS = 1
        HIT = 2
        HIT_PENDING = 3
        RETRY = 4

    @dataclass
    class RequestOffloadingContext:  # type: ignore[no-redef]
        policy: Any = None

    @dataclass
    class JobResult:  # type: ignore[no-redef]
        job_id: int
        success: bool
        successful_keys: Optional[Collection[bytes]] = None
        transfer_time: Optional[float] = None
        transfer_bytes: Optional[int] = None

    @dataclass
    class TransferJob:  # type: ignore[no-redef]
        job_id: int
        keys: Collection[bytes]
        chunk_ids: Any
        is_promotion: bool
        req_context: Any

    class SecondaryTierManager:  # type: ignore[no-redef]
        """Stand-in for vLLM's SecondaryTierManager (same constructor)."""

        def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                     backpressure_detector: Any = None) -> None:
            self._offloading_spec = offloading_spec
            self._primary_kv_view = primary_kv_view
            self._block_size_bytes = primary_kv_view.strides[0]
            self.tier_type = tier_type

        @property
        def block_size_bytes(self) -> int:
            return self._block_size_bytes


def _namespace(spec: Any, slot_bytes: int, given: Optional[str]) -> str:
    """A short tag of what decides a slot's bytes (model, dtype, block
    size, parallel ranks, slot size), from vLLM's config where present."""
    if given:
        return given
    parts: List[str] = ["slot=%d" % slot_bytes]
    cfg = getattr(spec, "vllm_config", None)
    for path in ("model_config.model", "model_config.dtype", "cache_config.block_size",
                 "cache_config.cache_dtype", "parallel_config.tensor_parallel_size",
                 "parallel_config.rank", "parallel_config.pipeline_parallel_size"):
        obj = cfg
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        if obj is not None:
            parts.append("%s=%s" % (path, obj))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


class KvferryTier(SecondaryTierManager):
    """vLLM ``SecondaryTierManager`` over a kvferry store."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, master: Optional[str] = None,
                 timeout_ms: Optional[int] = None, replicas: int = 0,
                 namespace: Optional[str] = None, lookup: str = "async",
                 store: Optional[Store] = None, **_ignored: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        self._slot = primary_kv_view.strides[0]
        self._nslots = primary_kv_view.shape[0]
        self._own_store = store is None
        self.store = store if store is not None else Store.connect(master, timeout_ms=timeout_ms)
        self._region = self.store.register(primary_kv_view)
        self.replicas = int(replicas)
        self.prefix = "vllm/%s/" % _namespace(offloading_spec, self._slot, namespace)
        if lookup not in ("async", "sync"):
            raise ValueError("kvferry tier: lookup is 'async' or 'sync'")
        self._sync_lookup = lookup == "sync"
        self._lock = threading.Lock()
        self._finished: List[Any] = []
        self._present: Set[bytes] = set()       # keys known stored
        self._absent: Set[bytes] = set()        # answers of async lookups
        self._asking: Set[bytes] = set()        # async lookups in flight
        self._inflight: Set[bytes] = set()      # keys being stored
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._closed = False
        self.stats = {"stores": 0, "loads": 0, "failed_loads": 0, "bytes": 0}
        self._worker = threading.Thread(target=self._run, name="kvferry-tier", daemon=True)
        self._worker.start()

    def _key(self, key: bytes) -> str:
        return self.prefix + bytes(key).hex()

    # -- scheduler-facing, non-blocking ------------------------------------

    def lookup(self, key: Any, req_context: Any) -> Any:
        k = bytes(key)
        with self._lock:
            if k in self._present:
                return LookupResult.HIT
            if k in self._inflight:
                return LookupResult.RETRY
            if k in self._absent:
                self._absent.discard(k)
                return LookupResult.MISS
            if not self._sync_lookup:
                if k not in self._asking:
                    self._asking.add(k)
                    self._q.put(("exists", k))
                return LookupResult.RETRY
        try:
            found = self.store.exists(self._key(k))
        except KvferryError:
            return LookupResult.MISS
        if found:
            with self._lock:
                self._present.add(k)
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: Any) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        with self._lock:
            self._inflight.update(keys)
        self._q.put(("store", job_metadata, keys))

    def submit_load(self, job_metadata: Any) -> None:
        self._q.put(("load", job_metadata, [bytes(k) for k in job_metadata.keys]))

    def get_finished_jobs(self) -> Iterable[Any]:
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def has_pending_work(self) -> bool:
        return self._q.unfinished_tasks > 0

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """Blocks until every submitted job has finished (results queued)."""
        self._q.join()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._worker.join(timeout=30)
        self._region.deregister()
        if self._own_store:
            self.store.close()

    # -- worker ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if item[0] == "exists":
                    self._do_exists(item[1])
                elif item[0] == "store":
                    self._do_store(item[1], item[2])
                else:
                    self._do_load(item[1], item[2])
            except Exception:  # a job never kills the worker
                if item is not None and item[0] != "exists":
                    self._finish(JobResult(job_id=item[1].job_id, success=False))
            finally:
                self._q.task_done()

    def _finish(self, result: Any) -> None:
        with self._lock:
            self._finished.append(result)

    def _do_exists(self, k: bytes) -> None:
        try:
            found = self.store.exists(self._key(k))
        except KvferryError:
            found = False
        with self._lock:
            self._asking.discard(k)
            (self._present if found else self._absent).add(k)

    def _spans(self, chunk_ids: Any) -> List[Any]:
        ids = chunk_ids.tolist() if hasattr(chunk_ids, "tolist") else list(chunk_ids)
        return [(self._region, int(i) * self._slot, self._slot) for i in ids]

    def _do_store(self, job: Any, keys: List[bytes]) -> None:
        t0 = time.monotonic()
        spans = self._spans(job.chunk_ids)
        ok = True
        done: List[bytes] = []
        try:
            for a in range(0, len(keys), BATCH_MAX):
                sts = self.store.put_batch([self._key(k) for k in keys[a:a + BATCH_MAX]],
                                           spans[a:a + BATCH_MAX], replicas=self.replicas,
                                           check=False)
                for k, s in zip(keys[a:a + BATCH_MAX], sts):
                    if s in (OK, ERR_EXISTS):
                        done.append(k)
                    else:
                        ok = False
        except KvferryError:
            ok = False
        with self._lock:
            self._inflight.difference_update(keys)
            self._present.update(done)
            self.stats["stores"] += 1
            self.stats["bytes"] += len(done) * self._slot
        self._finish(JobResult(job_id=job.job_id, success=ok,
                               transfer_time=time.monotonic() - t0,
                               transfer_bytes=len(done) * self._slot))

    def _do_load(self, job: Any, keys: List[bytes]) -> None:
        t0 = time.monotonic()
        spans = self._spans(job.chunk_ids)
        good: List[bytes] = []
        try:
            for a in range(0, len(keys), BATCH_MAX):
                lens = self.store.get_batch([self._key(k) for k in keys[a:a + BATCH_MAX]],
                                            spans[a:a + BATCH_MAX], check=False)
                good += [k for k, n in zip(keys[a:a + BATCH_MAX], lens) if n == self._slot]
        except KvferryError:
            pass
        ok = len(good) == len(keys)
        with self._lock:
            self.stats["loads"] += 1
            if not ok:
                self.stats["failed_loads"] += 1
                self._present.difference_update(set(keys) - set(good))
        self._finish(JobResult(job_id=job.job_id, success=ok,
                               successful_keys=None if ok else good,
                               transfer_time=time.monotonic() - t0,
                               transfer_bytes=len(good) * self._slot))


__all__ = ["KvferryTier", "HAVE_VLLM"]
