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
from typing import Any, Dict, List

MODES = ("baseline", "producer", "consumer", "tampered", "tampered-fail")


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
    LlamaForCausalLM(cfg).to(getattr(torch, args.dtype)).save_pretrained(path)


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
    if args.child != "baseline":
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvferryConnector",
            kv_connector_module_path="kvferry.vllm_connector",
            kv_role="kv_both",
            kv_connector_extra_config={"master": args.master, "namespace": args.namespace},
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
                        ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp)
    elapsed = time.perf_counter() - t0
    rec: Dict[str, Any] = {
        "mode": args.child,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "finish_reasons": [str(o.outputs[0].finish_reason) for o in outs],
        "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outs],
        "generate_s": elapsed,
        "device": device_name(),
    }
    if args.child != "baseline":
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        if has_kv_transfer_group():  # the worker's connector, in this process
            conn = get_kv_transfer_group()
            rec["connector"] = type(conn).__module__ + "." + type(conn).__name__
            rec["worker_stats"] = dict(getattr(conn, "stats", {}))
            rec["corrupt_misses"] = conn.cache.stats.corrupt_misses
            # the cache's counters and the seconds of each phase (t_d2h, t_write, ...)
            rec["cache_stats"] = dict(vars(conn.cache.stats))
    return rec


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def tamper(prompts: List[List[int]]) -> None:
    """Replaces a piece of each prompt's second block in the store by
    other bytes of its size, with the worker connector's own keys: its
    load must fail its checksum and vLLM recompute the block."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    conn = get_kv_transfer_group()
    for p in prompts:
        piece = conn.cache.piece_keys(conn.cache.chunk_keys(p)[1])[-1]
        size = len(conn.store.get_bytes(piece))
        conn.store.remove(piece)
        conn.store.put(piece, b"\x5a" * size)


def run_child(mode: str, args: argparse.Namespace, model: str, prompts_file: str,
              master: str) -> Dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker in this process
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--model", model,
           "--prompts-file", prompts_file, "--master", master] + child_args(args)
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
    for name in ("dtype", "new_tokens", "prompt_len", "block_size",
                 "gpu_memory_utilization", "attention_backend", "async_scheduling"):
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


def check(recs: Dict[str, Dict[str, Any]], prompt_len: int, block: int) -> List[str]:
    """What is wrong with the runs' records (empty: all is well)."""
    bad = []
    base = recs["baseline"]["tokens"]
    for mode in ("producer", "consumer", "tampered"):
        if mode in recs and recs[mode]["tokens"] != base:
            bad.append("%s's tokens differ from the baseline's" % mode)
    if any(n != 0 for n in recs["producer"]["num_cached_tokens"]):
        bad.append("producer had cached tokens on an empty store")
    if not recs["producer"].get("worker_stats", {}).get("saved_chunks"):
        bad.append("producer's connector saved nothing")
    if "consumer" in recs:
        bad += check_consumer(recs["consumer"], len(base), prompt_len, block)
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
    ap.add_argument("--modes", default=",".join(MODES),
                    help="the runs, in order (baseline and producer first)")
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
        model = os.path.join(tmp, "model")
        make_model(model, args)
        rng = random.Random(1)
        prompts = [[rng.randrange(4, args.vocab) for _ in range(args.prompt_len)]
                   for _ in range(args.prompts)]
        prompts_file = os.path.join(tmp, "prompts.json")
        with open(prompts_file, "w") as f:
            json.dump(prompts, f)
        with Master() as m, Node(m.address, pool=args.node_pool):
            recs = {mode: run_child(mode, args, model, prompts_file, m.address)
                    for mode in args.modes.split(",")}
    import vllm

    bad = check(recs, args.prompt_len, args.block_size)
    out = {"vllm": vllm.__version__, "device": recs["baseline"]["device"],
           "prompts": args.prompts, "prompt_len": args.prompt_len,
           "new_tokens": args.new_tokens, "layers": args.layers, "hidden": args.hidden,
           "heads": args.heads, "kv_heads": args.kv_heads, "vocab": args.vocab,
           "dtype": args.dtype, "block_size": args.block_size,
           "attention_backend": args.attention_backend or "auto",
           "async_scheduling": args.async_scheduling, "ok": not bad, "problems": bad,
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
