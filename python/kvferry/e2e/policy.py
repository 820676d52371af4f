"""Load or recompute: the break-even model of ``kvferry calc``, fed with
speeds measured in this run.

The formula is the one in tools/calc/calc.h (kvf_calc_load_s and
kvf_calc_recompute_s; the C library does not export them, so only the
formula is repeated here):

    load      = query + sync + net + h2d        (overlap: + max(net, h2d))
    net       = bytes / link,  h2d = bytes / h2d speed
    recompute = (2 x active params x tokens + attention FLOPs) / (TFLOPS x util)
    attention = layers x tokens^2 x q_heads x (qk_dim + v_dim)

Here "link" is the remote read speed measured on this run's loads (it
starts from a probe), "h2d" the measured host-to-device speed, and
TFLOPS x util is calibrated from a measured full prefill, so the policy
recomputes exactly when the measured link makes loading slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional


@dataclass
class Shape:
    layers: int
    kv_heads: int
    head_dim: int
    q_heads: int
    params_active: float
    bytes: float = 2.0

    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.bytes


def load_s(shape: Shape, tokens: float, link_gbs: float, h2d_gbs: float,
           query_s: float = 0.0, sync_s: float = 0.0, overlap: bool = False) -> float:
    """kvf_calc_load_s with one link and one GPU (tools/calc/calc.h)."""
    b = shape.kv_bytes_per_token() * tokens
    net = b / (link_gbs * 1e9) if link_gbs > 0 else 0.0
    h2d = b / (h2d_gbs * 1e9) if h2d_gbs > 0 else 0.0
    return query_s + sync_s + (max(net, h2d) if overlap else net + h2d)


def recompute_flops(shape: Shape, tokens: float, attention: bool = True) -> float:
    f = 2.0 * shape.params_active * tokens
    if attention:
        f += shape.layers * tokens * tokens * shape.q_heads * (2 * shape.head_dim)
    return f


def recompute_s(shape: Shape, tokens: float, flops_per_s: float, attention: bool = True) -> float:
    """kvf_calc_recompute_s with TFLOPS x util = flops_per_s."""
    return recompute_flops(shape, tokens, attention) / flops_per_s


def breakeven_tokens(shape: Shape, link_gbs: float, h2d_gbs: float, flops_per_s: float,
                     query_s: float = 0.0, overlap: bool = False,
                     max_tokens: int = 1 << 20) -> Optional[int]:
    """Shortest prefix from which loading wins (bisection over tokens;
    None when it never does up to max_tokens)."""
    def wins(t: float) -> bool:
        return load_s(shape, t, link_gbs, h2d_gbs, query_s, 0.0, overlap) < \
            recompute_s(shape, t, flops_per_s)
    if not wins(max_tokens):
        return None
    lo, hi = 0, max_tokens
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if wins(mid):
            hi = mid
        else:
            lo = mid
    return hi


class Policy:
    """mode "always" loads every hit, "never" recomputes every prefix,
    "calc" loads when the estimate says loading is faster."""

    def __init__(self, mode: str, shape: Shape, h2d_gbs: float, flops_per_s: float,
                 link_gbs: Optional[float] = None, query_s: float = 0.0,
                 overlap: bool = False, weight: float = 0.5):
        if mode not in ("always", "never", "calc"):
            raise ValueError("policy is always, never or calc")
        self.mode, self.shape, self.overlap = mode, shape, overlap
        self.h2d_gbs, self.flops_per_s = h2d_gbs, flops_per_s
        self.link_gbs, self.query_s, self.weight = link_gbs, query_s, weight

    def observe_link(self, nbytes: int, seconds: float) -> None:
        """A measured remote read: moves the link estimate (exponential
        average) so a link that slows down is noticed."""
        if nbytes <= 0 or seconds <= 0:
            return
        g = nbytes / seconds / 1e9
        self.link_gbs = g if self.link_gbs is None else \
            self.weight * g + (1 - self.weight) * self.link_gbs

    def estimate(self, tokens: int) -> Dict[str, float]:
        link = self.link_gbs if self.link_gbs is not None else 0.0
        ld = load_s(self.shape, tokens, link, self.h2d_gbs, self.query_s, 0.0, self.overlap)
        rc = recompute_s(self.shape, tokens, self.flops_per_s)
        return {"load_s": ld, "recompute_s": rc}

    def load(self, tokens: int) -> bool:
        if tokens <= 0 or self.mode == "never":
            return False
        if self.mode == "always":
            return True
        e = self.estimate(tokens)
        return e["load_s"] < e["recompute_s"]

    def breakeven(self) -> Optional[int]:
        link = self.link_gbs if self.link_gbs is not None else 0.0
        return breakeven_tokens(self.shape, link, self.h2d_gbs, self.flops_per_s,
                                self.query_s, self.overlap)
