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
``timeout_ms``, ``replicas``, ``namespace``, ``lookup``,
``load_timeout_ms``, ``locality``) come to the constructor as keyword
arguments (``backpressure`` is vLLM's: its detector comes as
``backpressure_detector``).

vLLM's primary tier is a CPU buffer of slots (``primary_kv_view``, one
slot = ``strides[0]`` bytes); the tier moves whole slots between it and
the store, one store object per ``OffloadKey``. The buffer is registered
once with the store's engine, so a job is batched puts or gets of
``(region, slot * slot_bytes, slot_bytes)`` spans, without copies, run
on a worker thread (loads before queued stores: the scheduler waits for
loads); lookups are answered by a second thread, many keys per
``exists_batch``. Every method the scheduler calls returns at once.

Keys carry a namespace (model, slot size, tensor-parallel rank where
vLLM's config tells them, else the ``namespace`` option) so that caches
of another layout do not meet. The store verifies each object's checksum
on get; a load that fails in any way reports the keys that did load
(``successful_keys``) and vLLM recomputes the rest.

A store that stops making progress (no batch done for
``load_timeout_ms``) fails the loads waiting on it, so that vLLM
recomputes rather than stalls: a queued load fails at once (nothing was
read), the running one, where vLLM's ``JobResult`` has
``deferred_release`` (0.34), fails with an event that the worker sets
once its store call has returned, i.e. once no read can write the
primary slots any more; vLLM holds those slots until then. Where it
lacks the field (0.33) the running load reports when its read ends.

Against vLLM's real classes when ``vllm`` is importable (0.33 and 0.34:
where they differ the module looks at the classes, not at a version);
otherwise a stand-in base and stand-in result types with the same names
and defaults as 0.34's let the module import and be tested without vLLM.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Collection, Deque, Dict, Iterable, List, Optional, Tuple

from .errors import (ERR_CONN_RESET, ERR_CONNECT, ERR_EXISTS, ERR_PEER_CLOSED,
                     ERR_PEER_UNREACHABLE, ERR_TIMEOUT, ERR_UNAVAILABLE, OK, KvferryError)
from .store import BATCH_MAX, Store

log = logging.getLogger("kvferry.vllm_tier")

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

    @dataclasses.dataclass
    class RequestOffloadingContext:  # type: ignore[no-redef]
        policy: Any = None

    @dataclasses.dataclass
    class JobResult:  # type: ignore[no-redef]
        job_id: int
        success: bool
        successful_keys: Optional[Collection[bytes]] = None
        transfer_time: Optional[float] = None
        transfer_bytes: Optional[int] = None
        deferred_release: Optional[threading.Event] = None

    @dataclasses.dataclass
    class TransferJob:  # type: ignore[no-redef]
        job_id: int
        keys: Collection[bytes]
        chunk_ids: Any
        is_promotion: bool
        req_context: Any
        submit_time: float = dataclasses.field(default_factory=time.monotonic)

    class SecondaryTierManager(ABC):  # type: ignore[no-redef]
        """Stand-in for vLLM 0.34's SecondaryTierManager: the same
        constructor, properties, abstract methods and defaults."""

        medium: ClassVar[Any] = None
        tolerates_off_thread_polling: ClassVar[bool] = False

        def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                     backpressure_detector: Any = None) -> None:
            self._offloading_spec = offloading_spec
            self._primary_kv_view = primary_kv_view
            self._block_size_bytes = primary_kv_view.strides[0]
            self.tier_type = tier_type
            self.locality: Any = None
            self._bp_detector = backpressure_detector

        @property
        def block_size_bytes(self) -> int:
            return self._block_size_bytes

        @property
        def bp_detector(self) -> Any:
            return self._bp_detector

        @abstractmethod
        def lookup(self, key: Any, req_context: Any) -> Any: ...

        @abstractmethod
        def submit_store(self, job_metadata: Any) -> None: ...

        @abstractmethod
        def submit_load(self, job_metadata: Any) -> None: ...

        @abstractmethod
        def get_finished_jobs(self) -> Iterable[Any]: ...

        def has_pending_work(self) -> bool:
            return False

        def take_events(self) -> Iterable[Any]:
            return ()

        @abstractmethod
        def on_new_request(self, req_context: Any) -> Any: ...

        def on_request_finished(self, req_context: Any) -> None:
            return

        def serve_external_requests(self, parent: Any) -> None:
            return

        def on_schedule_end(self, context: Any) -> None:
            return

        @abstractmethod
        def drain_jobs(self) -> None: ...

        def shutdown(self) -> None:
            return

        @classmethod
        def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, Any]:
            return {}

        def get_stats(self) -> Any:
            return None

        @classmethod
        def config_info_keys(cls, tier_config: Dict[str, Any]) -> Tuple[str, ...]:
            return ()

        def config_info(self) -> Dict[str, str]:
            return {}

try:  # 0.34 names the tier's medium and locality
    from vllm.v1.kv_offload.base import Locality, Medium
except Exception:  # pragma: no cover - depends on the environment
    class Medium(enum.Enum):  # type: ignore[no-redef]
        CPU = "CPU"
        STORAGE = "STORAGE"

    class Locality(enum.Enum):  # type: ignore[no-redef]
        LOCAL = "LOCAL"
        REMOTE = "REMOTE"

_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(JobResult))
# vLLM holds a failed load's slots until the tier says its I/O has ended
CAN_DEFER_RELEASE = "deferred_release" in _RESULT_FIELDS
# vLLM takes the keys of a failed load that did load
PARTIAL_LOADS = "successful_keys" in _RESULT_FIELDS

BATCH_BYTES = 64 << 20      # bytes of one store call: progress is seen per call
KNOWN_MAX = 1 << 20         # keys whose presence the tier remembers (LRU)
STALL_HOLD = 10             # after expiring loads, lookups miss for this many load timeouts
# statuses of a call the store did not answer (a stalled or unreachable store)
_UNANSWERED = frozenset((ERR_TIMEOUT, ERR_CONNECT, ERR_CONN_RESET, ERR_PEER_CLOSED,
                         ERR_PEER_UNREACHABLE, ERR_UNAVAILABLE))


def _result(job_id: int, success: bool, **fields: Any) -> Any:
    """A JobResult with the fields this vLLM's class has."""
    return JobResult(job_id=job_id, success=success,
                     **{k: v for k, v in fields.items() if k in _RESULT_FIELDS})


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


class _Job:
    """One submitted store or load job and where it stands."""

    __slots__ = ("meta", "keys", "load", "since", "running", "good", "release")

    def __init__(self, meta: Any, load: bool) -> None:
        self.meta = meta
        self.keys = list(meta.keys)              # vLLM's key objects, in order
        self.load = load
        self.since = time.monotonic()
        self.running = False
        self.good: List[Any] = []                # keys whose slots are in place
        self.release: Optional[threading.Event] = None   # reported early: set at the end


class KvferryTier(SecondaryTierManager):
    """vLLM ``SecondaryTierManager`` over a kvferry store."""

    # DRAM of the store's nodes (vLLM counts hits from it as host hits)
    medium = Medium.CPU

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, master: Optional[str] = None,
                 timeout_ms: Optional[int] = None, replicas: int = 0,
                 namespace: Optional[str] = None, lookup: str = "async",
                 load_timeout_ms: int = 2000, locality: Optional[str] = None,
                 store: Optional[Store] = None, **_ignored: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        if lookup not in ("async", "sync"):
            raise ValueError("kvferry tier: lookup is 'async' or 'sync'")
        if int(load_timeout_ms) <= 0:
            raise ValueError("kvferry tier: load_timeout_ms must be > 0")
        self.locality = Locality(locality.upper()) if locality else None
        self._slot = primary_kv_view.strides[0]
        self._per_call = max(1, min(BATCH_MAX, BATCH_BYTES // max(1, self._slot)))
        self._own_store = store is None
        self.store = store if store is not None else Store.connect(master, timeout_ms=timeout_ms)
        self._region = self.store.register(primary_kv_view)
        self.replicas = int(replicas)
        self.prefix = "vllm/%s/" % _namespace(offloading_spec, self._slot, namespace)
        self._sync_lookup = lookup == "sync"
        self._load_timeout = int(load_timeout_ms) / 1000.0
        self._cv = threading.Condition(threading.Lock())
        self._loads: Deque[_Job] = collections.deque()      # queued, run first
        self._stores: Deque[_Job] = collections.deque()     # queued
        self._running: Optional[_Job] = None
        self._waiting: Dict[int, _Job] = {}                 # loads not reported, by job id
        self._finished: List[Any] = []
        self._progress_at = time.monotonic()                # a job started or a call ended
        self._stalled_until = 0.0                           # lookups miss until then
        self._known: "collections.OrderedDict[bytes, bool]" = collections.OrderedDict()
        self._ask: Deque[bytes] = collections.deque()       # async lookups queued
        self._asking: set = set()                           # ... queued or in flight
        self._storing: Dict[bytes, int] = {}                 # keys being stored: jobs
        self._closed = False
        self.stats = {"stores": 0, "loads": 0, "failed_loads": 0, "expired_loads": 0,
                      "bytes": 0}
        self._threads = [threading.Thread(target=self._run_jobs, name="kvferry-tier",
                                          daemon=True),
                         threading.Thread(target=self._run_lookups, name="kvferry-tier-lookup",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    def _key(self, key: Any) -> str:
        return self.prefix + bytes(key).hex()

    # -- scheduler-facing, non-blocking ------------------------------------

    def lookup(self, key: Any, req_context: Any) -> Any:
        k = bytes(key)
        with self._cv:
            answer = self._cached_answer(k)
        if answer is not None:
            return answer
        try:
            found = self.store.exists(self._key(k))
        except KvferryError:
            return LookupResult.MISS
        if found:
            with self._cv:
                self._remember(k, True)
        return LookupResult.HIT if found else LookupResult.MISS

    def _cached_answer(self, k: bytes) -> Any:
        """HIT, MISS or RETRY from what the tier knows (an unknown key,
        async: RETRY, its question queued); None: ask the store (sync)."""
        if time.monotonic() < self._stalled_until:
            return LookupResult.MISS    # loads just expired: recompute, no promotion
        if k in self._storing:
            return LookupResult.RETRY
        present = self._known.get(k)
        if present:
            self._known.move_to_end(k)
            return LookupResult.HIT
        if present is False:    # an async answer: given once, then asked again
            del self._known[k]
            return LookupResult.MISS
        if self._sync_lookup:
            return None
        if k not in self._asking:
            self._asking.add(k)
            self._ask.append(k)
            self._cv.notify_all()
        return LookupResult.RETRY

    def _remember(self, k: bytes, present: bool) -> None:
        self._known[k] = present
        self._known.move_to_end(k)
        while len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    def submit_store(self, job_metadata: Any) -> None:
        job = _Job(job_metadata, load=False)
        with self._cv:
            for k in job.keys:
                self._storing[bytes(k)] = self._storing.get(bytes(k), 0) + 1
            self._stores.append(job)
            self._cv.notify_all()

    def submit_load(self, job_metadata: Any) -> None:
        job = _Job(job_metadata, load=True)
        with self._cv:
            self._loads.append(job)
            self._waiting[job.meta.job_id] = job
            self._cv.notify_all()

    def get_finished_jobs(self) -> Iterable[Any]:
        with self._cv:
            self._expire_stalled(time.monotonic())
            out, self._finished = self._finished, []
        return out

    def has_pending_work(self) -> bool:
        with self._cv:
            return bool(self._loads or self._stores or self._running is not None
                        or self._finished or self._asking)

    def on_new_request(self, req_context: Any) -> Any:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """Blocks until no job is queued or running and no lookup is
        asked: every job's result is then in get_finished_jobs(), and
        every deferred_release event is set. Jobs still queued when the
        store has made no progress for load_timeout_ms fail without
        running, so the wait is the running store call's, which the
        store's own timeout bounds."""
        start = last = time.monotonic()
        with self._cv:
            while self._busy():
                now = time.monotonic()
                self._expire_stalled(now)
                if now - max(self._progress_at, start) >= self._load_timeout:
                    self._fail_queued()
                if now - last >= 10.0:
                    last = now
                    log.warning("kvferry tier: drain_jobs waiting %.0f s for a store call",
                                now - start)
                self._cv.wait(timeout=min(1.0, self._load_timeout))

    def shutdown(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=60)
        if any(t.is_alive() for t in self._threads):
            # a store call still runs: leave the region and connection to it
            log.warning("kvferry tier: a store call outlived shutdown; not deregistering")
            return
        self._region.deregister()
        if self._own_store:
            self.store.close()

    # -- bookkeeping, under self._cv ---------------------------------------

    def _busy(self) -> bool:
        return bool(self._loads or self._stores or self._running is not None or self._asking)

    def _expire_stalled(self, now: float) -> None:
        """Fails the waiting loads when the store has made no progress for
        load_timeout since the oldest of them was submitted."""
        if not self._waiting:
            return
        oldest = next(iter(self._waiting.values()))
        if now - max(self._progress_at, oldest.since) < self._load_timeout:
            return
        for job in list(self._waiting.values()):
            if not job.running:
                self._loads.remove(job)
                self._finished.append(_result(job.meta.job_id, False, successful_keys=[]))
            elif CAN_DEFER_RELEASE and len(job.good) < len(job.keys):
                job.release = threading.Event()
                self._finished.append(_result(job.meta.job_id, False,
                                              successful_keys=list(job.good),
                                              deferred_release=job.release))
            else:
                continue  # no deferral in this vLLM: reported when its read ends
            del self._waiting[job.meta.job_id]
            self.stats["expired_loads"] += 1
            self.stats["failed_loads"] += 1
            self._stalled_until = now + STALL_HOLD * self._load_timeout

    def _progressed(self, statuses: Iterable[int]) -> None:
        """A store call has ended with these statuses (sizes for gets): one
        the store answered ends the stall hold."""
        self._progress_at = time.monotonic()
        if any(st not in _UNANSWERED for st in statuses):
            self._stalled_until = 0.0

    def _stored(self, job: _Job) -> None:
        """A store job has ended (or will not run): its keys answer again."""
        for k in job.keys:
            n = self._storing.pop(bytes(k), 1) - 1
            if n > 0:
                self._storing[bytes(k)] = n

    def _fail_queued(self) -> None:
        """The store is stalled and drain_jobs waits: queued stores and
        lookups will not run (loads go by _expire_stalled)."""
        for k in self._ask:
            self._asking.discard(k)
        self._ask.clear()
        while self._stores:
            job = self._stores.popleft()
            self._stored(job)
            self._finished.append(_result(job.meta.job_id, False, transfer_bytes=0))

    # -- workers -------------------------------------------------------------

    def _next_job(self) -> Optional[_Job]:
        with self._cv:
            while not self._closed and not (self._loads or self._stores):
                self._cv.wait()
            if self._closed:
                return None
            job = (self._loads or self._stores).popleft()
            job.running = True
            self._running = job
            self._progress_at = time.monotonic()
            return job

    def _run_jobs(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                result = self._do_load(job) if job.load else self._do_store(job)
            except Exception:  # a job never kills the worker
                log.exception("kvferry tier: job %s failed", job.meta.job_id)
                result = _result(job.meta.job_id, False, successful_keys=list(job.good))
            with self._cv:
                self._running = None
                if job.release is not None:
                    job.release.set()       # reported already; no read runs now
                else:
                    self._waiting.pop(job.meta.job_id, None)
                    self._finished.append(result)
                self._cv.notify_all()

    def _run_lookups(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._ask:
                    self._cv.wait()
                if self._closed:
                    return
                keys = [self._ask.popleft() for _ in range(min(BATCH_MAX, len(self._ask)))]
            try:
                found = self.store.exists_batch([self._key(k) for k in keys])
                statuses = [OK]
            except KvferryError as e:
                found, statuses = [False] * len(keys), [e.code]
            with self._cv:
                self._progressed(statuses)
                for k, f in zip(keys, found):
                    self._asking.discard(k)
                    self._remember(k, f)
                self._cv.notify_all()

    def _calls(self, job: _Job) -> Iterable[Tuple[int, int, List[str], List[Any]]]:
        """(start, end, store keys, spans) of each store call of a job."""
        ids = job.meta.chunk_ids
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        for a in range(0, len(job.keys), self._per_call):
            b = min(len(job.keys), a + self._per_call)
            yield (a, b, [self._key(k) for k in job.keys[a:b]],
                   [(self._region, int(i) * self._slot, self._slot) for i in ids[a:b]])

    def _do_store(self, job: _Job) -> Any:
        t0 = time.monotonic()
        ok, done = True, []
        for a, b, names, spans in self._calls(job):
            try:
                sts = self.store.put_batch(names, spans, replicas=self.replicas, check=False)
            except KvferryError as e:
                sts = [e.code] * (b - a)
            for k, s in zip(job.keys[a:b], sts):
                if s in (OK, ERR_EXISTS):
                    done.append(bytes(k))
                else:
                    ok = False
            with self._cv:
                self._progressed(sts)
        with self._cv:
            self._stored(job)
            for k in done:
                self._remember(k, True)
            self.stats["stores"] += 1
            self.stats["bytes"] += len(done) * self._slot
        return _result(job.meta.job_id, ok, transfer_time=time.monotonic() - t0,
                       transfer_bytes=len(done) * self._slot)

    def _do_load(self, job: _Job) -> Any:
        t0 = time.monotonic()
        for a, b, names, spans in self._calls(job):
            with self._cv:
                if job.release is not None:
                    break           # reported failed: read no more
            try:
                lens = self.store.get_batch(names, spans, check=False)
            except KvferryError as e:
                lens = [e.code] * (b - a)
            with self._cv:
                job.good += [k for k, n in zip(job.keys[a:b], lens) if n == self._slot]
                self._progressed(lens)
        with self._cv:
            ok = len(job.good) == len(job.keys)
            self.stats["loads"] += 1
            if not ok:
                got = {bytes(k) for k in job.good}
                for k in job.keys:
                    if bytes(k) not in got:
                        self._known.pop(bytes(k), None)
                if job.release is None:
                    self.stats["failed_loads"] += 1
            good = list(job.good)
        if not ok and not PARTIAL_LOADS:
            good = []
        return _result(job.meta.job_id, ok, successful_keys=None if ok else good,
                       transfer_time=time.monotonic() - t0,
                       transfer_bytes=len(good) * self._slot)


__all__ = ["KvferryTier", "HAVE_VLLM", "CAN_DEFER_RELEASE", "PARTIAL_LOADS", "JobResult",
           "TransferJob", "LookupResult", "RequestOffloadingContext"]
