"""The package's ctypes mirrors of the C API's structures against the C
headers: every field at the same offset with the same size, and the same
total size. A mirror that falls behind its header lets the library write
past the Python object (heap corruption that shows up much later), so
this compiles a small C program against include/ and compares.

Skips where no C compiler or no source tree is at hand (an installed
wheel tested elsewhere).
"""

import ctypes
import os
import shutil
import subprocess

import pytest

from kvferry import _lib, embedded, kv_gpu, store

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "include")

# ctypes class -> (C type, header)
MIRRORS = [
    (_lib.EngineParams, "kvf_engine_params_t", "kvferry/engine.h"),
    (_lib.Op, "kvf_op_t", "kvferry/engine.h"),
    (_lib.StoreParams, "kvf_store_params_t", "kvferry/store.h"),
    (_lib.PutOpts, "kvf_store_put_opts_t", "kvferry/store.h"),
    (_lib.StoreInfo, "kvf_store_info_t", "kvferry/store.h"),
    (_lib.StoreEntry, "kvf_store_entry_t", "kvferry/store.h"),
    (_lib.ConfigKey, "kvf_config_key_t", "kvferry/config.h"),
    (_lib.StoreTiming, "kvf_store_timing_t", "kvferry/perf.h"),
    (store._ViewC, "kvf_store_view_t", "kvferry/store.h"),
    (embedded._MasterParams, "kvf_server_master_params_t", "kvferry/server.h"),
    (embedded._NodeParams, "kvf_server_node_params_t", "kvferry/server.h"),
    (kv_gpu.GpuMem, "kvf_gpu_mem_t", "kvferry/gpu.h"),
]


def _c_layouts(tmp_path):
    """{C type: (sizeof, {field: (offset, size)})} from the headers."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not os.path.isdir(INCLUDE):
        pytest.skip("no C compiler or no include/ beside the tests")
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += sorted({"#include <%s>" % h for _, _, h in MIRRORS})
    lines.append("int main(void) {")
    for cls, ctype, _ in MIRRORS:
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (ctype, ctype))
        for name, _ in cls._fields_:
            lines.append('printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                         % (ctype, name, ctype, name, ctype, name))
    lines += ["return 0;", "}"]
    src, exe = tmp_path / "abi.c", tmp_path / "abi"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-I", INCLUDE, "-o", str(exe), str(src)], check=True)
    out = {}
    for ln in subprocess.run([str(exe)], check=True, capture_output=True,
                             text=True).stdout.splitlines():
        parts = ln.split()
        if "." in parts[0]:
            ctype, name = parts[0].split(".", 1)
            out[ctype][1][name] = (int(parts[1]), int(parts[2]))
        else:
            out[parts[0]] = (int(parts[1]), {})
    return out


def test_posts_constant_matches_the_header(tmp_path):
    """kv_gpu.POSTS mirrors KVF_GPU_POSTS (the pipelines' depth)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not os.path.isdir(INCLUDE):
        pytest.skip("no C compiler or no include/ beside the tests")
    src, exe = tmp_path / "posts.c", tmp_path / "posts"
    src.write_text('#include <stdio.h>\n#include <kvferry/gpu.h>\n'
                   'int main(void) { printf("%d\\n", KVF_GPU_POSTS); return 0; }\n')
    subprocess.run([cc, "-I", INCLUDE, "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert int(out) == kv_gpu.POSTS


def test_every_mirror_matches_its_header(tmp_path):
    layouts = _c_layouts(tmp_path)
    wrong = []
    for cls, ctype, _ in MIRRORS:
        size, fields = layouts[ctype]
        if ctypes.sizeof(cls) != size:
            wrong.append("%s: %d bytes, %s has %d" % (cls.__name__, ctypes.sizeof(cls), ctype,
                                                    size))
        for name, _ in cls._fields_:
            f = getattr(cls, name)
            if (f.offset, f.size) != fields[name]:
                wrong.append("%s.%s at %d (%d bytes), %s's at %d (%d bytes)"
                             % (cls.__name__, name, f.offset, f.size, ctype, *fields[name]))
    assert not wrong, "\n".join(wrong)
