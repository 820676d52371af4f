"""The Python examples of README.md and docs/python.md run as printed.

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

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "python.md"]
MARK = re.compile(r"<!-- example: (run(?: with st)?) -->\n```python\n(.*?)```", re.S)


def examples() -> List[Tuple[str, str, str]]:
    """(file name, kind, code) of each marked block, in the documents' order."""
    return [(doc.name, kind, code) for doc in DOCS if doc.exists()
            for kind, code in MARK.findall(doc.read_text())]


def test_examples_are_marked():
    if not all(doc.exists() for doc in DOCS):
        pytest.skip("the documents are not beside the tests")
    kinds = [(name, k) for name, k, _ in examples()]
    assert ("README.md", "run") in kinds and ("python.md", "run") in kinds, kinds
    assert ("python.md", "run with st") in kinds, kinds


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index):
    name, kind, code = examples()[index]
    scope = {"__name__": "docs_example_%d" % index}
    before = kvferry.alloc_stats()
    if kind == "run":
        exec(compile(code, "%s example %d" % (name, index), "exec"), scope)
    else:
        with Master() as m, Node(m.address, pool="64M"):
            with kvferry.Store.connect(m.address) as st:
                st.put("layer0/blk42", b"x" * 4096)
                st.put("layer0/blk43", b"y" * 8192)
                scope.update(st=st, kvferry=kvferry)
                exec(compile(code, "%s example %d" % (name, index), "exec"), scope)
    scope.clear()
    assert kvferry.alloc_stats() == before  # the example left nothing allocated
