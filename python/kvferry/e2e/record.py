"""Records of end-to-end runs in the repository's record format
(docs/record.schema.json, ``kvferry-record/1``; seed 003 §5's template:
hypothesis, configuration with the load, results, gap to the estimate,
conclusion, not verified), one JSON + one Markdown + one raw data file
per configuration, named like the C benches' (``<UTC>-<slug>.json``), so
``kvferry report`` draws them.

The environment is ``kvferry bench env --json`` (the bundled command);
where that command cannot run, a minimal object naming the host.

Series that ``kvferry report`` draws for e2e records:
``TTFT CDF`` (x: TTFT in s, y: fraction of requests) and ``TTFT over
prefix`` (x: prefix tokens, y: TTFT in s), plus ``break-even`` (x: the
break-even prefix length, twice, y: 0 and the largest TTFT) when the
policy had one.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

SCHEMA = "kvferry-record/1"
CONCLUSIONS = ("holds", "does not hold", "holds under conditions")


def environment() -> Dict[str, Any]:
    try:
        from .._lib import binary_path
        out = subprocess.run([binary_path(), "bench", "env", "--json"], capture_output=True,
                             timeout=30, check=True).stdout
        env = json.loads(out)
        if isinstance(env, dict):
            return env
    except Exception:
        pass
    return {"host": socket.gethostname()}


def _num(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, float):
        return float("%.6g" % x)
    return x


def figure(name: str, value: Optional[float], unit: str, p50: Optional[float] = None,
           p99: Optional[float] = None) -> Dict[str, Any]:
    return {"name": name, "value": _num(value), "unit": unit, "p50": _num(p50), "p99": _num(p99)}


def series(name: str, x_label: str, y_label: str,
           points: Sequence[Sequence[float]]) -> Dict[str, Any]:
    return {"name": name, "x_label": x_label, "y_label": y_label,
            "points": [[_num(float(a)), _num(float(b))] for a, b in points]}


def make(name: str, hypothesis: str, configuration: Dict[str, Any],
         key_figures: List[Dict[str, Any]], series_: List[Dict[str, Any]],
         conclusion: str, conclusion_text: str, not_verified: List[str],
         estimate: Optional[Dict[str, Any]] = None, gap: Optional[Dict[str, Any]] = None,
         env: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A record object (the raw data file name is set by :func:`write`)."""
    if conclusion not in CONCLUSIONS:
        raise ValueError("conclusion is one of %s" % (CONCLUSIONS,))
    conf = {k: (_num(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))
            for k, v in configuration.items()}
    return {
        "schema": SCHEMA, "kind": "bench", "name": name,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "executor": "%s@%s" % (getpass.getuser(), socket.gethostname()),
        "environment": env if env is not None else environment(),
        "hypothesis": hypothesis, "configuration": conf,
        "results": {"raw_data": None, "key_figures": key_figures, "series": series_},
        "estimate": estimate, "gap": gap,
        "conclusion": conclusion, "conclusion_text": conclusion_text,
        "not_verified": list(not_verified),
    }


def _slug(name: str) -> str:
    s = "".join(c if c.isalnum() else "-" for c in name.lower())
    while "--" in s:
        s = s.replace("--", "-")
    return s.strip("-")


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


def markdown(rec: Dict[str, Any]) -> str:
    env = rec["environment"]
    lines = ["# %s" % rec["name"], "",
             "- **Experiment:** %s (%s, record %s)" % (rec["name"], rec["kind"], rec["schema"]),
             "- **Date / executor:** %s / %s" % (rec["date"], rec["executor"]), "",
             "## Environment", "", "| Item | Value |", "|---|---|"]
    for k in ("host", "os", "kernel", "cpu", "memory", "load_average", "gpus", "kvferry"):
        if k in env:
            lines.append("| %s | %s |" % (k, json.dumps(env[k])[:200].replace("|", "/")))
    lines += ["", "## Hypothesis", "", rec["hypothesis"], "", "## Configuration", "",
              "| Key | Value |", "|---|---|"]
    lines += ["| %s | %s |" % (k, _fmt(v)) for k, v in rec["configuration"].items()]
    res = rec["results"]
    lines += ["", "## Results", "", "Raw data: `%s`" % res["raw_data"], "", "### Key figures", "",
              "| Figure | Value | Unit | P50 | P99 |", "|---|---:|---|---:|---:|"]
    for f in res["key_figures"]:
        lines.append("| %s | %s | %s | %s | %s |" % (f["name"], _fmt(f["value"]), f["unit"],
                                                     _fmt(f["p50"]), _fmt(f["p99"])))
    for s in res["series"]:
        lines += ["", "### Series: %s" % s["name"], "",
                  "| %s | %s |" % (s["x_label"], s["y_label"]), "|---:|---:|"]
        lines += ["| %s | %s |" % (_fmt(a), _fmt(b)) for a, b in s["points"][:200]]
    lines += ["", "## Gap to the estimate", ""]
    if rec["estimate"]:
        e = rec["estimate"]
        lines.append("- Estimate: %s %s (%s)" % (_fmt(e["value"]), e["unit"], e["source"]))
    else:
        lines.append("- No estimate for this configuration")
    if rec["gap"]:
        lines.append("- Measured / estimate: %s — %s" % (_fmt(rec["gap"]["ratio"]),
                                                         rec["gap"]["explanation"]))
    lines += ["", "## Conclusion", "", "**%s** — %s" % (rec["conclusion"], rec["conclusion_text"]),
              "", "## Not verified, and next steps", ""]
    lines += ["- %s" % t for t in rec["not_verified"]] or ["- nothing listed"]
    return "\n".join(lines) + "\n"


def write(rec: Dict[str, Any], outdir: str, raw: Any = None) -> Tuple[str, str]:
    """Writes <UTC>-<slug>.json, .md and (with raw) .data.json in outdir
    without overwriting anything; returns the JSON and Markdown paths."""
    os.makedirs(outdir, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = "%s-%s" % (stamp, _slug(rec["name"]))
    n = 1
    while True:
        stem = os.path.join(outdir, base if n == 1 else "%s-%d" % (base, n))
        try:
            fd = os.open(stem + ".json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            n += 1
    if raw is not None:
        rec["results"]["raw_data"] = os.path.basename(stem) + ".data.json"
        with open(stem + ".data.json", "w") as f:
            json.dump(raw, f, default=_num)
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown(rec))
    return stem + ".json", stem + ".md"
