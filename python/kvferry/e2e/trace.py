"""The load of an end-to-end run: requests with a shared or private
prefix, a suffix and a number of greedy output tokens, arriving by a
Poisson process. Everything follows from the seed (no global random
state), so two runs of one configuration see the same trace.

A request's prefix comes from the shared pool with probability
``sharing`` (0.0, 0.5, 0.9, ...), otherwise it is private (drawn for that
request alone). Pool prefixes and private ones take their length from
``prefix_lens`` (uniformly). Token ids are drawn from [0, vocab).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Optional, Sequence

SUFFIX = 256
OUTPUT = 32


@dataclass(frozen=True)
class Request:
    rid: int
    arrival_s: float     # since the start of the trace
    prefix_id: int       # >= 0: index in the shared pool; < 0: private
    prefix_len: int
    suffix_len: int
    out_tokens: int
    seed: int            # of this request's private tokens
    vocab: int

    @property
    def shared(self) -> bool:
        return self.prefix_id >= 0

    def prefix_tokens(self, pool_seed: int) -> List[int]:
        """The prefix's token ids (a pool prefix's are the same in every
        request that draws it)."""
        s = pool_seed * 1000003 + self.prefix_id if self.shared else self.seed * 7919 + 1
        r = random.Random(s)
        return [r.randrange(self.vocab) for _ in range(self.prefix_len)]

    def suffix_tokens(self) -> List[int]:
        r = random.Random(self.seed * 7919 + 2)
        return [r.randrange(self.vocab) for _ in range(self.suffix_len)]

    def tokens(self, pool_seed: int) -> List[int]:
        return self.prefix_tokens(pool_seed) + self.suffix_tokens()


@dataclass(frozen=True)
class Trace:
    requests: List[Request]
    rate: float
    sharing: float
    prefix_lens: List[int]
    pool_size: int
    seed: int
    vocab: int

    def describe(self) -> dict:
        n = len(self.requests)
        return {
            "requests": n, "arrival_rate_per_s": self.rate, "sharing": self.sharing,
            "prefix_lens": ",".join(str(p) for p in self.prefix_lens),
            "pool_size": self.pool_size, "seed": self.seed,
            "suffix": self.requests[0].suffix_len if n else SUFFIX,
            "output_tokens": self.requests[0].out_tokens if n else OUTPUT,
            "shared_requests": sum(1 for r in self.requests if r.shared),
        }


def parse_len(s: str) -> int:
    """"32K" -> 32768, "2048" -> 2048."""
    s = s.strip().upper()
    mult = 1
    if s.endswith("K"):
        mult, s = 1024, s[:-1]
    elif s.endswith("M"):
        mult, s = 1024 * 1024, s[:-1]
    return int(float(s) * mult)


def make_trace(n: int, rate: float, sharing: float, prefix_lens: Sequence[int],
               pool_size: int = 4, seed: int = 0, vocab: int = 128256,
               suffix: int = SUFFIX, out_tokens: int = OUTPUT,
               pool_lens: Optional[Sequence[int]] = None) -> Trace:
    """n requests at ``rate`` per second (Poisson; rate <= 0: all at 0).

    Pool prefix i has length ``pool_lens[i]`` when given, else one drawn
    from ``prefix_lens``."""
    if not 0.0 <= sharing <= 1.0:
        raise ValueError("sharing is a fraction in [0, 1]")
    if n < 0 or pool_size <= 0 or not prefix_lens:
        raise ValueError("n >= 0, pool_size > 0 and prefix lengths are needed")
    r = random.Random(seed)
    lens = list(pool_lens) if pool_lens else [r.choice(prefix_lens) for _ in range(pool_size)]
    t = 0.0
    out = []
    for i in range(n):
        if rate > 0:
            t += r.expovariate(rate)
        if r.random() < sharing:
            pid = r.randrange(len(lens))
            plen = lens[pid]
        else:
            pid, plen = -1 - i, r.choice(prefix_lens)
        out.append(Request(i, t, pid, plen, suffix, out_tokens, seed * 100003 + i, vocab))
    return Trace(out, rate, sharing, list(prefix_lens), len(lens), seed, vocab)
