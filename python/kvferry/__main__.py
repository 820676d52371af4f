"""``python -m kvferry ARGS...``: runs the bundled ``kvferry`` command,
except ``bench e2e`` (the Python end-to-end harness, which the C
command forwards here)."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from ._lib import binary_path


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if list(args[:2]) == ["bench", "e2e"]:
        from .e2e.cli import main as e2e_main
        return e2e_main(list(args[2:]))
    try:
        exe = binary_path()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe] + list(args))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
