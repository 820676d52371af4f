"""LMCache remote connector plugin: LMCache's chunks in the kvferry store.

LMCache (non-MP mode) loads it from its configuration::

    remote_url: "plugin://kvferry"
    remote_serde: "naive"
    remote_storage_plugins: ["kvferry"]
    extra_config:
      remote_storage_plugin.kvferry.module_path: kvferry.lmcache
      remote_storage_plugin.kvferry.class_name: KvferryConnector
      kvferry.master: "127.0.0.1:7700"      # else config key "master"
      kvferry.timeout_ms: 5000              # optional
      kvferry.replicas: 1                   # optional

LMCache's ``ConnectorManager`` imports the module, sees a
``RemoteConnector`` subclass and builds it with ``loop``,
``local_cpu_backend`` and ``config`` (``DynamicConnectorAdapter``). One
LMCache chunk (all layers, KV_2LTD or MLA format) is one store object
under LMCache's own key string (model, world size, worker, chunk hash,
dtype), read straight into the memory object LMCache allocates and
written straight from it. The store checks every object's checksum on
get; a mismatch, a missing key or a dead node is a miss (``None``),
counted in :attr:`KvferryConnector.stats`, never an exception, so LMCache
recomputes.

Against the real class when ``lmcache`` is importable; otherwise the
class derives from a stand-in with the same methods so that the module
imports (and its logic can be tested) without LMCache and torch.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, List, Optional

from .errors import ExistsError, KvferryError, NoKeyError
from .store import BATCH_MAX, Store

try:  # the real base class, when LMCache is installed
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _Base

    HAVE_LMCACHE = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_LMCACHE = False

    class _Base:  # type: ignore[no-redef]
        """Stand-in for LMCache's RemoteConnector (same method names)."""

        def __init__(self, config: Any, metadata: Any) -> None:
            self.config = config

        def post_init(self) -> None:
            pass

        def reshape_partial_chunk(self, memory_obj: Any, bytes_read: int) -> Any:
            return memory_obj


def _extra(config: Any) -> Dict[str, Any]:
    extra = getattr(config, "extra_config", None)
    return dict(extra) if extra else {}


class KvferryConnector(_Base):
    """LMCache ``RemoteConnector`` over a kvferry store."""

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None,
                 local_cpu_backend: Any = None, config: Any = None,
                 store: Optional[Store] = None) -> None:
        if config is None and local_cpu_backend is not None:
            config = local_cpu_backend.config
        metadata = getattr(local_cpu_backend, "metadata", None)
        if HAVE_LMCACHE:
            super().__init__(config, metadata)
        else:
            super().__init__(config, metadata)
            self.meta_shapes = getattr(metadata, "shapes", None)
            self.meta_dtypes = getattr(metadata, "dtypes", None)
            self.meta_fmt = None
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        extra = _extra(config)
        self.replicas = int(extra.get("kvferry.replicas", 0))
        self._own_store = store is None
        if store is None:
            tmo = extra.get("kvferry.timeout_ms")
            store = Store.connect(extra.get("kvferry.master"),
                                  timeout_ms=int(tmo) if tmo is not None else None)
        self.store = store
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0, "corrupt_misses": 0, "errors": 0, "puts": 0}

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.stats[what] += n

    async def _run(self, fn: Any, *args: Any) -> Any:
        # the store's calls release the GIL: run them off the event loop
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, fn, *args)

    @staticmethod
    def _key(key: Any) -> str:
        return key.to_string() if hasattr(key, "to_string") else str(key)

    @staticmethod
    def _view(memory_obj: Any) -> memoryview:
        b = memory_obj.byte_array
        return b if isinstance(b, memoryview) else memoryview(b)

    def _allocate(self) -> Any:
        return self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)

    # -- exists ------------------------------------------------------------

    def exists_sync(self, key: Any) -> bool:
        try:
            return self.store.exists(self._key(key))
        except KvferryError:
            self._count("errors")
            return False

    async def exists(self, key: Any) -> bool:
        return await self._run(self.exists_sync, key)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[Any]) -> int:
        """Consecutive keys present from the first."""
        n = 0
        for i in range(0, len(keys), BATCH_MAX):
            try:
                found = self.store.exists_batch([self._key(k) for k in keys[i:i + BATCH_MAX]])
            except KvferryError:
                self._count("errors")
                return n
            for f in found:
                if not f:
                    return n
                n += 1
        return n

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[Any],
                                     pin: bool = False) -> int:
        return await self._run(self.batched_contains, keys)

    # -- get ---------------------------------------------------------------

    def _get_sync(self, key: Any) -> Any:
        memory_obj = self._allocate()
        if memory_obj is None:
            return None
        try:
            n = self.store.get(self._key(key), self._view(memory_obj))
            memory_obj = self.reshape_partial_chunk(memory_obj, n)
            self._count("hits")
            return memory_obj
        except Exception as e:
            memory_obj.ref_count_down()
            self._miss(e)
            return None

    def _miss(self, e: BaseException) -> None:
        if isinstance(e, NoKeyError):
            self._count("misses")
        elif isinstance(e, KvferryError) and e.name in ("KVF_ERR_CHECKSUM", "KVF_ERR_SHORT_DATA"):
            self._count("corrupt_misses")
        else:
            self._count("errors")

    async def get(self, key: Any) -> Any:
        return await self._run(self._get_sync, key)

    def support_batched_get(self) -> bool:
        return True

    def _batched_get_sync(self, keys: List[Any]) -> List[Any]:
        out: List[Any] = []
        for i in range(0, len(keys), BATCH_MAX):
            out += self._get_slice(keys[i:i + BATCH_MAX])
        return out

    def _get_slice(self, keys: List[Any]) -> List[Any]:
        objs = [self._allocate() for _ in keys]
        live = [i for i, o in enumerate(objs) if o is not None]
        out: List[Any] = [None] * len(keys)
        if not live:
            return out
        try:
            lens = self.store.get_batch([self._key(keys[i]) for i in live],
                                        [self._view(objs[i]) for i in live], check=False)
        except KvferryError as e:
            for i in live:
                objs[i].ref_count_down()
            self._miss(e)
            return out
        for j, i in enumerate(live):
            n = lens[j]
            if n > 0:
                try:
                    out[i] = self.reshape_partial_chunk(objs[i], n)
                    self._count("hits")
                    continue
                except ValueError:
                    n = -81
            objs[i].ref_count_down()
            if n == -60:
                self._count("misses")
            elif n in (-80, -81):
                self._count("corrupt_misses")
            else:
                self._count("errors")
        return out

    async def batched_get(self, keys: List[Any]) -> List[Any]:
        return await self._run(self._batched_get_sync, keys)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any]) -> List[Any]:
        objs = await self.batched_get(keys)
        out = []
        for i, o in enumerate(objs):
            if o is None:
                for rest in objs[i + 1:]:
                    if rest is not None:
                        rest.ref_count_down()
                break
            out.append(o)
        return out

    # -- put ---------------------------------------------------------------

    def _put_sync(self, key: Any, memory_obj: Any) -> None:
        # the caller owns memory_obj's reference and drops it after us
        try:
            self.store.put(self._key(key), self._view(memory_obj), replicas=self.replicas)
            self._count("puts")
        except ExistsError:
            pass
        except KvferryError:
            self._count("errors")

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self._run(self._put_sync, key, memory_obj)

    def support_batched_put(self) -> bool:
        return True

    def _batched_put_sync(self, keys: List[Any], memory_objs: List[Any]) -> None:
        for i in range(0, len(keys), BATCH_MAX):
            ks = [self._key(k) for k in keys[i:i + BATCH_MAX]]
            vs = [self._view(o) for o in memory_objs[i:i + BATCH_MAX]]
            try:
                sts = self.store.put_batch(ks, vs, replicas=self.replicas, check=False)
            except KvferryError:
                self._count("errors")
                continue
            self._count("puts", sum(1 for s in sts if s == 0))
            self._count("errors", sum(1 for s in sts if s not in (0, -10)))

    async def batched_put(self, keys: List[Any], memory_objs: List[Any]) -> None:
        await self._run(self._batched_put_sync, keys, memory_objs)

    # -- the rest ----------------------------------------------------------

    def remove_sync(self, key: Any) -> bool:
        try:
            self.store.remove(self._key(key))
            return True
        except KvferryError:
            return False

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        def _ping() -> int:
            try:
                self.store.exists("kvferry/ping")
                return 0
            except KvferryError as e:
                return e.code
        return await self._run(_ping)

    async def list(self) -> List[str]:
        return [e.key for e in await self._run(self.store.list)]

    async def close(self) -> None:
        if self._own_store:
            self.store.close()

    def __repr__(self) -> str:
        return "<KvferryConnector master=%s>" % (self.store.master,)


__all__ = ["KvferryConnector", "HAVE_LMCACHE"]
