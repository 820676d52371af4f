"""``python -m kvferry ARGS...``: runs the bundled ``kvferry`` command."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from ._lib import binary_path


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
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
