# One single put by a new store client, for a debug log of its peer open:
# KVF_LOG_LEVEL=debug python3 peer_open.py (the package on PYTHONPATH).
import time, os
from kvferry import Store
from kvferry.procs import Master, Node
with Master("--lease", "50ms") as m, Node(m.address, pool="1G"):
    st = Store.connect(m.address)
    buf = bytearray(1 << 20); reg = st.register(buf)
    t = time.perf_counter(); st.put("k", (reg, 0, 32768)); print("put %.1f ms" % ((time.perf_counter() - t) * 1e3), flush=True)
    st.close()
