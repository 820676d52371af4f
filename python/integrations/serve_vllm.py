"""vLLM serving a model with kvferry's KV connector, outputs compared.

Runs vLLM's own engine (``vllm.LLM``) in three fresh processes on one
model and one set of prompts, with greedy sampling:

1. ``baseline``: no connector;
2. ``producer``: ``KvferryConnector`` loaded by vLLM from
   ``kv_connector_module_path``, on an empty store: it computes every
   prompt and saves the prompts' full KV blocks;
3. ``consumer``: the same configuration in a new process (vLLM's own
   prefix cache is empty): the connector finds the prompts' blocks in the
   store, vLLM skips those tokens and the connector loads their KV.

It checks that the three produce the same tokens, that the consumer had
its prompts' blocks from the store (vLLM's ``num_cached_tokens`` and the
connector's ``loaded_tokens``) while the producer had none, and prints
one JSON record. The model is made here with random weights (a small
Llama, saved with ``transformers``; nothing is downloaded), and prompts
are token ids, so no tokenizer is needed.

    python serve_vllm.py [--out FILE] [--prompts 4] [--prompt-len 480]
                         [--new-tokens 24] [--layers 4] [--dtype float32]
                         [--hidden 256] [--heads 4] [--kv-heads 2] [--vocab 4096]
                         [--block-size 32] [--gpu-memory-utilization F]
                         [--attention-backend NAME] [--async-scheduling auto|on|off]
                         [--node-pool 1G] [--modes baseline,producer,...]

On a machine with a GPU vLLM's CUDA build runs it there (the KV caches
are GPU tensors, saved and loaded through ``kvferry.kv``'s GPU path);
``--gpu-memory-utilization`` bounds the share of the GPU it takes.

The kvferry master and node are started here (``kvferry.procs``);
``KVFERRY_BIN``/``KVFERRY_LIB`` point at a build as for the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

MODES = ("baseline", "producer", "consumer", "split", "tampered", "tampered-fail")
#: top log-probabilities recorded for each prompt's first new token
TOP_LOGPROBS = 20
#: largest |difference| of a first-token log-probability between a run
#: that loaded the prefix and the single-shot baseline that bfloat16
#: allows (the two compute the prompt in different splits, so different
#: kernels round differently; against the run of the same split the
#: difference must be 0)
BF16_TOLERANCE = 0.5


def make_model(path: str, args: argparse.Namespace) -> None:
    """A small Llama with random weights (seeded), saved to path. The
    weights are drawn wider than a trained model's initialisation
    (initializer_range 0.2) so that its greedy tokens depend on the
    prompt instead of settling into a short cycle."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      head_dim=args.hidden // args.heads,
                      max_position_embeddings=max_model_len(args),
                      initializer_range=0.2, torch_dtype=args.dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # seconds, not minutes, for 4.5B
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    model.to(getattr(torch, args.dtype)).save_pretrained(path)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()


def max_model_len(args: argparse.Namespace) -> int:
    """The context vLLM is given: the prompt and its new tokens, rounded
    up to 1024."""
    return (args.prompt_len + args.new_tokens + 1023) // 1024 * 1024


def child(args: argparse.Namespace) -> Dict[str, Any]:
    """One vLLM engine in this process; returns its outputs and counters."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kw: Dict[str, Any] = {}
    if args.child not in ("baseline", "split"):
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvferryConnector",
            kv_connector_module_path="kvferry.vllm_connector",
            kv_role="kv_both",
            kv_connector_extra_config=connector_extra(args),
            # vLLM's default, "fail", ends a request whose blocks did not
            # load with an error; "recompute" computes those blocks again
            kv_load_failure_policy="fail" if args.child == "tampered-fail" else "recompute")
    if args.gpu_memory_utilization:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.attention_backend:
        kw["attention_config"] = {"backend": args.attention_backend}
    if args.async_scheduling != "auto":
        kw["async_scheduling"] = args.async_scheduling == "on"
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype=args.dtype,
              block_size=args.block_size, max_model_len=max_model_len(args),
              enforce_eager=True, max_num_seqs=8,
              max_num_batched_tokens=max(4096, max_model_len(args)),
              enable_prefix_caching=True, seed=0, **kw)
    with open(args.prompts_file) as f:
        prompts = json.load(f)
    if args.child.startswith("tampered"):
        tamper(prompts)
    sp = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, detokenize=False,
                        ignore_eos=True, logprobs=TOP_LOGPROBS)
    if args.child == "split":
        # vLLM's own prefix cache gets every full block before each
        # prompt's last token: the timed run below computes only the rest,
        # the consumer's split
        bs = args.block_size
        llm.generate([TokensPrompt(prompt_token_ids=p[:(len(p) - 1) // bs * bs + 1])
                      for p in prompts], SamplingParams(temperature=0.0, max_tokens=1,
                                                        detokenize=False))
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp)
    elapsed = time.perf_counter() - t0
    flush_s = 0.0
    if args.child not in ("baseline", "split"):
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        if has_kv_transfer_group():  # the saves' commits, after the requests ended
            t1 = time.perf_counter()
            get_kv_transfer_group().flush()
            flush_s = time.perf_counter() - t1
    rec: Dict[str, Any] = {
        "mode": args.child,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "first_logprobs": [first_logprobs(o) for o in outs],
        "finish_reasons": [str(o.outputs[0].finish_reason) for o in outs],
        "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outs],
        "generate_s": elapsed,
        "flush_s": flush_s,
        "device": device_name(),
        "h2d_ceiling_gbs": pinned_ceiling(),
    }
    if args.child not in ("baseline", "split"):
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        if has_kv_transfer_group():  # the worker's connector, in this process
            conn = get_kv_transfer_group()
            rec["connector"] = type(conn).__module__ + "." + type(conn).__name__
            rec["worker_stats"] = dict(getattr(conn, "stats", {}))
            rec["corrupt_misses"] = conn.cache.stats.corrupt_misses
            # the cache's counters and the seconds of each phase
            st = dict(vars(conn.cache.stats))
            rec["cache_stats"] = st
            if st.get("t_load") and st.get("bytes_loaded"):
                rec["load_gbs"] = st["bytes_loaded"] / st["t_load"] / 1e9
                # what one plain DMA from the node's pool reaches here:
                # the loads' own ceiling beside the pinned buffer's
                rec["pool_dma_gbs"] = conn.cache.pool_dma_rate()
    return rec


def first_logprobs(out: Any) -> Dict[str, float]:
    """Token id -> log-probability of the first new token's top entries."""
    lps = out.outputs[0].logprobs
    if not lps:
        return {}
    return {str(t): float(getattr(v, "logprob", v)) for t, v in lps[0].items()}


def logprob_gap(a: List[Dict[str, float]], b: List[Dict[str, float]]) -> float:
    """Largest |difference| over the token ids both runs list, all prompts
    (inf when a prompt's lists share none)."""
    worst = 0.0
    for x, y in zip(a, b):
        common = set(x) & set(y)
        if not common:
            return float("inf")
        worst = max([worst] + [abs(x[t] - y[t]) for t in common])
    return worst


def connector_extra(args: argparse.Namespace) -> Dict[str, Any]:
    """The connector's kv_connector_extra_config from the options."""
    out = {"master": args.master, "namespace": args.namespace,
           "chunk_tokens": args.chunk_tokens, "layer_groups": args.layer_groups,
           "load_mode": args.load_mode}
    out.update(json.loads(args.extra or "{}"))
    return out


def variants(args: argparse.Namespace) -> List[Tuple[str, str]]:
    """--variant [MODE@]NAME=JSON options as (name, JSON), each checked."""
    out = []
    for v in args.variant or ():
        name, sep, extra = v.partition("=")
        mode = name.rpartition("@")[0] or "consumer"
        if (not sep or not name.rpartition("@")[2] or mode not in ("producer", "consumer")
                or not isinstance(json.loads(extra), dict)):
            raise SystemExit("serve_vllm: --variant NAME={json object}, not %r" % v)
        out.append((name, extra))
    return out


def pinned_ceiling() -> float:
    """The host->GPU rate of one large pinned copy (GB/s, best of 3), the
    ceiling a load's rate is compared with; 0 without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return 0.0
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - t0) / 1e9)
    del src, dst
    return best


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def tamper(prompts: List[List[int]]) -> None:
    """Replaces, in the store, the bytes of each prompt's second block in
    its first chunk object (layer group 0, the first piece) by other bytes
    of the same size, with the worker connector's own keys: its load must
    fail its checksum and vLLM recompute from that block."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from kvferry.kv_chunks import header_bytes

    conn = get_kv_transfer_group()
    cache = conn.cache
    for p in prompts:
        ch = cache.chunks_of(p, len(p) // cache.block_size * cache.block_size)[0]
        key = cache.object_key(ch.key, ch.blocks, 0)
        raw = bytearray(conn.store.get_bytes(key))
        at = header_bytes(len(cache.map.group_parts(0)), ch.blocks) + cache.map.piece_bytes
        raw[at:at + cache.map.piece_bytes] = b"\x5a" * cache.map.piece_bytes
        conn.store.remove(key)
        conn.store.put(key, bytes(raw))


def run_child(mode: str, args: argparse.Namespace, model: str, prompts_file: str,
              master: str, extra: str = "") -> Dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker in this process
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--model", model,
           "--prompts-file", prompts_file, "--master", master] + child_args(args)
    if extra or args.extra:
        cmd += ["--extra", json.dumps(dict(json.loads(args.extra or "{}"), **json.loads(extra or "{}")))]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit("serve_vllm: %s run failed (rc %d):\n%s\n%s"
                         % (mode, p.returncode, p.stdout[-4000:], p.stderr[-8000:]))
    return json.loads(lines[-1])


def child_args(args: argparse.Namespace) -> List[str]:
    """The options a child run takes from its parent's."""
    out = ["--namespace", args.namespace]
    for name in ("dtype", "new_tokens", "prompt_len", "block_size", "chunk_tokens",
                 "layer_groups", "load_mode", "node_pool", "gpu_memory_utilization", "attention_backend",
                 "async_scheduling"):
        value = getattr(args, name)
        if value:
            out += ["--" + name.replace("_", "-"), str(value)]
    return out


def same_prefix(tokens: List[List[int]], base: List[List[int]]) -> List[int]:
    """Per prompt, how many leading tokens equal the baseline's."""
    out = []
    for a, b in zip(tokens, base):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        out.append(n)
    return out


def check(recs: Dict[str, Dict[str, Any]], args: argparse.Namespace) -> List[str]:
    """What is wrong with the runs' records (empty: all is well). float32:
    every run's tokens equal the baseline's. Other dtypes: the consumer's
    first-token log-probabilities equal, bit for bit, the baseline's or
    the split run's, and the baseline's within BF16_TOLERANCE."""
    bad = []
    base = recs["baseline"]["tokens"]
    if args.dtype == "float32":
        for mode in ("producer", "consumer", "split", "tampered"):
            if mode in recs and recs[mode]["tokens"] != base:
                bad.append("%s's tokens differ from the baseline's" % mode)
    else:
        # the consumer computes the tokens after the loaded prefix: its
        # first-token log-probabilities must equal, bit for bit, those of
        # a run that computed the same prefix KV the producer's way (the
        # single-shot baseline, whose prefix the producer computed in the
        # same steps) or of the split run (vLLM's own prefix cache)
        cons = recs.get("consumer")
        refs = [recs[m]["first_logprobs"] for m in ("baseline", "split") if m in recs]
        if cons and cons["first_logprobs"] not in refs:
            bad.append("consumer's first-token log-probabilities equal neither the baseline's "
                       "nor the split run's bit for bit")
        for mode in ("producer", "consumer"):
            if mode in recs:
                gap = logprob_gap(recs[mode]["first_logprobs"], recs["baseline"]["first_logprobs"])
                if gap > BF16_TOLERANCE:
                    bad.append("%s's first-token log-probabilities are %.3g from the baseline's "
                               "(tolerance %g)" % (mode, gap, BF16_TOLERANCE))
    if any(n != 0 for n in recs["producer"]["num_cached_tokens"]):
        bad.append("producer had cached tokens on an empty store")
    if not recs["producer"].get("worker_stats", {}).get("saved_objects"):
        bad.append("producer's connector saved nothing")
    for mode in [m for m in recs if "@" in m]:
        ref = mode.partition("@")[0]
        if ref in recs and recs[mode]["first_logprobs"] != recs[ref]["first_logprobs"]:
            bad.append("%s's first-token log-probabilities differ from the %s's" % (mode, ref))
    for mode in [m for m in recs if m == "consumer" or m.startswith("consumer@")]:
        bad += [mode + ": " + p for p in
                check_consumer(recs[mode], len(base), args.prompt_len, args.block_size)]
    if "tampered" in recs and recs["tampered"].get("corrupt_misses") != len(base):
        bad.append("tampered run caught %s corrupt blocks, want %d"
                   % (recs["tampered"].get("corrupt_misses"), len(base)))
    # under vLLM's default policy a block that did not load ends its
    # request with an error: no tokens made from the bad bytes
    fail = recs.get("tampered-fail")
    if fail and (fail.get("corrupt_misses") != len(base)
                 or any(r != "error" for r in fail["finish_reasons"])):
        bad.append("tampered-fail run: %s corrupt blocks, finish reasons %s"
                   % (fail.get("corrupt_misses"), fail["finish_reasons"]))
    return bad


def summary(recs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The figures the targets speak of: the consumer's and producer's
    time over the baseline's, the load's rate over the pinned ceiling,
    and the first-token log-probability gaps."""
    base = recs["baseline"]["generate_s"]
    out: Dict[str, Any] = {}
    for mode in ("producer", "consumer", "split") + tuple(k for k in recs if "@" in k):
        if mode in recs:
            out["%s_over_baseline" % mode] = recs[mode]["generate_s"] / base
    for mode in ("consumer",) + tuple(k for k in recs if "@" in k):
        cons = recs.get(mode)
        pre = "" if mode == "consumer" else mode + "_"
        if cons and cons.get("load_gbs") and cons.get("h2d_ceiling_gbs"):
            out[pre + "load_gbs"] = cons["load_gbs"]
            out[pre + "h2d_ceiling_gbs"] = cons["h2d_ceiling_gbs"]
            out[pre + "load_over_ceiling"] = cons["load_gbs"] / cons["h2d_ceiling_gbs"]
            out.update(load_phases(cons, pre))
    for mode in ("producer",) + tuple(k for k in recs if k.startswith("producer@")):
        st = recs.get(mode, {}).get("cache_stats", {})
        pre = "" if mode == "producer" else mode + "_"
        out.update({pre + k: float(st.get(k, 0.0)) for k in ("t_save_wait", "t_gather", "t_dma_out",
                                                             "t_commit") if st})
        ws = recs.get(mode, {}).get("worker_stats") or {}
        if "wait_save_us" in ws:
            out[pre + "wait_save_s"] = ws["wait_save_us"] / 1e6
    cons = recs.get("consumer")
    for mode in ("consumer", "split", "producer"):
        if mode in recs:
            out["%s_logprob_gap_to_baseline" % mode] = logprob_gap(
                recs[mode]["first_logprobs"], recs["baseline"]["first_logprobs"])
    if cons and "split" in recs:
        out["consumer_logprob_gap_to_split"] = logprob_gap(cons["first_logprobs"],
                                                           recs["split"]["first_logprobs"])
    return out


def load_phases(cons: Dict[str, Any], pre: str) -> Dict[str, float]:
    """Where a consumer's load went: lookups, the copy engines' DMA (and
    its rate) and the verifying scatter, and what a plain DMA from the
    node's pool reached in the same process."""
    st = cons.get("cache_stats", {})
    out = {pre + k: float(st.get(k, 0.0)) for k in ("t_query", "t_dma", "t_scatter")}
    if st.get("t_dma"):
        out[pre + "dma_gbs"] = st["bytes_loaded"] / st["t_dma"] / 1e9
    if cons.get("pool_dma_gbs"):
        out[pre + "pool_dma_gbs"] = cons["pool_dma_gbs"]
    return out


def check_consumer(rec: Dict[str, Any], prompts: int, prompt_len: int, block: int) -> List[str]:
    """The consumer had every full block before each prompt's last token
    (vLLM computes that token itself) from the store, and nothing corrupt."""
    bad = []
    want = (prompt_len - 1) // block * block
    if any(n != want for n in rec["num_cached_tokens"]):
        bad.append("consumer cached tokens %s, want %d each" % (rec["num_cached_tokens"], want))
    loaded = rec.get("worker_stats", {}).get("loaded_tokens")
    if loaded != want * prompts:
        bad.append("consumer's connector loaded %s tokens, want %d" % (loaded, want * prompts))
    if rec.get("corrupt_misses") != 0:
        bad.append("consumer met corrupt blocks")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", choices=MODES)
    ap.add_argument("--model")
    ap.add_argument("--prompts-file")
    ap.add_argument("--master", default="")
    ap.add_argument("--namespace", default="serve-vllm")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=480)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=32,
                    help="vLLM's block size in tokens (its CPU attention takes multiples of 32)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.0)
    ap.add_argument("--attention-backend", default="")
    ap.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto",
                    help="vLLM's async scheduling (auto: vLLM's choice, on with a GPU)")
    ap.add_argument("--node-pool", default="1G")
    ap.add_argument("--model-dir", default="",
                    help="where the random-weight model is kept and reused (default: a "
                         "temporary folder)")
    ap.add_argument("--chunk-tokens", type=int, default=256,
                    help="tokens of one store object (the connector's chunk_tokens)")
    ap.add_argument("--layer-groups", type=int, default=4,
                    help="layer groups of a chunk (the connector's layer_groups)")
    ap.add_argument("--load-mode", choices=("layerwise", "async"), default="layerwise",
                    help="the connector's load_mode")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="the runs, in order (baseline and producer first)")
    ap.add_argument("--extra", default="",
                    help="JSON object merged into the connector's kv_connector_extra_config")
    ap.add_argument("--variant", action="append",
                    help="[MODE@]NAME={json}: after the modes, a run of MODE (consumer, the "
                         "default, or producer: give it a namespace of its own) named MODE@NAME "
                         "with these connector keys on top (repeatable), e.g. "
                         "nopipe='{\"stage_pipeline\": false}'")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if modes[:2] != ["baseline", "producer"] or not set(modes) <= set(MODES):
        ap.error("--modes: baseline, producer, then any of %s" % ", ".join(MODES[2:]))
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0

    from kvferry.procs import Master, Node

    with tempfile.TemporaryDirectory(prefix="kvferry-serve-vllm-") as tmp:
        model = args.model_dir or os.path.join(tmp, "model")
        if not os.path.exists(os.path.join(model, "config.json")):
            make_model(model, args)
        rng = random.Random(1)
        prompts = [[rng.randrange(4, args.vocab) for _ in range(args.prompt_len)]
                   for _ in range(args.prompts)]
        prompts_file = os.path.join(tmp, "prompts.json")
        with open(prompts_file, "w") as f:
            json.dump(prompts, f)
        with Master() as m, Node(m.address, pool=args.node_pool):
            recs = {mode: run_child(mode, args, model, prompts_file, m.address)
                    for mode in modes}
            for name, extra in variants(args):  # a mode again, configured otherwise
                mode = name.rpartition("@")[0] or "consumer"
                recs[mode + "@" + name.rpartition("@")[2]] = run_child(
                    mode, args, model, prompts_file, m.address, extra)
    import vllm

    bad = check(recs, args)
    out = {"vllm": vllm.__version__, "device": recs["baseline"]["device"],
           "prompts": args.prompts, "prompt_len": args.prompt_len,
           "new_tokens": args.new_tokens, "layers": args.layers, "hidden": args.hidden,
           "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab,
           "dtype": args.dtype, "block_size": args.block_size,
           "attention_backend": args.attention_backend or "auto",
           "async_scheduling": args.async_scheduling, "chunk_tokens": args.chunk_tokens,
           "layer_groups": args.layer_groups, "ok": not bad, "problems": bad,
           "summary": summary(recs),
           "runs": {k: dict({kk: vv for kk, vv in v.items() if kk != "tokens"},
                            same_prefix=same_prefix(v["tokens"], recs["baseline"]["tokens"]))
                    for k, v in recs.items()},
           "first_tokens": [t[:8] for t in recs["baseline"]["tokens"]]}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
