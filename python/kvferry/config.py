"""Settings, read through the library's configuration tables.

``get(name)`` answers for a configuration key (``"transports"``,
``"gpu_sum"``: default < ``KVF_CONFIG`` file < ``KVF_<KEY>`` environment,
as the C library resolves it) and for the environment variables the
library lists that are not keys (``"KVFERRY_PYOPS"``,
``"KVFERRY_FIRST_SLICE"``: their value, or their default when unset).
Python code reads settings through it rather than ``os.environ``, so one
table (``kvferry config --all``, docs/config.md) names every setting,
its default and what it is for. Only the variables that locate the
library itself (``KVFERRY_LIB``, ``KVFERRY_BIN``) are read before it is
loaded; a variable asked for while no library can be loaded is read from
the environment with the default given.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from . import _lib


def get(name: str, default: Optional[str] = None) -> Optional[str]:
    """The effective value of a key or listed variable; ``default`` (None)
    when the library declares no such name."""
    try:
        lib = _lib.lib()
    except OSError:
        if name.startswith(("KVF_", "KVFERRY_")):
            return os.environ.get(name) or default
        raise
    if name.startswith(("KVF_", "KVFERRY")) and name.upper() == name:
        r = lib.kvf_config_var(name.encode())
    else:
        r = lib.kvf_config_get(name.encode())
    return default if r is None else r.decode()


def get_int(name: str, lo: int, hi: int) -> int:
    """get(name) as an integer in lo..hi; ValueError naming the setting."""
    text = get(name)
    try:
        n = int(text or "")
    except ValueError:
        n = lo - 1
    if not lo <= n <= hi:
        raise ValueError(f"{name}={text!r}: want an integer in {lo}..{hi}")
    return n


def keys() -> List[Dict[str, Any]]:
    """Every key the library declares (the RESP door's are the command's):
    component, name, value, default, help, group."""
    out: List[Dict[str, Any]] = []

    @_lib.CONFIG_KEY_FN
    def one(k, _arg):
        c = k.contents
        out.append({
            "component": c.component.decode(), "name": c.name.decode(),
            "value": c.value.decode() if c.value else "",
            "default": c.defval.decode(), "help": c.help.decode(),
            "group": {1: "user", 2: "tuning", 3: "debug"}.get(c.group, "?"),
        })

    _lib.lib().kvf_config_keys(one, None)
    return out
