# Where a new store client's first batch spends its time: connect,
# register, one single put (opens the node's peer), then batches.
import sys, time
from kvferry import Store
from kvferry.procs import Master, Node
from kvferry.store import last_timing

size, n = 32 << 10, 4096
pool = sys.argv[1] if len(sys.argv) > 1 else "1G"
single_first = len(sys.argv) > 2 and sys.argv[2] == "single"

def ms(t):
    return "%.1f" % (t * 1e3)

def stages():
    t = last_timing()
    return "master %s transfer %s sums %s commit %s (sum %s)" % (
        ms(t.query), ms(t.transfer), ms(t.checksum), ms(t.commit), ms(sum(t)))

with Master("--lease", "50ms") as m, Node(m.address, pool=pool):
    for c in range(2):
        t0 = time.perf_counter()
        st = Store.connect(m.address)
        t1 = time.perf_counter()
        buf = bytearray(size * n)
        reg = st.register(buf)
        t2 = time.perf_counter()
        print("client %d: connect %s ms, register %d MiB %s ms" % (c, ms(t1 - t0), size * n >> 20, ms(t2 - t1)))
        spans = [(reg, i * size, size) for i in range(n)]
        if single_first:
            t = time.perf_counter()
            st.put("c%d/single" % c, (reg, 0, size))
            print("  single put %s ms: %s" % (ms(time.perf_counter() - t), stages()))
        for r in range(3):
            keys = ["c%d/r%d/%d" % (c, r, i) for i in range(n)]
            t = time.perf_counter()
            st.put_batch(keys, spans)
            tp = time.perf_counter() - t
            print("  batch %d put %s ms: %s" % (r, ms(tp), stages()))
            t = time.perf_counter()
            st.get_batch(keys, spans)
            tg = time.perf_counter() - t
            print("  batch %d get %s ms: %s" % (r, ms(tg), stages()))
            st.remove_batch(keys)
            time.sleep(0.06)
        t = time.perf_counter()
        reg.deregister()
        st.close()
        print("  deregister+close %s ms" % ms(time.perf_counter() - t))
