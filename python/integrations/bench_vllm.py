"""vLLM with kvferry's connector against vLLM's own CPU offloading and no
connector, in the same run, on one GPU machine.

Two benchmarks, each configuration in a fresh process:

``tiers``: one ``vllm.LLM`` per configuration with a GPU cache too small
for two sets of prompts: prompts A, then prompts B (which evict A from
the GPU cache), then A again, served from the configuration's tier.
Times of the three ``generate`` calls, cached tokens, and the first new
token of every run compared with the no-connector run's.

``load``: vLLM's OpenAI server per configuration, driven by this script's
client (``/v1/completions`` with token-id prompts, streamed) with a
prefix-sharing workload: ``--system-prompts`` shared prompts of
``--system-len`` tokens, each request one of them (uniformly) and
``--question-len`` tokens of its own, Poisson arrivals at ``--rate``; a
GPU cache smaller than the shared prompts (the case offloading exists
for). Per configuration: TTFT P50/P90/P99, ITL P50/P99, throughput, and
goodput at a TTFT SLO; one record each (``kvferry-record/1``, seed 003
§5's template, with the TTFT CDF as a series for ``kvferry report``).

Configurations: ``none`` (vLLM's own prefix cache only),
``offload`` (vLLM's ``OffloadingConnector``, CPU, ``--cpu-bytes``),
``kvferry`` (the connector, a master and a node process on this host:
the node's pool read and written in place over shm), ``kvferry-async``
(the same, loading between steps: ``load_mode`` async), ``kvferry-local``
(the connector with a store inside the vLLM process, ``"master":
"embedded"``), ``mooncake`` (vLLM's own ``MooncakeStoreConnector``, TCP,
its pool of ``--cpu-bytes`` inside the vLLM process, with a
``mooncake_master`` on loopback ports for the configuration's lifetime;
``mooncake_master`` on PATH or in ``MOONCAKE_MASTER`` and the
``mooncake`` package importable: ``mooncake_gpu.sh`` installs both on
the GPU machine).

    python bench_vllm.py tiers [--configs none,offload,kvferry] [model options]
    python bench_vllm.py load  [--configs ...] [--requests 200] [--rate 4] ...

Model options as ``serve_vllm.py``'s (a Llama of random weights made
here, nothing downloaded; ``--model-dir`` keeps it between runs).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import serve_vllm  # noqa: E402  (the model and its options)

CONFIGS = ("none", "offload", "kvferry", "kvferry-async", "kvferry-local", "mooncake")


# ---------------------------------------------------------------------------
# configurations


def transfer_config(name: str, args: argparse.Namespace, master: str) -> Optional[Dict[str, Any]]:
    """vLLM's kv_transfer_config of a configuration (None: no connector)."""
    if name == "none":
        return None
    if name == "offload":
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_bytes_to_use": args.cpu_bytes}}
    if name == "mooncake":  # the store's settings: the file in MOONCAKE_CONFIG_PATH
        return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
    extra = {"master": master, "namespace": "bench-%s-%d" % (name, os.getpid()),
             "chunk_tokens": args.chunk_tokens, "layer_groups": args.layer_groups,
             "load_mode": args.load_mode}
    if name == "kvferry-local":
        extra.update(master="embedded", embedded_pool=str(args.cpu_bytes))
    if name == "kvferry-async":  # loads between steps, whatever --load-mode says
        extra.update(load_mode="async")
    return {"kv_connector": "KvferryConnector", "kv_connector_module_path": "kvferry.vllm_connector",
            "kv_role": "kv_both", "kv_connector_extra_config": extra}


def llm_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    return dict(skip_tokenizer_init=True, dtype=args.dtype, block_size=args.block_size,
                max_model_len=serve_vllm.max_model_len(args), enforce_eager=True,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=max(4096, serve_vllm.max_model_len(args)),
                enable_prefix_caching=True, seed=0,
                gpu_memory_utilization=args.gpu_memory_utilization,
                num_gpu_blocks_override=args.gpu_blocks)


# ---------------------------------------------------------------------------
# the processes a configuration needs for its lifetime (mooncake: its master)

# The Mooncake store client's own transfer buffer; vLLM's KV caches are
# registered with the store and read and written in place, so it is
# little used (vLLM's default is 4 GiB).
MOONCAKE_LOCAL_BUFFER = 1 << 30


def mooncake_master_binary() -> str:
    """The mooncake_master executable (MOONCAKE_MASTER, else PATH), with the
    mooncake package importable; a clear SystemExit when either is missing."""
    path = os.environ.get("MOONCAKE_MASTER") or shutil.which("mooncake_master") or ""
    if not (path and os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SystemExit("bench-vllm: configuration mooncake needs the mooncake_master executable: "
                         "%s (set MOONCAKE_MASTER or put it on PATH; on the GPU machine "
                         "python/integrations/mooncake_gpu.sh installs it)"
                         % ("%s is not an executable file" % path if path else "not on PATH"))
    try:
        found = importlib.util.find_spec("mooncake.store") is not None
    except ImportError:  # no package mooncake at all
        found = False
    if not found:
        raise SystemExit("bench-vllm: configuration mooncake needs the mooncake Python package "
                         "(mooncake.store, from mooncake-transfer-engine): not importable "
                         "(python/integrations/mooncake_gpu.sh installs it)")
    return path


def check_configs(configs: List[str]) -> None:
    """Unknown names, and a mooncake configuration without its parts, fail
    before any model is made or server started."""
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        raise SystemExit("bench-vllm: unknown configuration %s (known: %s)"
                         % (", ".join(bad), ", ".join(CONFIGS)))
    if "mooncake" in configs:
        mooncake_master_binary()


def wait_ports(proc: subprocess.Popen, ports: List[int], timeout: float, what: str,
               logpath: str) -> None:
    """Until every port accepts a connection on 127.0.0.1; SystemExit when
    the process exits first or timeout seconds pass."""
    end = time.monotonic() + timeout
    todo = list(ports)
    while todo:
        if proc.poll() is not None:
            raise SystemExit("bench-vllm: %s exited (rc %s) before listening; its log: %s\n%s"
                             % (what, proc.returncode, logpath, _tail(logpath)))
        try:
            with socket.create_connection(("127.0.0.1", todo[0]), timeout=1):
                todo.pop(0)
            continue
        except OSError:
            pass
        if time.monotonic() > end:
            raise SystemExit("bench-vllm: %s not listening on port %d within %.0f s; its log: %s\n%s"
                             % (what, todo[0], timeout, logpath, _tail(logpath)))
        time.sleep(0.1)


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def stop_proc(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after timeout."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MooncakeMaster:
    """mooncake_master on loopback ports of its own: its RPC, the HTTP
    metadata server built into it (so no etcd) and its metrics/admin port;
    started on enter, waited for, stopped on exit."""

    def __init__(self, binary: str, logpath: str, timeout: float = 60.0) -> None:
        self.rpc_port, self.http_port, self.metrics_port = free_ports(3)
        self.logpath = logpath
        self.timeout = timeout
        self.cmd = [binary, "--rpc_address=127.0.0.1", "--rpc_port=%d" % self.rpc_port,
                    "--enable_http_metadata_server=true",
                    "--http_metadata_server_host=127.0.0.1",
                    "--http_metadata_server_port=%d" % self.http_port,
                    "--metrics_host=127.0.0.1", "--metrics_port=%d" % self.metrics_port,
                    "--enable_metric_reporting=false"]
        self.proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.rpc_port

    @property
    def metadata_server(self) -> str:
        return "http://127.0.0.1:%d/metadata" % self.http_port

    def __enter__(self) -> "MooncakeMaster":
        with open(self.logpath, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        try:
            wait_ports(self.proc, [self.rpc_port, self.http_port], self.timeout,
                       "mooncake_master", self.logpath)
        except BaseException:
            stop_proc(self.proc)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            stop_proc(self.proc)


def mooncake_config(args: argparse.Namespace, master: MooncakeMaster) -> Dict[str, Any]:
    """The store's settings (vLLM reads them from MOONCAKE_CONFIG_PATH):
    TCP (no RDMA device here), the pool of --cpu-bytes contributed by the
    vLLM process itself (mode embedded)."""
    return {"metadata_server": master.metadata_server,
            "master_server_address": master.address,
            "protocol": "tcp", "device_name": "", "mode": "embedded",
            "global_segment_size": args.cpu_bytes, "local_buffer_size": MOONCAKE_LOCAL_BUFFER}


def mooncake_env(args: argparse.Namespace, master: MooncakeMaster, tmp: str) -> Dict[str, str]:
    """Writes the store's settings into tmp; the variables vLLM's process gets."""
    path = os.path.join(tmp, "mooncake-%d.json" % master.rpc_port)
    with open(path, "w") as f:
        json.dump(mooncake_config(args, master), f, indent=1)
    # the store's segment named and bound on loopback (vLLM would name it
    # by the host's outbound address)
    return {"MOONCAKE_CONFIG_PATH": path, "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "127.0.0.1",
            "MC_TCP_BIND_ADDRESS": "127.0.0.1"}


@contextlib.contextmanager
def config_env(cfg: str, args: argparse.Namespace, tmp: str) -> Iterator[Dict[str, str]]:
    """Starts what configuration cfg needs besides the run's kvferry master
    and node, for the configuration's lifetime; yields the variables its
    vLLM process gets."""
    if cfg != "mooncake":
        yield {}
        return
    binary = mooncake_master_binary()
    logpath = os.path.join(args.outdir or tmp, "mooncake-master-%s.log" % args.kind)
    with MooncakeMaster(binary, logpath, args.server_timeout) as master:
        yield mooncake_env(args, master, tmp)


# ---------------------------------------------------------------------------
# tiers: A, B, A again in one process


def tiers_child(args: argparse.Namespace) -> Dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kw = llm_kwargs(args)
    tc = transfer_config(args.child, args, args.master)
    if tc is not None:
        kw["kv_transfer_config"] = KVTransferConfig(**tc)
    llm = LLM(model=args.model, **kw)
    with open(args.prompts_file) as f:
        sets = json.load(f)
    sp = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False, ignore_eos=True,
                        logprobs=serve_vllm.TOP_LOGPROBS)
    rec: Dict[str, Any] = {"config": args.child, "runs": []}
    for label in ("A", "B", "A again"):
        prompts = sets["A" if label != "B" else "B"]
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp)
        rec["runs"].append({"label": label, "generate_s": time.perf_counter() - t0,
                            "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outs],
                            "tokens": [list(o.outputs[0].token_ids) for o in outs],
                            "first_logprobs": [serve_vllm.first_logprobs(o) for o in outs]})
        if label == "B":
            _flush()  # A's and B's saves committed before A again
    rec["connector"] = _connector_stats()
    rec["device"] = serve_vllm.device_name()
    return rec


def _flush() -> None:
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    except ImportError:
        return
    if has_kv_transfer_group():
        conn = get_kv_transfer_group()
        if hasattr(conn, "flush"):
            conn.flush()


def _connector_stats() -> Dict[str, Any]:
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    except ImportError:
        return {}
    if not has_kv_transfer_group():
        return {}
    conn = get_kv_transfer_group()
    out: Dict[str, Any] = {"class": type(conn).__name__}
    if hasattr(conn, "stats") and isinstance(conn.stats, dict):
        out["stats"] = dict(conn.stats)
    cache = getattr(conn, "cache", None)
    if cache is not None and hasattr(cache, "stats"):
        out["cache_stats"] = dict(vars(cache.stats))
    return out


def tiers(args: argparse.Namespace, model: str, tmp: str, master: str) -> Dict[str, Any]:
    rng = random.Random(2)
    sets = {k: [[rng.randrange(4, args.vocab) for _ in range(args.prompt_len)]
                for _ in range(args.prompts)] for k in ("A", "B")}
    pf = os.path.join(tmp, "tier-prompts.json")
    with open(pf, "w") as f:
        json.dump(sets, f)
    recs = {}
    for cfg in args.configs.split(","):
        with config_env(cfg, args, tmp) as env:
            recs[cfg] = run_child("tiers", cfg, args, model, pf, master, env)
        print("bench-vllm tiers %s: %s" % (cfg, ", ".join(
            "%s %.3f s" % (r["label"], r["generate_s"]) for r in recs[cfg]["runs"])), flush=True)
    base = recs.get("none")
    out = {"configs": {}}
    for cfg, rec in recs.items():
        row = {r["label"]: {"generate_s": r["generate_s"], "cached": r["num_cached_tokens"]}
               for r in rec["runs"]}
        if base is not None:
            row["same_first_token_as_none"] = all(
                a["tokens"] == b["tokens"] for a, b in zip(rec["runs"], base["runs"]))
            row["logprob_gap_to_none"] = max(serve_vllm.logprob_gap(a["first_logprobs"],
                                                                    b["first_logprobs"])
                                             for a, b in zip(rec["runs"], base["runs"]))
        row["connector"] = rec.get("connector", {})
        out["configs"][cfg] = row
    return out


# ---------------------------------------------------------------------------
# load: the OpenAI server under a prefix-sharing workload


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> List[int]:
    """n distinct free loopback ports (the sockets held together)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def start_server(cfg: str, args: argparse.Namespace, model: str, master: str, port: int,
                 log: Any, extra_env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    kw = llm_kwargs(args)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "m",
           "--skip-tokenizer-init", "--dtype", kw["dtype"], "--block-size", str(kw["block_size"]),
           "--max-model-len", str(kw["max_model_len"]), "--enforce-eager",
           "--max-num-seqs", str(kw["max_num_seqs"]),
           "--max-num-batched-tokens", str(kw["max_num_batched_tokens"]),
           "--enable-prefix-caching", "--seed", "0",
           "--gpu-memory-utilization", str(kw["gpu_memory_utilization"]),
           "--num-gpu-blocks-override", str(kw["num_gpu_blocks_override"])]
    tc = transfer_config(cfg, args, master)
    if tc is not None:
        cmd += ["--kv-transfer-config", json.dumps(tc)]
    env = dict(os.environ)
    env.update(extra_env or {})
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit("bench-vllm: the server exited (rc %s)" % proc.returncode)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("bench-vllm: the server was not healthy in %.0f s" % timeout)


def one_request(port: int, prompt: List[int], max_tokens: int, timeout: float) -> Dict[str, Any]:
    """Streams one completion; returns its send time, token arrival times
    and status."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True, "stream": True})
    t0 = time.perf_counter()
    times: List[float] = []
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return {"t0": t0, "times": [], "error": "HTTP %d" % r.status}
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            times.append(time.perf_counter())
        return {"t0": t0, "times": times, "error": None}
    except OSError as e:
        return {"t0": t0, "times": times, "error": str(e)}


def drive(port: int, prompts: List[List[int]], args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Sends the prompts with Poisson arrivals at args.rate (requests/s)."""
    rng = random.Random(5)
    results: List[Optional[Dict[str, Any]]] = [None] * len(prompts)
    threads = []

    def run(i: int) -> None:
        results[i] = one_request(port, prompts[i], args.max_tokens, args.request_timeout)

    start = time.perf_counter()
    at = 0.0
    for i in range(len(prompts)):
        at += rng.expovariate(args.rate)
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=run, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(args.request_timeout + 30)
    return [r or {"t0": 0.0, "times": [], "error": "no answer"} for r in results]


def pct(xs: List[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def load_stats(res: List[Dict[str, Any]], slo: float, wall: float) -> Dict[str, Any]:
    ok = [r for r in res if r["error"] is None and r["times"]]
    ttft = [r["times"][0] - r["t0"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["times"], r["times"][1:])]
    tokens = sum(len(r["times"]) for r in ok)
    good = sum(1 for t in ttft if t <= slo)
    return {"requests": len(res), "ok": len(ok), "errors": len(res) - len(ok),
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99),
            "throughput_rps": len(ok) / wall, "tokens_per_s": tokens / wall,
            "goodput_rps": good / wall, "slo_s": slo, "wall_s": wall,
            "ttft": sorted(ttft)}


def workload(args: argparse.Namespace) -> List[List[int]]:
    rng = random.Random(3)
    system = [[rng.randrange(4, args.vocab) for _ in range(args.system_len)]
              for _ in range(args.system_prompts)]
    return [system[rng.randrange(args.system_prompts)]
            + [rng.randrange(4, args.vocab) for _ in range(args.question_len)]
            for _ in range(args.requests)]


def load(args: argparse.Namespace, model: str, tmp: str, master: str) -> Dict[str, Any]:
    prompts = workload(args)
    out: Dict[str, Any] = {"configs": {}}
    for cfg in args.configs.split(","):
        port = free_port()
        logpath = os.path.join(args.outdir or tmp, "server-%s.log" % cfg)
        with config_env(cfg, args, tmp) as env, open(logpath, "w") as log:
            proc = start_server(cfg, args, model, master, port, log, env)
            try:
                wait_healthy(port, proc, args.server_timeout)
                one_request(port, prompts[0][:64], 2, args.request_timeout)  # warm-up
                t0 = time.perf_counter()
                res = drive(port, prompts, args)
                st = load_stats(res, args.slo, time.perf_counter() - t0)
            finally:
                stop_proc(proc, 60)
        out["configs"][cfg] = st
        print("bench-vllm load %s: TTFT P50 %.3f P99 %.3f s, goodput %.2f req/s (SLO %.1f s), "
              "%d errors" % (cfg, st["ttft_p50"], st["ttft_p99"], st["goodput_rps"], args.slo,
                             st["errors"]), flush=True)
        if args.outdir:
            write_record(cfg, st, args)
    return out


def write_record(cfg: str, st: Dict[str, Any], args: argparse.Namespace) -> None:
    from kvferry.e2e import record

    n = len(st["ttft"])
    figs = [record.figure("TTFT", st["ttft_p50"], "s", st["ttft_p50"], st["ttft_p99"]),
            record.figure("TTFT P90", st["ttft_p90"], "s"),
            record.figure("ITL", st["itl_p50"], "s", st["itl_p50"], st["itl_p99"]),
            record.figure("throughput", st["throughput_rps"], "req/s"),
            record.figure("goodput at TTFT SLO %.1f s" % args.slo, st["goodput_rps"], "req/s"),
            record.figure("errors", st["errors"], "requests")]
    cdf = record.series("TTFT CDF", "TTFT (s)", "fraction of requests",
                        [(t, (i + 1) / n) for i, t in enumerate(st["ttft"])])
    conf = {k: getattr(args, k) for k in ("requests", "rate", "system_prompts", "system_len",
                                          "question_len", "max_tokens", "gpu_blocks", "hidden",
                                          "layers", "kv_heads", "dtype", "block_size",
                                          "chunk_tokens", "layer_groups", "cpu_bytes")}
    conf["configuration"] = cfg
    rec = record.make(
        "vllm-load-%s" % cfg,
        "Under a prefix-sharing load larger than the GPU cache, configuration %s gives the "
        "TTFT and goodput below (compared in docs/integrations.md with the other "
        "configurations of the same run)." % cfg, conf, figs, [cdf],
        "holds under conditions", "measured on one GPU machine; see the comparison table",
        ["cross-host stores", "other models and prompt mixes"])
    record.write(rec, args.outdir, raw={k: v for k, v in st.items()})


# ---------------------------------------------------------------------------


def run_child(kind: str, cfg: str, args: argparse.Namespace, model: str, prompts_file: str,
              master: str, extra_env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    env = dict(os.environ)
    env.update(extra_env or {})
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    cmd = [sys.executable, os.path.abspath(__file__), kind, "--child", cfg, "--model", model,
           "--prompts-file", prompts_file, "--master", master] + child_args(args)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit("bench-vllm: %s %s failed (rc %d):\n%s\n%s"
                         % (kind, cfg, p.returncode, p.stdout[-3000:], p.stderr[-6000:]))
    return json.loads(lines[-1])


OPTS = ("dtype", "prompt_len", "prompts", "block_size", "chunk_tokens", "layer_groups", "load_mode",
        "gpu_memory_utilization", "gpu_blocks", "cpu_bytes", "max_num_seqs", "vocab")


def child_args(args: argparse.Namespace) -> List[str]:
    out = []
    for name in OPTS:
        out += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return out


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--configs", default="none,offload,kvferry")
    ap.add_argument("--child", default="")
    ap.add_argument("--model", default="")
    ap.add_argument("--prompts-file", default="")
    ap.add_argument("--master", default="")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt-len", type=int, default=32000)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--layer-groups", type=int, default=4)
    ap.add_argument("--load-mode", choices=("layerwise", "async"), default="layerwise",
                    help="the kvferry connector's load_mode")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--gpu-blocks", type=int, default=4500,
                    help="vLLM's GPU cache in blocks (num_gpu_blocks_override)")
    ap.add_argument("--cpu-bytes", type=int, default=20 << 30,
                    help="vLLM's offloading CPU bytes; the kvferry node's pool; "
                         "Mooncake's segment (global_segment_size)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--outdir", default="")
    # load
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--system-prompts", type=int, default=8)
    ap.add_argument("--system-len", type=int, default=16384)
    ap.add_argument("--question-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--slo", type=float, default=2.0, help="TTFT SLO of the goodput (s)")
    ap.add_argument("--server-timeout", type=float, default=300.0)
    ap.add_argument("--request-timeout", type=float, default=300.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=("tiers", "load"))
    options(ap)
    args = ap.parse_args()
    args.new_tokens = max(args.new_tokens, args.max_tokens if args.kind == "load" else 1)
    if args.kind == "load":
        args.prompt_len = args.system_len + args.question_len
    if args.child:
        print(json.dumps(tiers_child(args)), flush=True)
        return 0
    check_configs(args.configs.split(","))
    if args.outdir:
        os.makedirs(args.outdir, exist_ok=True)
    from kvferry.procs import Master, Node

    with tempfile.TemporaryDirectory(prefix="kvferry-bench-vllm-") as tmp:
        model = args.model_dir or os.path.join(tmp, "model")
        if not os.path.exists(os.path.join(model, "config.json")):
            serve_vllm.make_model(model, args)
        with Master() as m, Node(m.address, pool=str(args.cpu_bytes)):
            fn = tiers if args.kind == "tiers" else load
            out = fn(args, model, tmp, m.address)
    import vllm

    out.update(kind=args.kind, vllm=vllm.__version__, device=serve_vllm.device_name(),
               options={k: getattr(args, k) for k in OPTS + ("hidden", "layers", "kv_heads")})
    text = json.dumps({k: v for k, v in out.items()}, indent=1, default=str)
    if args.outdir:
        with open(os.path.join(args.outdir, "bench-vllm-%s.json" % args.kind), "w") as f:
            f.write(text + "\n")
    print(text[-6000:] if args.kind == "load" else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
