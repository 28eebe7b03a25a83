"""Out-of-process peers of ``adaspec compare`` (adaspec.peers) against stand-ins: a fake llama-server speaking its
HTTP API with ``timings`` (tests/fakes/fake_llama_server.py), a fake ``openvino_genai`` for the real OpenVINO worker
(tests/fakes/fake_openvino), and a fake OpenAI endpoint in a thread. Covers method parsing, bad specs, a missing
peer, a crash (with log tail), a timeout, first-difference flagging and that no process is left behind."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from adaspec.compare import Method, markdown_report, parse_method, summarize
from adaspec.errors import ConfigError
from adaspec.peers import PeerContext, PeerSpec, first_difference, make_peer, parse_peer
from adaspec.peers.report import difference_lines, failure_lines

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_SERVER = FAKES / "fake_llama_server.py"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    model = tmp_path / "target.gguf"
    model.write_bytes(b"not really a gguf")
    monkeypatch.setenv("ADASPEC_LLAMA_SERVER", str(FAKE_SERVER))
    monkeypatch.setenv("FAKE_LLAMA_PIDFILE", str(tmp_path / "pids"))
    monkeypatch.delenv("FAKE_LLAMA_MODE", raising=False)
    return PeerContext(target="target", draft="draft", threads=1, log_dir=tmp_path / "logs",
                       eos_token_ids=(99,), target_gguf=model, draft_gguf=lambda: model, timeout_s=20,
                       start_timeout_s=20, detokenize=lambda ids: " ".join(f"t{i}" for i in ids))


def pids(tmp_path) -> list[int]:
    path = tmp_path / "pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


# --- parsing ----------------------------------------------------------------------------------------------------

def test_parse_peer_methods():
    assert parse_peer("llama-server:plain") == PeerSpec("llama-server:plain", "llama-server", "plain")
    assert parse_peer("llama-server:draft") == PeerSpec("llama-server:draft", "llama-server", "draft", 8)
    assert parse_peer("llama-server:ngram:2") == PeerSpec("llama-server:ngram:2", "llama-server", "ngram", 8, 2)
    both = parse_peer("llama-server:ngram+draft:5")
    assert (both.kind, both.k, both.ngram, both.needs_draft_model) == ("draft+ngram", 5, 3, True)
    assert parse_peer("llamacpp:pld").k == 10 and parse_peer("llamacpp:pld:4").k == 4
    assert parse_peer("openvino:plain").kind == "plain" and parse_peer("openvino:lookup").k == 4
    assert parse_peer("openvino:draft:6").needs_draft_model
    spec = parse_peer("vllm@http://127.0.0.1:8000/v1/")
    assert (spec.library, spec.url) == ("vllm", "http://127.0.0.1:8000")
    assert parse_peer("openai@https://h:1").library == "openai"
    assert parse_peer("goodput") is None and parse_peer("ngram/fixed:4") is None


def test_parse_method_routes_peers():
    assert parse_method("llama-server:draft:4+ngram", "d") == Method("d", "llama-server", 4,
                                                                       label="llama-server:draft:4+ngram")
    assert parse_method("llama-server:plain", "d") == Method(None, "llama-server", None, label="llama-server:plain")
    assert parse_method("llamacpp:pld", "d") == Method(None, "llamacpp", 10, label="llamacpp:pld")
    assert parse_method("openvino:draft", "d").drafter == "d"
    assert parse_method("vllm@http://h:8000", "d").controller == "vllm"


@pytest.mark.parametrize("bad, message", [
    ("llama-server:bogus", "modes are plain, draft"), ("llama-server:draft:x", "must be an integer"),
    ("llama-server:draft:0", ">= 1"), ("llama-server:plain+ngram", "plain combines with nothing"),
    ("llama-server:plain:3", "takes no number"), ("llama-server:draft+draft", "modes are"),
    ("llamacpp:lookup", "llamacpp:pld"), ("llamacpp:pld:-2", ">= 1"), ("openvino:fast", "openvino:plain"),
    ("openvino:plain:2", "takes no number"), ("openvino:draft+strict", "not to peers"),
    ("vllm@localhost:8000", "base URL"),
])
def test_bad_peer_specs_name_the_problem(bad, message):
    with pytest.raises(ConfigError, match=message):
        parse_method(bad, "d")


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference("abc", "abd") == 2


# --- llama-server -------------------------------------------------------------------------------------------------

def test_llama_server_peer_reports_its_own_timings(ctx, tmp_path):
    peer = make_peer(parse_peer("llama-server:draft:4+ngram:2"), ctx)
    try:
        row = peer.generate([5, 6, 7], max_new_tokens=6)
        assert row["peer_status"] == "ok", row
        assert row["token_ids"] == [8, 9, 10, 11, 12, 13] and row["new_tokens"] == 6
        assert row["text"].startswith("t8 t9")
        assert (row["decode_ms"], row["decode_tokens"]) == (50.0, 5)  # predicted_ms, predicted_n - 1
        assert (row["draft_tokens"], row["accepted_tokens"], row["acceptance_rate"]) == (12, 6, 0.5)
        assert row["prefill_ms"] == 5.0 and row["weights"] == "GGUF, draft GGUF"
        assert "predicted_ms" in row["timing_source"]
        log = peer.log_path.read_text()
        for flag in ("--spec-type draft-simple,ngram-simple", "--spec-draft-n-max 4", "--spec-ngram-simple-size-n 2",
                     "-md "):
            assert flag in log
        assert peer.generate([1], max_new_tokens=2)["token_ids"] == [2, 3]  # the same process answers again
        assert len(pids(tmp_path)) == 1
    finally:
        peer.stop()
    assert pids(tmp_path) and not any(alive(p) for p in pids(tmp_path))


def test_plain_llama_server_drafts_nothing(ctx, monkeypatch):
    monkeypatch.setenv("ADASPEC_LLAMA_SERVER_ARGS", "-nr --mlock")
    peer = make_peer(parse_peer("llama-server:plain"), ctx)
    try:
        row = peer.generate([1, 2], max_new_tokens=3)
    finally:
        peer.stop()
    assert row["draft_tokens"] is None and row["acceptance_rate"] is None
    assert "--spec-type" not in peer.log_path.read_text() and "--no-webui -nr --mlock" in peer.log_path.read_text()


def test_missing_llama_server_says_how_to_install(ctx, tmp_path, monkeypatch):
    monkeypatch.delenv("ADASPEC_LLAMA_SERVER")
    monkeypatch.setenv("ADASPEC_PEERS_DIR", str(tmp_path / "nothing"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    row = make_peer(parse_peer("llama-server:plain"), ctx).generate([1], max_new_tokens=2)
    assert row["peer_status"] == "not installed" and "make peers" in row["error"]
    assert row["token_ids"] is None and "ADASPEC_LLAMA_SERVER" in row["error"]
    monkeypatch.setenv("ADASPEC_LLAMA_SERVER", str(tmp_path / "no-such-binary"))
    row = make_peer(parse_peer("llama-server:plain"), ctx).generate([1], max_new_tokens=2)
    assert row["peer_status"] == "not installed" and "not an executable" in row["error"]


def test_crash_at_start_reports_the_log_tail(ctx, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash-at-start")
    peer = make_peer(parse_peer("llama-server:plain"), ctx)
    row = peer.generate([1], max_new_tokens=2)
    assert row["peer_status"] == "crashed" and "code 3" in row["error"]
    assert "failed to load model (fake)" in row["log_tail"]
    assert not peer.running


def test_killed_by_a_signal_names_it(ctx, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "sigill")
    row = make_peer(parse_peer("llama-server:plain"), ctx).generate([1], max_new_tokens=2)
    assert row["peer_status"] == "crashed" and row["error"] == "crashed: llama-server killed by SIGILL"


def test_crash_during_a_request_then_restart(ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash-on-ask")
    peer = make_peer(parse_peer("llama-server:ngram"), ctx)
    row = peer.generate([1], max_new_tokens=2)
    assert row["peer_status"] == "crashed" and "GGML_ASSERT failed (fake)" in row["log_tail"]
    monkeypatch.setenv("FAKE_LLAMA_MODE", "ok")  # the next prompt starts a fresh server
    try:
        assert peer.generate([1], max_new_tokens=2)["token_ids"] == [2, 3]
    finally:
        peer.stop()
    assert len(pids(tmp_path)) == 2 and not any(alive(p) for p in pids(tmp_path))


def test_timeout_kills_the_server(ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "hang")
    ctx.timeout_s = 1.0
    peer = make_peer(parse_peer("llama-server:plain"), ctx)
    start = time.monotonic()
    row = peer.generate([1], max_new_tokens=2)
    assert row["peer_status"] == "timed out" and "1 s" in row["error"]
    assert time.monotonic() - start < 15
    assert not any(alive(p) for p in pids(tmp_path))


# --- OpenVINO worker (the real worker script, a fake openvino_genai) -------------------------------------------------

@pytest.fixture
def ov_ctx(ctx, tmp_path, monkeypatch):
    models = tmp_path / "ov"
    for name in ("target", "draft"):
        (models / name).mkdir(parents=True)
        (models / name / "openvino_model.xml").write_text(  # the record NNCF appends to an int4 export
            '<net><rt_info><nncf><weight_compression><backup_mode value="int8_asym" /><group_size value="128" />'
            '<mode value="int4_asym" /></weight_compression></nncf></rt_info></net>')
    monkeypatch.setenv("ADASPEC_OPENVINO_PYTHON", sys.executable)
    monkeypatch.setenv("ADASPEC_OPENVINO_MODELS", str(models))
    monkeypatch.setenv("PYTHONPATH", str(FAKES / "fake_openvino"))
    return ctx


def test_openvino_worker_answers_with_its_perf_metrics(ov_ctx):
    peer = make_peer(parse_peer("openvino:draft:3"), ov_ctx)
    try:
        row = peer.generate([4, 5], max_new_tokens=4)
        assert row["peer_status"] == "ok", (row, peer.log_tail())
        assert row["token_ids"] == [6, 7, 8, 9] and row["text"] == "t6 t7 t8 t9"  # detokenised here
        assert (row["decode_ms"], row["decode_tokens"], row["prefill_ms"]) == (60.0, 3, 7.0)
        w = "OpenVINO int4_asym (group 128, backup int8_asym)"
        assert row["weights"] == f"{w}, draft draft {w}"
        assert "openvino-genai 0.0-fake" in row["peer_note"]
        proc = peer.proc
    finally:
        peer.stop()
    assert proc.poll() is not None


def test_openvino_missing_python_or_export(ov_ctx, tmp_path, monkeypatch):
    monkeypatch.setenv("ADASPEC_OPENVINO_MODELS", str(tmp_path / "none"))
    row = make_peer(parse_peer("openvino:plain"), ov_ctx).generate([1], max_new_tokens=2)
    assert row["peer_status"] == "not installed" and "no OpenVINO export of target" in row["error"]
    monkeypatch.setenv("ADASPEC_OPENVINO_PYTHON", str(tmp_path / "no-python"))
    row = make_peer(parse_peer("openvino:plain"), ov_ctx).generate([1], max_new_tokens=2)
    assert row["peer_status"] == "not installed" and "optimum-cli export openvino" in row["error"]


def test_openvino_not_importable_is_not_installed(ov_ctx, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "")  # the real worker, but no openvino_genai in this Python
    peer = make_peer(parse_peer("openvino:plain"), ov_ctx)
    row = peer.generate([1], max_new_tokens=2)
    assert row["peer_status"] == "not installed" and "openvino_genai" in row["error"]
    assert "ModuleNotFoundError" in row["log_tail"] and not peer.running


def test_openvino_worker_crash(ov_ctx, monkeypatch):
    monkeypatch.setenv("FAKE_OV_MODE", "crash")
    peer = make_peer(parse_peer("openvino:lookup"), ov_ctx)
    row = peer.generate([1], max_new_tokens=2)
    assert row["peer_status"] == "crashed" and "code 9" in row["error"] and not peer.running


# --- an OpenAI endpoint ---------------------------------------------------------------------------------------------

class FakeOpenAI(BaseHTTPRequestHandler):
    counters = {"draft": 0, "accepted": 0}

    def log_message(self, *a):
        pass

    def _send(self, body: bytes, kind="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "qwen-1.5b"}]}).encode())
        else:
            c = self.counters
            self._send((f"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
                        f"vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {c['draft']}\n"
                        f"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
                        f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} {c['accepted']}\n").encode(),
                       "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n, last = body["max_tokens"], body["prompt"][-1]
        self.counters["draft"] += 6
        self.counters["accepted"] += 4
        chunks = [{"choices": [{"text": f"t{last + i + 1} ", "token_ids": [last + i + 1],
                                "finish_reason": "length" if i == n - 1 else None}]} for i in range(n)]
        chunks.append({"choices": [], "usage": {"completion_tokens": n}})
        self._send("".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n",
                   "text/event-stream")


def test_openai_endpoint_peer(ctx):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        peer = make_peer(parse_peer(f"vllm@http://127.0.0.1:{server.server_port}"), ctx)
        row = peer.generate([3], max_new_tokens=3)
        assert row["peer_status"] == "ok", row
        assert row["token_ids"] == [4, 5, 6] and row["text"] == "t4 t5 t6 "
        assert row["decode_tokens"] == 2 and row["decode_ms"] >= 0 and row["weights"] == "as served: qwen-1.5b"
        assert (row["draft_tokens"], row["accepted_tokens"]) == (6, 4)
    finally:
        server.shutdown()
        server.server_close()
    row = peer.generate([3], max_new_tokens=3)
    assert row["peer_status"] == "not running" and "start it" in row["error"]


# --- the report -----------------------------------------------------------------------------------------------------

def _row(method, ids, **kw):
    return {"workload": "w", "category": "code", "prompt_id": "p", "method": method, "temperature": 0.0,
            "new_tokens": len(ids), "total_ms": 100.0, "decode_ms": 90.0, "decode_tokens": max(len(ids) - 1, 0),
            "token_ids": ids, "text": " ".join(map(str, ids)), "draft_tokens": None, "speculation_steps": None,
            **kw}


def test_report_flags_differences_and_lists_failures():
    rows = [_row("plain", [1, 2, 3, 4]), _row("llama-server:ngram", [1, 2, 9, 4], peer=True, draft_tokens=4,
                                               accepted_tokens=2, timing_source="llama-server timings",
                                               weights="GGUF Q4_K_M"),
            _row("llama-server:plain", [1, 2, 3, 4], peer=True, timing_source="x", weights="GGUF Q4_K_M"),
            {**_row("openvino:plain", []), "token_ids": None, "peer": True, "error": "not installed: no Python",
             "peer_status": "not installed", "log_tail": "", "total_ms": None, "decode_ms": None},
            {**_row("llama-server:draft", []), "token_ids": None, "peer": True, "error": "crashed: exit 134",
             "peer_status": "crashed", "log_tail": "GGML_ASSERT here", "total_ms": None, "decode_ms": None}]
    stats = summarize(rows)[("code", 0.0)]
    assert set(stats) == {"plain", "llama-server:ngram", "llama-server:plain"}  # failures left out of numbers
    assert stats["llama-server:ngram"]["alpha"] == 0.5 and stats["llama-server:ngram"]["tau"] is None
    assert stats["llama-server:ngram"]["identical"] == 0 and stats["llama-server:plain"]["identical"] == 1
    diff = "\n".join(difference_lines(rows))
    assert "| llama-server:ngram | p | token 2, character 4" in diff and "llama-server:plain" not in diff
    fail = "\n".join(failure_lines(rows))
    assert "| openvino:plain | not installed | 1 | not installed: no Python |" in fail
    assert "GGML_ASSERT here" in fail
    report = markdown_report(rows)
    assert "| openvino:plain | not installed (see below)" in report
    assert "| llama-server:draft | crashed (see below)" in report
    assert "| llama-server:ngram | GGUF Q4_K_M | llama-server timings |" in report
    # a rerun that answered replaces the failure
    fixed = rows + [_row("openvino:plain", [1, 2, 3, 4], peer=True)]
    assert "openvino:plain" not in "\n".join(failure_lines(fixed))


# --- the whole comparison ---------------------------------------------------------------------------------------------

def test_run_compare_with_process_peers(tmp_path, monkeypatch, ctx, qwen, qwen_indep, tokenizer):
    """run_compare interleaves a fake llama-server and a missing OpenVINO with adaspec's methods, writes rows for
    both (the missing one with its error), retries the failed one on a rerun, and leaves no process behind."""
    import transformers

    import adaspec.models
    from adaspec.compare import read_results, run_compare

    qwen.save_pretrained(tmp_path / "target")
    qwen_indep.save_pretrained(tmp_path / "draft")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(adaspec.models, "resolve_gguf", lambda name, progress=False: (name, ctx.target_gguf, None))
    monkeypatch.setenv("ADASPEC_OPENVINO_PYTHON", str(tmp_path / "no-python"))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "category": "a"}) + "\n" for p in ("w3 w17 w42", "w7 w8")))
    out = tmp_path / "r.jsonl"
    kw = dict(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"),
              methods=["plain", "llama-server:draft:2+ngram", "openvino:plain"], workloads=[str(data)], limit=None,
              max_new_tokens=4, temperatures=[0.0], out=out, dtype="float32", threads=1, progress=False)
    run_compare(**kw)
    rows = read_results(out)
    assert [r["method"] for r in rows] == ["plain", "llama-server:draft:2+ngram", "openvino:plain",
                                           "llama-server:draft:2+ngram", "openvino:plain", "plain"]  # rotated
    server = [r for r in rows if r["method"].startswith("llama-server")]
    assert all(r["new_tokens"] == 4 and r["decode_tokens"] == 3 and r["controller"] == "llama-server"
               for r in server)
    assert all(r["peer_status"] == "not installed" for r in rows if r["method"] == "openvino:plain")
    assert (out.with_suffix(".peers") / "llama-server_draft_2_ngram.log").is_file()
    started = pids(tmp_path)
    assert len(started) == 1 and not any(alive(p) for p in started)  # one server for the run, stopped after it
    run_compare(**kw)  # the rerun retries only the failed peer
    again = read_results(out)[len(rows):]
    assert [r["method"] for r in again] == ["openvino:plain", "openvino:plain"]
    assert "openvino:plain | not installed (see below)" in markdown_report(read_results(out))


def test_a_killed_comparison_leaves_no_server(ctx, tmp_path):
    """SIGKILL skips every ``finally``: the server must still go (Linux parent-death signal)."""
    import signal
    import subprocess

    script = (f"import sys, time; from pathlib import Path; from adaspec.peers import PeerContext, make_peer, "
              f"parse_peer\nctx = PeerContext(target='t', draft='d', threads=1, log_dir=Path({str(tmp_path)!r}), "
              f"target_gguf=Path({str(ctx.target_gguf)!r}))\npeer = make_peer(parse_peer('llama-server:plain'), ctx)\n"
              "print(peer.generate([1], max_new_tokens=2)['peer_status'], flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ok"
        (server,) = pids(tmp_path)
        assert alive(server)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server)
