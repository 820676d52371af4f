"""The correctness check: a cached prefix must never change an output.

Run in deterministic mode (:func:`deterministic`:
``torch.use_deterministic_algorithms(True)`` and
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, set before CUDA starts). For each
request served from the cache (a load of ``h`` prefix tokens):

1. the reference recomputes the same split with no cache: prefill the
   first ``h`` tokens, then the rest; its first-token logits must be
   bitwise equal to the cache-hit path's, and its 32 greedy tokens
   identical;
2. a single-shot prefill of the whole prompt is compared with the split
   one within a stated logit tolerance (different kernel shapes give
   different roundings, so it is a tolerance check, not bitwise);
3. :func:`corrupted` damages one stored chunk of a served prefix and
   serves the request again: the tier must refuse the chunk (the request
   recomputes) and the output must equal the reference.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

#: Largest |logit difference| accepted between single-shot and split
#: prefill, by dtype (bf16's 8-bit mantissa on logits of size ~10).
TOLERANCE = {"bfloat16": 1.0, "float16": 0.25, "float32": 1e-3}


def deterministic(on: bool = True) -> None:
    """Deterministic kernels (call before the first CUDA use for cuBLAS)."""
    import torch
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)


def reference(engine: Any, tokens: List[int], split_at: int, out_tokens: int):
    """(first-token logits, greedy output) of the no-cache recompute that
    prefills tokens[:split_at] then the rest."""
    import torch
    from transformers import DynamicCache
    with torch.no_grad():
        cache = DynamicCache()
        if split_at:
            engine.forward(tokens[:split_at], cache)
        logits = engine.forward(tokens[split_at:], cache)
        tok = int(torch.argmax(logits))
        out = [tok]
        for _ in range(out_tokens - 1):
            tok = int(torch.argmax(engine.forward([tok], cache)))
            out.append(tok)
    return logits.float().cpu(), out


def single_shot(engine: Any, tokens: List[int]):
    import torch
    from transformers import DynamicCache
    with torch.no_grad():
        return engine.forward(tokens, DynamicCache()).float().cpu()


def check(engine: Any, trace: Any, served: List[Any]) -> Dict[str, Any]:
    """Compares every cache-hit request with its recompute; engine must
    have kept first-token logits (keep_logits=True)."""
    import torch
    by_id = {r.rid: r for r in trace.requests}
    tol = TOLERANCE.get(str(engine.info.dtype).replace("torch.", ""), 1.0)
    res: Dict[str, Any] = {"checked": 0, "bitwise_equal": 0, "greedy_equal": 0,
                           "single_shot_max_abs": 0.0, "single_shot_within_tol": 0,
                           "single_shot_checked": 0, "tolerance": tol, "mismatches": []}
    for s in served:
        req = by_id[s.rid]
        tokens = req.tokens(engine.pool_seed)
        nprefix = req.prefix_len // 256 * 256
        if s.loaded_tokens:
            logits, out = reference(engine, tokens, s.loaded_tokens, req.out_tokens)
            res["checked"] += 1
            bit = torch.equal(logits, engine.logits[s.rid])
            res["bitwise_equal"] += int(bit)
            res["greedy_equal"] += int(out == s.output)
            if not bit or out != s.output:
                res["mismatches"].append(s.rid)
        if nprefix and res["single_shot_checked"] < 4:
            one = single_shot(engine, tokens)
            ref, _ = reference(engine, tokens, nprefix, 1)
            d = float((one - ref).abs().max())
            res["single_shot_checked"] += 1
            res["single_shot_max_abs"] = max(res["single_shot_max_abs"], d)
            res["single_shot_within_tol"] += int(d <= tol)
    return res


def corrupted(engine: Any, trace: Any, served: List[Any]) -> Dict[str, Any]:
    """Damages a stored chunk of each of a few saved prefixes and serves
    those requests again: counts blocks caught and outputs changed."""
    res = {"injected": 0, "caught": 0, "accepted": 0, "output_changed": 0}
    by_id = {r.rid: r for r in trace.requests}
    seen = set()
    for s in served:
        req = by_id[s.rid]
        nprefix = req.prefix_len // 256 * 256
        if nprefix == 0 or req.prefix_id in seen or res["injected"] >= 3:
            continue
        tokens = req.tokens(engine.pool_seed)
        chunk = (nprefix // 256) // 2
        if not engine.tier.corrupt(tokens[:nprefix], chunk):
            continue
        seen.add(req.prefix_id)
        res["injected"] += 1
        again = engine.serve_one(req, 0.0, 0.0)
        if again.decision == "corrupt":
            res["caught"] += 1
        elif again.loaded_tokens > chunk * 256:
            res["accepted"] += 1
        _, out = reference(engine, tokens, nprefix, req.out_tokens)
        res["output_changed"] += int(out != again.output)
    return res
