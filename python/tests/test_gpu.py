"""GPU buffers (torch CUDA tensors) through the registered-buffer path.

Runs only where torch sees a GPU; skipped elsewhere.
"""

import os

import pytest

import kvferry

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def test_store_cuda_tensor(store):
    src = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros_like(src)
    rs, rd = store.register(src), store.register(dst)
    assert rs.is_gpu and rs.mem_type == kvferry.MEM_CUDA
    k = "gpu/" + os.urandom(8).hex()
    store.put(k, rs)
    assert store.get(k, rd) == src.numel()
    torch.cuda.synchronize()
    assert torch.equal(src, dst)
    assert store.get_bytes(k) == bytes(src.cpu().numpy())
    rs.deregister()
    rd.deregister()
    # unregistered CUDA tensor: registered for the call
    k2 = k + "b"
    store.put(k2, src)
    out = torch.zeros_like(src)
    assert store.get(k2, out) == src.numel()
    torch.cuda.synchronize()
    assert torch.equal(src, out)


def test_engine_read_into_cuda(engine, target):
    t = torch.zeros(64 * 8192, dtype=torch.uint8, device="cuda")
    r = engine.register(t)
    p = engine.open(target.segment)
    p.read_blocks(r, [i * 8192 for i in range(64)],
                  [target.pool_addr + i * 8192 for i in range(64)], 8192).result(30)
    torch.cuda.synchronize()
    host = bytearray(64 * 8192)
    h = engine.register(host)
    p.read([((h, 0), target.pool_addr, 64 * 8192)]).result(30)
    assert bytes(t.cpu().numpy()) == bytes(host)
    r.deregister()
    h.deregister()
