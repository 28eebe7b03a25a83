"""Record real vLLM and llama-server responses into this folder, for tests/engines/test_engines_recorded.py.

    PYTHONPATH=src python tests/data/engines/capture.py --vllm-venv VENV --vllm-target HF_DIR \
        --llama-server BIN --gguf-target GGUF --gguf-draft GGUF

What is kept (as the engines wrote it, except where said): vLLM's ``/metrics`` before and after two greedy
requests with n-gram speculation (K = 3), only its ``vllm:`` series without histogram buckets (the rest is Python
process and HTTP metrics, ~40 KB); one ``/v1/completions`` answer, one streamed ``/v1/chat/completions`` (SSE
lines); the server's "SpecDecoding metrics" log lines with the counters at that moment; llama-server's
``/completion`` answer with ``timings`` (n-gram lookup, K = 3; the draft-model server segfaulted at start on this
machine, see docs/guide/scaleout.md), a streamed ``/v1/chat/completions`` and its
``/metrics``. ``meta.json`` says which versions and settings produced them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from adaspec.engines import llama_server, vllm_server as vllm
from adaspec.engines.config import EngineConfig
from adaspec.engines.process import EngineProcess

HERE = Path(__file__).parent
PROMPT = "Write a Python function that returns the n-th Fibonacci number. Repeat the function name fib in the docstring."


def _vllm_series(text: str) -> str:
    return "".join(ln + "\n" for ln in text.splitlines()
                   if ("vllm:" in ln and "_bucket" not in ln))


def capture_vllm(a, meta: dict) -> None:
    cfg = EngineConfig("vllm", "ngram", 3)
    setup = vllm.VllmSetup(Path(a.vllm_venv), Path(a.vllm_target), kv_cache_gib=1)
    argv, env = vllm.command(setup, cfg, 8451)
    env["VLLM_LOG_STATS_INTERVAL"] = "2"
    with EngineProcess(cfg.label, argv, "http://127.0.0.1:8451", HERE / "_vllm.log", env=env) as p:
        url = p.url
        (HERE / "vllm_metrics_before.txt").write_text(_vllm_series(httpx.get(url + "/metrics").text))
        r = httpx.post(url + "/v1/completions", json={"model": "target", "prompt": PROMPT, "max_tokens": 48,
                                                      "temperature": 0}, timeout=600)
        (HERE / "vllm_completions.json").write_text(json.dumps(r.json(), indent=1))
        body = {"model": "target", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as s:
            (HERE / "vllm_chat_stream.txt").write_text("".join(ln + "\n" for ln in s.iter_lines() if ln))
        time.sleep(5)  # two stats intervals: the log has every request's drafts
        (HERE / "vllm_metrics_after.txt").write_text(_vllm_series(httpx.get(url + "/metrics").text))
        log = (HERE / "_vllm.log").read_text(errors="replace")
        (HERE / "vllm_log_spec_lines.txt").write_text(
            "".join(ln + "\n" for ln in log.splitlines() if "SpecDecoding metrics" in ln))
        meta["vllm"] = {"argv": argv[1:], "env": {k: v for k, v in env.items() if k != "LD_PRELOAD"},
                        "version": httpx.get(url + "/version").json()}
    (HERE / "_vllm.log").unlink()


def capture_llama(a, meta: dict) -> None:
    cfg = EngineConfig("llamacpp", "ngram", 3)  # draft:4 segfaulted at start here (docs/guide/scaleout.md)
    setup = llama_server.LlamaServerSetup(Path(a.llama_server), Path(a.gguf_target), Path(a.gguf_draft), slots=2)
    argv, env = llama_server.command(setup, cfg, 8452)
    with EngineProcess(cfg.label, argv, "http://127.0.0.1:8452", HERE / "_llama.log", env=env,
                       startup_timeout_s=1800) as p:
        url = p.url
        r = httpx.post(url + "/completion", json={"prompt": PROMPT, "n_predict": 48, "temperature": 0,
                                                  "cache_prompt": False}, timeout=600)
        (HERE / "llama_completion.json").write_text(json.dumps(r.json(), indent=1))
        body = {"model": "target", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as s:
            (HERE / "llama_chat_stream.txt").write_text("".join(ln + "\n" for ln in s.iter_lines() if ln))
        (HERE / "llama_metrics.txt").write_text(httpx.get(url + "/metrics").text)
        meta["llamacpp"] = {"argv": argv[1:], "props": {k: v for k, v in httpx.get(url + "/props").json().items()
                                                         if k in ("build_info", "total_slots")}}
    (HERE / "_llama.log").unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--vllm-venv", "--vllm-target", "--llama-server", "--gguf-target", "--gguf-draft"):
        ap.add_argument(flag)
    a = ap.parse_args()
    meta_path = HERE / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta["prompt"] = PROMPT
    if a.vllm_venv:
        capture_vllm(a, meta)
    if a.llama_server:
        capture_llama(a, meta)
    meta_path.write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
