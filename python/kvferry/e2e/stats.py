"""Summaries of a served trace: latency percentiles, throughput, goodput
at a TTFT SLO, tokens not computed and bytes read remotely.

Percentiles are nearest-rank (the value at rank ceil(q * n)): with a few
requests, P99 is the largest one, never an interpolation between two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile, q in [0, 100]; None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return s[min(k, len(s)) - 1]


@dataclass
class Served:
    """One request as the engine served it (times in seconds)."""

    rid: int
    prefix_len: int
    prompt_len: int
    arrival_s: float
    start_s: float
    first_token_s: float
    end_s: float
    itl_s: List[float]
    hit_tokens: int          # KV found in the cache (prefix chunks)
    loaded_tokens: int       # of those, loaded and used (0 when recomputed)
    decision: str            # "miss", "load", "recompute", "corrupt"
    bytes_remote: int = 0
    output: List[int] = field(default_factory=list)
    split: Dict[str, float] = field(default_factory=dict)  # query/read/verify/h2d/compute

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def service_ttft_s(self) -> float:
        """First token since the engine took the request (no queueing)."""
        return self.first_token_s - self.start_s


def summary(served: Sequence[Served], slo_s: float) -> Dict[str, float]:
    """The figures every record carries, by name."""
    n = len(served)
    ttft = [s.ttft_s for s in served]
    sttft = [s.service_ttft_s for s in served]
    itl = [x for s in served for x in s.itl_s]
    out: Dict[str, float] = {"requests": n}
    for name, xs in (("ttft", ttft), ("service_ttft", sttft), ("itl", itl)):
        for q in (50, 90, 99):
            v = percentile(xs, q)
            out["%s_p%d_s" % (name, q)] = float("nan") if v is None else v
    if n:
        t0 = min(s.arrival_s for s in served)
        span = max(s.end_s for s in served) - t0
        good = sum(1 for s in served if s.ttft_s <= slo_s)
        out["makespan_s"] = span
        out["throughput_req_s"] = n / span if span > 0 else float("nan")
        out["throughput_tok_s"] = (sum(len(s.output) for s in served) / span
                                   if span > 0 else float("nan"))
        out["goodput_req_s"] = good / span if span > 0 else float("nan")
        out["slo_met_fraction"] = good / n
    out["ttft_slo_s"] = slo_s
    out["prompt_tokens"] = sum(s.prompt_len for s in served)
    out["tokens_not_computed"] = sum(s.loaded_tokens for s in served)
    out["hit_tokens"] = sum(s.hit_tokens for s in served)
    out["bytes_remote"] = sum(s.bytes_remote for s in served)
    out["corrupt_misses"] = sum(1 for s in served if s.decision == "corrupt")
    out["recomputed_hits"] = sum(1 for s in served if s.decision == "recompute")
    return out


def cdf(xs: Sequence[float]) -> List[List[float]]:
    """[[value, fraction <= value], ...] for a CDF chart."""
    s = sorted(xs)
    n = len(s)
    return [[v, (i + 1) / n] for i, v in enumerate(s)]
