"""SGLang HiCache storage backend: HiCache pages in the kvferry store.

SGLang loads it with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "kvferry",
      "module_path": "kvferry.sglang", "class_name": "KvferryHiCacheStorage",
      "master": "127.0.0.1:7700"}'

``StorageBackendFactory`` imports the class and builds it with
``(storage_config, kwargs)``; the extra config arrives as
``storage_config.extra_config`` (keys here: ``master``, ``timeout_ms``,
``replicas``, ``namespace``). HiCache then calls
``register_mem_pool_host(pool)``: the host pool's buffers are registered
once with the store's engine, and ``batch_get_v1``/``batch_set_v1`` move
pages between them and the store as one batched get or put of the
spans the pool's ``get_page_buffer_meta`` gives (page-first layouts:
one K and one V span per page, MLA: one), without copies.

Keys are SGLang's page hashes with the rank suffix SGLang's Mooncake
backend uses (``{hash}_{tp_rank}[_{pp_rank}]_k`` / ``_v``; MLA
``{hash}[_{pp_rank}]_k``, shared by all tensor-parallel ranks) under a
namespace of the model name. The store verifies each object's checksum
on get; a failed or short page is ``False`` in the result list, so
SGLang recomputes from there.

Against SGLang's real ``HiCacheStorage`` when ``sglang`` is importable;
otherwise a stand-in base with the same method names lets the module
import and be tested without SGLang.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .engine import Region
from .errors import ERR_EXISTS, OK, ExistsError, KvferryError
from .store import BATCH_MAX, Store

try:  # the real base class, when SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base

    HAVE_SGLANG = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_SGLANG = False

    class _Base:  # type: ignore[no-redef]
        """Stand-in for SGLang's HiCacheStorage (same method names)."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def clear(self) -> None:
            pass

        def get_stats(self) -> Any:
            return None


def _cfg(storage_config: Any, name: str, default: Any = None) -> Any:
    return getattr(storage_config, name, default) if storage_config is not None else default


class KvferryHiCacheStorage(_Base):
    """SGLang ``HiCacheStorage`` over a kvferry store."""

    def __init__(self, storage_config: Any = None, kwargs: Optional[Dict[str, Any]] = None,
                 store: Optional[Store] = None) -> None:
        extra = dict(_cfg(storage_config, "extra_config") or {})
        self.storage_config = storage_config
        self._own_store = store is None
        if store is None:
            tmo = extra.get("timeout_ms")
            store = Store.connect(extra.get("master"),
                                  timeout_ms=int(tmo) if tmo is not None else None)
        self.store = store
        self.replicas = int(extra.get("replicas", 0))
        self.is_mla = bool(_cfg(storage_config, "is_mla_model", False))
        tp, pp = _cfg(storage_config, "tp_rank", 0), _cfg(storage_config, "pp_rank", 0)
        pp_size = _cfg(storage_config, "pp_size", 1) or 1
        if self.is_mla:
            self.suffix = "_%d" % pp if pp_size > 1 else ""
        else:
            self.suffix = "_%d_%d" % (tp, pp) if pp_size > 1 else "_%d" % tp
        model = extra.get("namespace") or _cfg(storage_config, "model_name") or "model"
        self.prefix = "sgl/%s/" % str(model).replace("/", "_")
        self.mem_pool_host: Any = None
        self._regions: List[Region] = []
        self.stats = {"hits": 0, "misses": 0, "failed": 0, "sets": 0}

    # -- the host pool -----------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Keeps the pool and registers its buffers with the store's engine."""
        super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        for name in ("kv_buffer", "k_buffer", "v_buffer"):
            buf = getattr(mem_pool_host, name, None)
            if buf is None:
                continue
            for t in (buf if isinstance(buf, (list, tuple)) else [buf]):
                self._regions.append(self.store.register(t))

    def _span(self, ptr: int, n: int) -> Tuple[Region, int, int]:
        for r in self._regions:
            if r.addr <= ptr and ptr + n <= r.addr + r.nbytes:
                return (r, ptr - r.addr, n)
        raise ValueError("kvferry: page at %#x outside the registered host pool" % ptr)

    def _page_keys(self, keys: Sequence[str]) -> List[str]:
        parts = ("_k",) if self.is_mla else ("_k", "_v")
        return [self.prefix + k + self.suffix + p for k in keys for p in parts]

    def _meta(self, keys: Sequence[str], host_indices: Any) -> Tuple[List[str], List[Any], int]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        skeys = self._page_keys(keys)
        per = len(ptrs) // max(1, len(keys))
        if per * len(keys) != len(ptrs) or per != len(skeys) // max(1, len(keys)):
            # e.g. a layer-first MHA pool: one span per layer, not per page half
            raise ValueError("kvferry: use a page-first host layout "
                             "(--hicache-mem-layout page_first)")
        return skeys, [self._span(p, n) for p, n in zip(ptrs, sizes)], per

    # -- zero-copy batches -------------------------------------------------

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        if not keys:
            return []
        skeys, spans, per = self._meta(keys, host_indices)
        ok = [False] * len(skeys)
        step = BATCH_MAX - BATCH_MAX % per
        for a in range(0, len(skeys), step):
            try:
                lens = self.store.get_batch(skeys[a:a + step], spans[a:a + step], check=False)
            except KvferryError:
                break
            for i, n in enumerate(lens):
                ok[a + i] = n == spans[a + i][2]
        out = [all(ok[j * per:(j + 1) * per]) for j in range(len(keys))]
        hits = sum(out)
        self.stats["hits"] += hits
        self.stats["misses"] += len(keys) - hits
        return out

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        if not keys:
            return []
        skeys, spans, per = self._meta(keys, host_indices)
        ok = [False] * len(skeys)
        step = BATCH_MAX - BATCH_MAX % per
        for a in range(0, len(skeys), step):
            try:
                sts = self.store.put_batch(skeys[a:a + step], spans[a:a + step],
                                           replicas=self.replicas, check=False)
            except KvferryError:
                break
            for i, s in enumerate(sts):
                ok[a + i] = s in (OK, ERR_EXISTS)
        out = [all(ok[j * per:(j + 1) * per]) for j in range(len(keys))]
        self.stats["sets"] += sum(out)
        self.stats["failed"] += len(keys) - sum(out)
        return out

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Pages present (every part of each) from the first, consecutively."""
        if not keys:
            return 0
        per = 1 if self.is_mla else 2
        skeys = self._page_keys(keys)
        step = BATCH_MAX - BATCH_MAX % per
        found: List[bool] = []
        for a in range(0, len(skeys), step):
            try:
                found += self.store.exists_batch(skeys[a:a + step])
            except KvferryError:
                break
        n = 0
        for j in range(len(keys)):
            part = found[j * per:(j + 1) * per]
            if len(part) < per or not all(part):
                break
            n += 1
        return n

    # -- one key, and the older batch forms --------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Reads ``key`` (stored by :meth:`set`) into target_location (a
        tensor or writable buffer); returns it, or None when absent."""
        if target_location is None:
            return None
        try:
            self.store.get(self.prefix + key + self.suffix, target_location)
            self.stats["hits"] += 1
            return target_location
        except KvferryError:
            self.stats["misses"] += 1
            return None

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> List[Any]:
        locs = list(target_locations or [None] * len(keys))
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        data = value if value is not None else target_location
        if data is None:
            return False
        try:
            self.store.put(self.prefix + key + self.suffix, data, replicas=self.replicas)
        except ExistsError:
            pass
        except KvferryError:
            return False
        return True

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        vals = list(values if values is not None else (target_locations or []))
        if len(vals) != len(keys):
            return False
        return all([self.set(k, v) for k, v in zip(keys, vals)])

    def clear(self) -> None:
        """Removes this backend's keys (those under its namespace)."""
        keys = [e.key for e in self.store.list(prefix=self.prefix)]
        for a in range(0, len(keys), BATCH_MAX):
            self.store.remove_batch(keys[a:a + BATCH_MAX], check=False)

    def get_stats(self) -> Any:
        return dict(self.stats)

    def close(self) -> None:
        regions, self._regions = self._regions, []
        for r in regions:
            r.deregister()
        if self._own_store:
            self.store.close()


__all__ = ["KvferryHiCacheStorage", "HAVE_SGLANG"]
