"""``kvferry bench e2e``: the whole comparison with one command.

For each sharing rate, a trace (same seed for every configuration) is
served under each cache configuration (none, local, remote over shm and
tcp, GPU-resident), with the KV load overlapped with compute and, for
local and remote-shm, also sequential; with ``--throttle-ms`` the remote
tcp store is reached through kvferry's fault transport (a slow link) and
served with the policies always / never / calc. A record is written after
each configuration (so a run cut short still leaves data), then the
correctness check runs in deterministic mode on a few requests of each
caching configuration. Timing runs use the default (non-deterministic)
kernels; the check sets ``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from . import caches, correctness, record, stats
from .policy import Policy
from .trace import make_trace, parse_len


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvferry bench e2e", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--model", default="8b", help="shape (8b, 1b, tiny) or a checkpoint folder (default 8b)")
    a("--device", default=None, help="cuda or cpu (default: cuda when present)")
    a("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    a("--caches", default="none,local,remote-shm,remote-tcp,gpu")
    a("--sharing", default="0,0.5,0.9", help="fractions of requests with a pool prefix")
    a("--prefix-lens", default="1K,2K,8K,32K", help="prefix lengths (tokens), drawn uniformly")
    a("--pool-lens", default=None, help="lengths of the pool's prefixes (default: drawn)")
    a("--pool-size", type=int, default=4)
    a("--requests", type=int, default=16)
    a("--rate", type=float, default=1.0, help="Poisson arrivals per second (0: back to back)")
    a("--suffix", type=int, default=256)
    a("--output", type=int, default=32)
    a("--seed", type=int, default=0)
    a("--sequential", default="local,remote-shm",
      help="configurations also run with the load before the compute")
    a("--policy", default="always", help="always, calc or never for the main runs")
    a("--throttle-gbs", type=float, default=0.0,
      help="also run remote-tcp slowed to about this many GB/s by the fault transport, "
           "with the policies always, never and calc")
    a("--gpu-sum", default=None,
      help="checksum modes of the GPU loads, comma-separated (auto, fused, after, engines; "
           "default: KVF_GPU_SUM or auto); with several, each caching configuration runs once "
           "per mode")
    a("--chunk-tokens", type=int, default=0,
      help="tokens per chunk object of the remote tiers, a multiple of 256 (default 1024)")
    a("--layer-groups", default="",
      help="layer groups of the remote tiers' chunk objects: a hit loads group by group and "
           "layer l waits for its own group (default 8); with several, comma-separated, each "
           "remote configuration runs once per count")
    a("--slo", type=float, default=1.0, help="TTFT SLO for goodput, seconds")
    a("--host-pool", default="8G", help="local cache (and GPU-resident) capacity")
    a("--node-pool", default="8G", help="the remote store node's pool")
    a("--check", type=int, default=4, help="requests per configuration in the check (0: none)")
    a("--check-only", action="store_true", help="only the correctness check (no timing runs)")
    a("--budget", type=float, default=0.0, help="seconds for the whole run (0: no limit)")
    a("--record", default=None, help="write records into this folder")
    a("--json", default=None, help="write the summaries as JSON here")
    return p


def _calibrate(info: Any, length: int) -> Dict[str, float]:
    """Measured host-to-device speed and prefill FLOP rate (warm-up)."""
    import torch
    from transformers import DynamicCache
    dev = info.device
    n = 64 << 20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        dst.copy_(host, non_blocking=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t)
    ids = torch.randint(0, info.vocab, (1, length), device=dev)
    dt = float("inf")
    with torch.no_grad():
        for _ in range(2):
            t = time.perf_counter()
            info.model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True,
                       logits_to_keep=1)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dt = min(dt, time.perf_counter() - t)
    from .policy import recompute_flops
    return {"h2d_gbs": n / best / 1e9, "flops_per_s": recompute_flops(info.shape(), length) / dt,
            "calib_tokens": length, "calib_prefill_s": dt}


class Run:
    """One invocation: the model, the calibration, what was written."""

    def __init__(self, args: argparse.Namespace, info: Any, calib: Dict[str, float]):
        self.args, self.info, self.calib = args, info, calib
        self.summaries: List[Dict[str, Any]] = []
        self.gpu_sum = ""
        self.groups = 0  # the remote tiers' layer groups of this configuration (0: default)
        self.group_counts = _group_counts(args.layer_groups)
        self.throttled: Dict[str, float] = {}  # policy -> mean service TTFT
        self.baseline: Dict[float, Dict[int, float]] = {}  # sharing -> prefix -> TTFT P50
        self.env = record.environment() if args.record else {}
        self.t_end = time.perf_counter() + args.budget if args.budget > 0 else None
        plens = [parse_len(x) for x in args.prefix_lens.split(",")]
        self.max_tokens = max(plens + ([parse_len(x) for x in args.pool_lens.split(",")]
                                       if args.pool_lens else []))

    def trace(self, sharing: float):
        a = self.args
        pool = [parse_len(x) for x in a.pool_lens.split(",")] if a.pool_lens else None
        return make_trace(a.requests, a.rate, sharing, [parse_len(x) for x in a.prefix_lens.split(",")],
                          a.pool_size, a.seed, self.info.vocab, a.suffix, a.output, pool)

    def policy(self, mode: str, tier: Any, overlap: bool) -> Policy:
        link = tier.probe_gbs() if getattr(tier, "remote", False) else None
        if link is None and tier.name == "local":
            link = 0.0  # no network: load = verify + H2D
        return Policy(mode, self.info.shape(), self.calib["h2d_gbs"], self.calib["flops_per_s"],
                      link, overlap=overlap)

    def tier(self, name: str) -> Any:
        a = self.args
        return caches.make(name, self.info, self.max_tokens, caches._size(a.host_pool), a.node_pool,
                           a.throttle_gbs, a.chunk_tokens, self.groups)

    def one(self, cache: str, sharing: float, overlap: bool, mode: str,
            gpu_sum: str = "", groups: int = 0) -> Optional[Dict]:
        from .engine import Engine
        if gpu_sum:
            from .. import kv_gpu

            kv_gpu.set_sum_mode(gpu_sum)  # for the tier's GPU copiers
        self.gpu_sum = gpu_sum
        self.groups = groups or (self.group_counts[:1] or [0])[0]
        if self.t_end is not None and time.perf_counter() > self.t_end:
            print("e2e: budget spent, skipping %s" % cache, file=sys.stderr)
            return None
        tr = self.trace(sharing)
        tier = self.tier(cache)
        try:
            pol = self.policy(mode, tier, overlap)
            link0 = pol.link_gbs
            eng = Engine(self.info, tier, pol, overlap, self.args.seed)
            served = eng.serve(tr.requests, self.t_end)
            desc = tier.describe()
        finally:
            tier.close()
        return self.report(cache, sharing, overlap, mode, tr, served, pol, link0, desc)

    def report(self, cache, sharing, overlap, mode, tr, served, pol, link0, desc) -> Dict:
        a = self.args
        summ = stats.summary(served, a.slo)
        sweep = cache.startswith("remote") and len(self.group_counts) > 1
        label = "%s share%d %s%s%s%s" % (cache, round(sharing * 100),
                                         "overlap" if overlap else "sequential",
                                         "" if mode == "always" else " policy-" + mode,
                                         " groups%d" % self.groups if sweep else "",
                                         " sum-" + self.gpu_sum if self.gpu_sum else "")
        by_len: Dict[int, List[float]] = {}
        for s in served:
            if cache == "none" or s.decision == "load":
                by_len.setdefault(s.prefix_len, []).append(s.service_ttft_s)
        med = {p: stats.percentile(v, 50) for p, v in by_len.items()}
        if cache == "none":
            self.baseline[sharing] = med
        base = self.baseline.get(sharing, {})
        speed = {p: base[p] / med[p] for p in med if p in base and med[p]}
        summ.update({"config": label, "cache": cache, "sharing": sharing, "overlap": overlap,
                     "policy": mode, "link_gbs_start": link0, "link_gbs_end": pol.link_gbs,
                     "breakeven_tokens": pol.breakeven() if cache != "none" else None,
                     "speedup_by_prefix": speed, "service_ttft_p50_by_prefix": med})
        summ["load_split_s"] = _mean_split(served)
        summ.update(_verified_speed(served, self.info, self.calib.get("h2d_gbs", 0.0)))
        if "throttled" in cache and served:
            self.throttled[mode] = sum(x.service_ttft_s for x in served) / len(served)
            summ["mean_service_ttft_s"] = self.throttled[mode]
            if mode == "calc" and "always" in self.throttled and "never" in self.throttled:
                best = min(self.throttled["always"], self.throttled["never"])
                summ["policy_vs_best"] = self.throttled["calc"] / best
        self.summaries.append(summ)
        _print(summ)
        if a.record:
            rec = _record(self, label, summ, tr, served, pol, desc, speed)
            record.write(rec, a.record, {"summary": summ, "requests": [s.__dict__ for s in served]})
        return summ


def _verified_speed(served: List[Any], info: Any, h2d_gbs: float) -> Dict[str, float]:
    """GPU tiers: the verifying scatter's speed over the loads of the
    largest loaded prefix (bytes over the kernel's time, checksums
    included) and its fraction of the H2D ceiling measured in this run."""
    loads = [s for s in served if s.decision == "load" and "kv_h2d_verify" in s.split]
    if not loads:
        return {}
    top = max(s.loaded_tokens for s in loads)
    loads = [s for s in loads if s.loaded_tokens == top]
    t = sum(s.split["kv_h2d_verify"] for s in loads) / len(loads)
    if t <= 0:
        return {}
    gbs = top * info.kv_bytes_per_token() / t / 1e9
    return {"verified_load_tokens": top, "verified_load_gbs": gbs,
            "verified_load_vs_h2d": gbs / h2d_gbs if h2d_gbs else 0.0}


def _load_s(split: Dict[str, float]) -> float:
    """A load's time from its split: the stages other than compute; a
    sequential GPU load's wall time ("h2d") already holds its kv_* stages."""
    wall = "h2d" in split
    return sum(v for k, v in split.items()
               if k != "compute" and not (wall and k.startswith("kv_")))


def _mean_split(served: List[Any]) -> Dict[str, float]:
    loads = [s for s in served if s.decision == "load"]
    keys = sorted({k for s in loads for k in s.split})
    return {k: sum(s.split.get(k, 0.0) for s in loads) / len(loads) for k in keys} if loads else {}


def _print(s: Dict[str, Any]) -> None:
    sp = " ".join("%dK:%.1fx" % (p // 1024, v) for p, v in sorted(s["speedup_by_prefix"].items()))
    print("%-40s ttft p50 %.3f p99 %.3f s  itl p50 %.4f s  not computed %d  remote %.1f MB  %s"
          % (s["config"], s["ttft_p50_s"], s["ttft_p99_s"], s["itl_p50_s"],
             s["tokens_not_computed"], s["bytes_remote"] / 1e6, sp), flush=True)


def _hypothesis(cache: str, largest: int, mode: str = "always") -> str:
    if "throttled" in cache:
        return ("on a link slowed to about the throttle speed, the calc policy's mean TTFT is "
                "within 10 %% of the better of always loading and always recomputing (this "
                "record: policy %s)" % mode)
    if cache == "none":
        return ("full prefill's TTFT grows with the prefix: the cost the caches remove "
                "(baseline; its median at each length is the speed-ups' reference)")
    target = {"local": 12, "remote-shm": 10, "remote-tcp": 10, "gpu": 12}.get(cache, 10)
    return ("serving a %d-token shared prefix from the %s cache makes the first token >= %dx "
            "faster than recomputing it" % (largest, cache, target))


def _record(run: Run, label: str, summ: Dict, tr: Any, served: List[Any], pol: Policy,
            desc: Dict, speed: Dict[int, float]) -> Dict[str, Any]:
    a, cache = run.args, summ["cache"]
    conf = dict(tr.describe())
    conf.update({"model": run.info.name, "dtype": str(run.info.dtype), "device": str(run.info.device),
                 "overlap": str(summ["overlap"]), "policy": summ["policy"],
                 "gpu_checksum_mode": _sum_mode_name(),
                 "deterministic": "off (timing run)", "ttft_slo_s": a.slo,
                 "h2d_gbs_measured": run.calib["h2d_gbs"],
                 "prefill_tflops_measured": run.calib["flops_per_s"] / 1e12,
                 "link_gbs_measured": summ["link_gbs_end"]})
    conf.update(desc)
    f = record.figure
    figs = [f("TTFT", summ["ttft_p50_s"], "s", summ["ttft_p50_s"], summ["ttft_p99_s"]),
            f("TTFT P90", summ["ttft_p90_s"], "s"),
            f("service TTFT (no queueing)", summ["service_ttft_p50_s"], "s",
              summ["service_ttft_p50_s"], summ["service_ttft_p99_s"]),
            f("ITL", summ["itl_p50_s"], "s", summ["itl_p50_s"], summ["itl_p99_s"]),
            f("ITL P90", summ["itl_p90_s"], "s"),
            f("throughput", summ.get("throughput_tok_s"), "tokens/s"),
            f("throughput (requests)", summ.get("throughput_req_s"), "requests/s"),
            f("goodput at TTFT <= %g s" % a.slo, summ.get("goodput_req_s"), "requests/s"),
            f("tokens not computed", summ["tokens_not_computed"], "tokens"),
            f("bytes read remotely", summ["bytes_remote"], "bytes"),
            f("corrupted chunks refused", summ["corrupt_misses"], "requests"),
            f("hits recomputed by the policy", summ["recomputed_hits"], "requests")]
    for k, v in summ["load_split_s"].items():
        figs.append(f("load split: %s (mean of loads)" % k, v, "s"))
    if "verified_load_gbs" in summ:
        n = summ["verified_load_tokens"]
        figs.append(f("verified load speed at %d tokens (scatter kernel)" % n,
                      summ["verified_load_gbs"], "GB/s"))
        figs.append(f("verified load over the H2D ceiling at %d tokens" % n,
                      summ["verified_load_vs_h2d"], "ratio"))
    for p, v in sorted(speed.items()):
        figs.append(f("speed-up of service TTFT at %d tokens" % p, v, "x"))
    ttfts = [s.ttft_s for s in served]
    ser = [record.series("TTFT CDF", "TTFT (s)", "fraction of requests", stats.cdf(ttfts)),
           record.series("TTFT over prefix", "prefix tokens", "TTFT (s)",
                         sorted([s.prefix_len, s.service_ttft_s] for s in served))]
    be = summ["breakeven_tokens"]
    if be and ttfts:
        ser.append(record.series("break-even", "prefix tokens", "TTFT (s)",
                                 [[be, 0.0], [be, max(ttfts)]]))
    largest = max((s.prefix_len for s in served), default=0)
    est = gap = None
    loads = [s for s in served if s.decision == "load" and s.prefix_len == largest]
    if cache != "none" and loads:
        e = pol.estimate(loads[0].loaded_tokens)
        est = {"value": record._num(e["load_s"]), "unit": "s",
               "source": "kvferry calc's load time for %d tokens with the measured link %.3g GB/s "
                         "and H2D %.3g GB/s" % (loads[0].loaded_tokens, pol.link_gbs or 0,
                                               pol.h2d_gbs)}
        meas = sum(_load_s(s.split) for s in loads) / len(loads)
        gap = {"ratio": record._num(meas / e["load_s"]) if e["load_s"] else None,
               "explanation": "measured query + read + verify + H2D (sequential) of the largest "
                              "prefix over calc's estimate; on CPU the verify stage (CPU "
                              "checksum) and per-chunk calls are not in calc's model; on a GPU "
                              "(kv_* stages) verification is inside the scatter kernel and the "
                              "overlapped load is one call per layer"}
    concl, why = _conclusion(cache, speed, largest, summ)
    if "throttled" in cache:
        r = summ.get("policy_vs_best")
        if r is None:
            concl, why = "holds under conditions", (
                "policy %s: mean service TTFT %.3f s; the calc policy's record compares"
                % (summ["policy"], summ.get("mean_service_ttft_s", float("nan"))))
        else:
            concl = "holds" if r <= 1.1 else "does not hold"
            why = ("calc policy's mean service TTFT is %.2fx the better of always (%.3f s) and "
                   "never (%.3f s)" % (r, run.throttled["always"], run.throttled["never"]))
    nv = ["cross-host links: master, node and client share one host",
          "greedy equality and bitwise logits are checked by the separate check records"]
    if len(served) < len(tr.requests):
        nv.append("%d of %d requests served before the budget ran out"
                  % (len(served), len(tr.requests)))
    return record.make("bench e2e " + label, _hypothesis(cache, largest, summ["policy"]), conf, figs, ser,
                       concl, why, nv, est, gap, env=run.env)


def _conclusion(cache: str, speed: Dict[int, float], largest: int, summ: Dict):
    if cache == "none":
        return "holds", "baseline for %d requests" % summ["requests"]
    target = {"local": 12, "gpu": 12}.get(cache, 10)
    if largest not in speed:
        return ("holds under conditions",
                "no request of %d tokens loaded its prefix (or no baseline): nothing to compare"
                % largest)
    v = speed[largest]
    return ("holds" if v >= target else "does not hold",
            "median service TTFT at %d tokens is %.2fx faster than full prefill (target %dx)"
            % (largest, v, target))


def _check(run: Run, cache: str) -> Optional[Dict[str, Any]]:
    """The deterministic check of one caching configuration."""
    from .engine import Engine
    a = run.args
    correctness.deterministic(True)
    run.groups = (run.group_counts[:1] or [0])[0]
    tr = run.trace(0.9)
    reqs = tr.requests[: 2 * max(a.check, 1)]
    tier = run.tier(cache)
    try:
        eng = Engine(run.info, tier, Policy("always", run.info.shape(), 1, 1), True, a.seed,
                     keep_logits=True, realtime=False)
        served = eng.serve(reqs)
        res = correctness.check(eng, tr, served)
        res.update({"corrupt_" + k: v for k, v in correctness.corrupted(eng, tr, served).items()})
    finally:
        tier.close()
        correctness.deterministic(False)
    ok = (res["bitwise_equal"] == res["checked"] and res["greedy_equal"] == res["checked"]
          and res["corrupt_accepted"] == 0 and res["corrupt_output_changed"] == 0)
    res.update({"config": "check " + cache, "ok": ok})
    print("%-40s %s" % ("check " + cache, json.dumps(res)), flush=True)
    if a.record:
        f = record.figure
        figs = [f("cache hits checked", res["checked"], "requests"),
                f("bitwise-equal first-token logits", res["bitwise_equal"], "requests"),
                f("identical greedy outputs", res["greedy_equal"], "requests"),
                f("single-shot vs split max |dlogit|", res["single_shot_max_abs"], "logit"),
                f("single-shot within tolerance", res["single_shot_within_tol"], "requests"),
                f("corrupted chunks injected", res["corrupt_injected"], "chunks"),
                f("corrupted chunks caught", res["corrupt_caught"], "chunks"),
                f("corrupted chunks accepted", res["corrupt_accepted"], "chunks"),
                f("outputs changed by corruption", res["corrupt_output_changed"], "requests")]
        conf = {"model": run.info.name, "dtype": str(run.info.dtype), "cache": cache,
                "deterministic": "on (use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=%s)"
                % os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
                "requests": len(served), "sharing": 0.9, "tolerance_single_shot": res["tolerance"]}
        why = ("%d/%d cache hits bitwise-equal and greedy-identical to recompute; %d corrupted "
               "chunks injected, %d caught, %d accepted, %d outputs changed"
               % (res["bitwise_equal"], res["checked"], res["corrupt_injected"],
                  res["corrupt_caught"], res["corrupt_accepted"], res["corrupt_output_changed"]))
        rec = record.make("bench e2e check " + cache,
                          "with the %s cache every output is identical to recomputing "
                          "(bitwise first-token logits, same greedy tokens), and a corrupted "
                          "chunk is refused, never used" % cache,
                          conf, figs, [], "holds" if ok else "does not hold", why,
                          ["timing is in the other records (deterministic mode off)"],
                          env=run.env)
        record.write(rec, a.record, res)
    return res


def _group_counts(text: str) -> List[int]:
    """--layer-groups: the counts given, in order ([] for the default);
    ValueError for a count that is not a whole number of at least 1."""
    out = [int(x) for x in str(text).split(",") if x.strip()]
    if any(g < 1 for g in out):
        raise ValueError("--layer-groups: counts of at least 1, got %s" % text)
    return out


def table(summaries: List[Dict[str, Any]]) -> str:
    """The closing table in Markdown: configuration -> TTFT P50/P99 (with
    and without queueing), tokens not computed, remote bytes, speed-up of
    the service TTFT over no cache by prefix length."""
    out = ["| configuration | TTFT P50 / P99 (s) | service TTFT P50 / P99 (s) | tokens not "
           "computed | bytes read remotely | speed-up by prefix |", "|---|---|---|---:|---:|---|"]
    for s in summaries:
        if not s or "cache" not in s:
            continue
        sp = ", ".join("%d: %.1fx" % (int(p), v) for p, v in
                       sorted(s["speedup_by_prefix"].items(), key=lambda kv: int(kv[0])))
        out.append("| %s | %.3f / %.3f | %.3f / %.3f | %d | %d | %s |" % (
            s["config"], s["ttft_p50_s"], s["ttft_p99_s"], s["service_ttft_p50_s"],
            s["service_ttft_p99_s"], s["tokens_not_computed"], s["bytes_remote"], sp or "-"))
    return "\n".join(out) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        groups = _group_counts(args.layer_groups) or [0]
        if args.chunk_tokens < 0 or args.chunk_tokens % caches.CHUNK:
            raise ValueError("--chunk-tokens %d is not a multiple of %d"
                             % (args.chunk_tokens, caches.CHUNK))
    except ValueError as e:
        print("kvferry bench e2e: %s" % e, file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print("kvferry bench e2e needs torch and transformers (%s)" % e, file=sys.stderr)
        return 77
    if args.check:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    sums = [m for m in (args.gpu_sum or "").split(",") if m]
    from ..kv_gpu import sum_mode_flags
    try:
        for m in sums:
            sum_mode_flags(m)
    except ValueError as e:
        print("kvferry bench e2e: --gpu-sum: %s" % e, file=sys.stderr)
        return 2
    from .model import build
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if dev == "cuda" else "float32")
    t = time.perf_counter()
    info = build(args.model, dev, dtype, args.seed)
    run = Run(args, info, {})
    run.calib = _calibrate(info, min(run.max_tokens, 8192))
    print("e2e: %s on %s (%s), built in %.1f s; H2D %.3g GB/s, prefill %.3g TFLOPS"
          % (info.name, dev, dtype, time.perf_counter() - t, run.calib["h2d_gbs"],
             run.calib["flops_per_s"] / 1e12), flush=True)
    cfgs = [c for c in args.caches.split(",") if c]
    seq = set(args.sequential.split(","))
    for sh in [] if args.check_only else [float(x) for x in args.sharing.split(",")]:
        for c in cfgs:
            for m in (sums if c != "none" and len(sums) > 1 else sums[:1] or [""]):
                for g in (groups if c.startswith("remote") else groups[:1]):
                    run.one(c, sh, True, args.policy if c != "none" else "never", m, g)
                    if c in seq:
                        run.one(c, sh, False, args.policy, m, g)
    if args.throttle_gbs and not args.check_only:
        sh = max(float(x) for x in args.sharing.split(","))
        for mode in ("always", "never", "calc"):
            run.one("remote-tcp-throttled", sh, True, mode)
    if args.check:
        for c in cfgs:
            if c != "none" and (run.t_end is None or time.perf_counter() < run.t_end):
                run.summaries.append(_check(run, c))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calibration": run.calib, "summaries": run.summaries}, f, indent=1,
                      default=str)
        with open(os.path.splitext(args.json)[0] + ".md", "w") as f:
            f.write(table(run.summaries))
    bad = [s for s in run.summaries if s and s.get("ok") is False]
    return 1 if bad else 0


def _sum_mode_name() -> str:
    """The GPU copies' checksum mode in force (kvferry.kv_gpu.sum_mode)."""
    from .. import kv_gpu

    return kv_gpu.sum_mode()
