"""The Python examples of docs/python.md run as printed.

A code block preceded by ``<!-- example: run -->`` runs on its own (it
starts the daemons it needs); one preceded by ``<!-- example: run with
st -->`` runs with ``st``, a store client of a fresh master and node
holding the keys the examples read (and ``kvferry`` imported, as the
document's first example does). The examples assert what their
comments promise, so a changed API or result fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

import pytest

import kvferry
from kvferry.procs import Master, Node

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
MARK = re.compile(r"<!-- example: (run(?: with st)?) -->\n```python\n(.*?)```", re.S)


def examples() -> List[Tuple[str, str]]:
    """(kind, code) of each marked block, in the document's order."""
    if not DOC.exists():  # an installed package without the repository
        return []
    return MARK.findall(DOC.read_text())


def test_examples_are_marked():
    if not DOC.exists():
        pytest.skip("docs/python.md not beside the tests")
    kinds = [k for k, _ in examples()]
    assert kinds.count("run") >= 1 and kinds.count("run with st") >= 1, kinds


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index):
    kind, code = examples()[index]
    scope = {"__name__": "docs_example_%d" % index}
    before = kvferry.alloc_stats()
    if kind == "run":
        exec(compile(code, "%s example %d" % (DOC.name, index), "exec"), scope)
    else:
        with Master() as m, Node(m.address, pool="64M"):
            with kvferry.Store.connect(m.address) as st:
                st.put("layer0/blk42", b"x" * 4096)
                st.put("layer0/blk43", b"y" * 8192)
                scope.update(st=st, kvferry=kvferry)
                exec(compile(code, "%s example %d" % (DOC.name, index), "exec"), scope)
    scope.clear()
    assert kvferry.alloc_stats() == before  # the example left nothing allocated
