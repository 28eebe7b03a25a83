"""Verification: greedy prefix acceptance on explicit logits, and exactness of speculative (rejection) sampling.

The sampling tests draw the draft tokens from q themselves, call ``verify_sampling`` many times with a seeded
generator and compare the empirical distribution of the emitted tokens with the target's p (chi-square, fixed
seeds, so each test is deterministic). Cells with p = 0 must never be hit at all.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from adaspec.verify import verify_greedy, verify_sampling

P_MIN = 1e-3  # chi-square p-value threshold (fixed seeds: deterministic)


def dist(*weights: float) -> torch.Tensor:
    t = torch.tensor(weights, dtype=torch.float32)
    return t / t.sum()


def assert_matches(counts: np.ndarray, probs: np.ndarray, what: str = "") -> None:
    """Chi-square goodness of fit of ``counts`` to ``probs``; zero-probability cells must be empty.

    Cells with expected count < 5 are pooled into one cell.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    probs = probs / probs.sum()
    n = counts.sum()
    zero = probs <= 0
    assert counts[zero].sum() == 0, f"{what}: tokens with p = 0 were emitted: {np.nonzero(counts * zero)[0]}"
    expected = probs * n
    small = (expected < 5) & ~zero
    obs = list(counts[~zero & ~small])
    exp = list(expected[~zero & ~small])
    if small.any():
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    if len(obs) < 2:
        assert obs[0] == n
        return
    pvalue = chisquare(obs, exp).pvalue
    assert pvalue > P_MIN, f"{what}: chi-square p-value {pvalue:.2e}\nobserved {obs}\nexpected {exp}"


def run_first_token(p_rows: torch.Tensor, q_rows: torch.Tensor | None, k: int, n: int, seed: int,
                    fixed_draft: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Repeat one verification step ``n`` times with draft tokens sampled from q (independent positions, as the
    rows here do not depend on the drafted prefix). Returns (counts of the first emitted token, counts of
    n_accepted in 0..k)."""
    v = p_rows.shape[-1]
    g = torch.Generator().manual_seed(seed)
    if fixed_draft is None:
        drafts = torch.stack([torch.multinomial(q_rows[i], n, replacement=True, generator=g) for i in range(k)], 1)
    else:
        drafts = torch.tensor(fixed_draft, dtype=torch.long).expand(n, k)
    first = np.zeros(v, dtype=np.int64)
    accepted = np.zeros(k + 1, dtype=np.int64)
    for j in range(n):
        d = drafts[j]
        n_acc, nxt = verify_sampling(d, q_rows, p_rows, g)
        assert 0 <= n_acc <= k and 0 <= nxt < v
        first[int(d[0]) if n_acc > 0 else nxt] += 1
        accepted[n_acc] += 1
    return first, accepted


P8 = dist(5, 1, 3, 8, 2, 6, 4, 1)
Q8 = dist(1, 6, 2, 2, 7, 1, 3, 3)
CASES = {
    "dense": (P8, Q8),
    "q_zeros_where_p_not": (dist(3, 2, 1, 4, 1, 2, 5, 2), dist(0, 5, 0, 1, 6, 0, 3, 0)),
    "p_zeros_where_q_not": (dist(0, 4, 0, 2, 3, 0, 6, 0), dist(2, 1, 3, 1, 2, 4, 1, 1)),
    "disjoint": (dist(3, 1, 2, 0, 0, 0, 0, 0), dist(0, 0, 0, 1, 2, 3, 1, 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_k1_first_token_is_distributed_as_p(case):
    p, q = CASES[case]
    p_rows = torch.stack([p, dist(*range(1, 9))])  # row 1 (bonus) is irrelevant to the first token
    n = 5_000
    first, accepted = run_first_token(p_rows, q[None], k=1, n=n, seed=11)
    assert_matches(first, p.numpy(), case)
    # Acceptance probability of one token is sum_x min(p(x), q(x)) = 1 - TV(p, q).
    beta = float(torch.minimum(p, q).sum())
    if case == "disjoint":
        assert accepted[1] == 0
    else:
        se = np.sqrt(beta * (1 - beta) / n)
        assert abs(accepted[1] / n - beta) < 5 * se


@pytest.mark.parametrize("case", ["dense", "p_zeros_where_q_not"])
def test_k3_first_token_is_distributed_as_p(case):
    p, q = CASES[case]
    other_p = dist(1, 1, 1, 1, 1, 1, 1, 1)
    p_rows = torch.stack([p, other_p, other_p, other_p])
    q_rows = torch.stack([q, Q8, P8])
    first, accepted = run_first_token(p_rows, q_rows, k=3, n=4_000, seed=12)
    assert_matches(first, p.numpy(), case)
    assert accepted.sum() == 4_000


def test_disjoint_supports_always_reject():
    p, q = CASES["disjoint"]
    p_rows = torch.stack([p, P8, P8])
    first, accepted = run_first_token(p_rows, torch.stack([q, q]), k=2, n=3_000, seed=13)
    assert accepted[0] == 3_000
    assert_matches(first, p.numpy(), "disjoint k=2")


def test_q_equal_p_always_accepts_and_bonus_is_distributed_as_last_row():
    """All drafts accepted → the bonus token is drawn from p_{K+1}."""
    p0, p1 = P8, dist(1, 2, 3, 4, 4, 3, 2, 1)
    bonus_p = dist(0, 7, 1, 0, 3, 5, 0, 2)
    p_rows = torch.stack([p0, p1, bonus_p])
    q_rows = torch.stack([p0, p1])
    g = torch.Generator().manual_seed(14)
    n = 5_000
    drafts = torch.stack([torch.multinomial(q_rows[i], n, replacement=True, generator=g) for i in range(2)], 1)
    bonus = np.zeros(8, dtype=np.int64)
    for j in range(n):
        n_acc, nxt = verify_sampling(drafts[j], q_rows, p_rows, g)
        assert n_acc == 2
        bonus[nxt] += 1
    assert_matches(bonus, bonus_p.numpy(), "bonus")


def test_k0_samples_from_p0():
    p = dist(0, 2, 5, 1, 0, 3)
    g = torch.Generator().manual_seed(15)
    counts = np.zeros(6, dtype=np.int64)
    for _ in range(4_000):
        n_acc, nxt = verify_sampling(torch.empty(0, dtype=torch.long), None, p[None], g)
        assert n_acc == 0
        counts[nxt] += 1
    assert_matches(counts, p.numpy(), "k=0")


@pytest.mark.parametrize("draft_token", [3, 4, 7])  # p(3) large, p(4) small, p(7) = 0
def test_deterministic_drafter_none_probs(draft_token):
    """draft_probs=None means q = one-hot(draft token): accept with prob p(d), else sample p with d removed."""
    p = dist(5, 1, 3, 8, 2, 6, 4, 0)
    p_rows = torch.stack([p, P8])
    n = 4_000
    first, accepted = run_first_token(p_rows, None, k=1, n=n, seed=16, fixed_draft=[draft_token])
    assert_matches(first, p.numpy(), f"one-hot draft {draft_token}")
    if p[draft_token] == 0:
        assert accepted[1] == 0
    else:
        beta = float(p[draft_token])
        assert abs(accepted[1] / n - beta) < 5 * np.sqrt(beta * (1 - beta) / n)


def test_deterministic_drafter_k2_all_ones_hot_with_certain_target():
    """p one-hot on the drafted tokens → always accepted; draft_probs=None."""
    p_rows = torch.nn.functional.one_hot(torch.tensor([2, 5, 1]), 8).float()
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        assert verify_sampling(torch.tensor([2, 5]), None, p_rows, g) == (2, 1)
    # The second draft is wrong: accepted 1, correction = the target's certain token 5.
    for _ in range(50):
        assert verify_sampling(torch.tensor([2, 6]), None, p_rows, g) == (1, 5)


V2 = 5
P_FIRST = dist(4, 1, 3, 2, 2)
Q_FIRST = dist(1, 3, 1, 4, 1)


def _cond_table(seed: int, zeros: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(V2, V2, generator=g) + 0.05
    if zeros:
        t[torch.rand(V2, V2, generator=g) < 0.3] = 0
        t[:, 0] += 0.1  # every row keeps some mass
    return t / t.sum(-1, keepdim=True)


@pytest.mark.parametrize("zeros", [False, True])
def test_k2_first_two_tokens_jointly_distributed_as_target(zeros):
    """Two positions with prefix-dependent conditionals: the first two emitted tokens ~ p(t1) p(t2 | t1).

    When only one token is emitted (rejection at position 0), the second token is what the next (plain) step
    would sample: p(. | t1). The bonus row is a fixed distribution.
    """
    P2 = _cond_table(1, zeros)  # target p(t2 | t1)
    Q2 = _cond_table(2, zeros)  # draft q(t2 | t1)
    q_first = Q_FIRST.clone()
    if zeros:
        q_first[2] = 0
        q_first = q_first / q_first.sum()
    bonus_row = dist(1, 1, 1, 1, 1)
    g = torch.Generator().manual_seed(17)
    n = 5_000
    d0 = torch.multinomial(q_first, n, replacement=True, generator=g)
    counts = np.zeros((V2, V2), dtype=np.int64)
    n_acc_hist = np.zeros(3, dtype=np.int64)
    for j in range(n):
        a = int(d0[j])
        b = int(torch.multinomial(Q2[a], 1, generator=g))
        draft = torch.tensor([a, b])
        q_rows = torch.stack([q_first, Q2[a]])
        p_rows = torch.stack([P_FIRST, P2[a], bonus_row])
        n_acc, nxt = verify_sampling(draft, q_rows, p_rows, g)
        emitted = draft[:n_acc].tolist() + [nxt]
        if len(emitted) == 1:  # the next step samples the second token from the target
            emitted.append(int(torch.multinomial(P2[emitted[0]], 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
        n_acc_hist[n_acc] += 1
    expected = (P_FIRST[:, None] * P2).numpy()
    assert_matches(counts, expected, f"joint zeros={zeros}")
    assert n_acc_hist.min() > 0  # every path (reject at 0, at 1, accept all) was exercised


# Greedy ------------------------------------------------------------------------------------------------------
def onehot_logits(ids: list[int], v: int = 10) -> torch.Tensor:
    """Logits whose argmax per row is ``ids`` (with non-trivial other values)."""
    g = torch.Generator().manual_seed(len(ids))
    logits = torch.randn(len(ids), v, generator=g)
    logits[torch.arange(len(ids)), torch.tensor(ids)] = 10.0
    return logits


@pytest.mark.parametrize("draft,target,expected", [
    ([4, 5, 6], [1, 5, 6, 7], (0, 1)),   # first draft wrong: correction = target argmax at row 0
    ([4, 5, 6], [4, 5, 2, 7], (2, 2)),   # partial
    ([4, 5, 6], [4, 9, 6, 7], (1, 9)),   # a later match after a mismatch does not count
    ([4, 5, 6], [4, 5, 6, 7], (3, 7)),   # all accepted: bonus = last row's argmax
    ([3], [3, 8], (1, 8)),
    ([3], [2, 8], (0, 2)),
    ([], [6], (0, 6)),                   # K = 0: plain step
])
def test_verify_greedy(draft, target, expected):
    got = verify_greedy(torch.tensor(draft, dtype=torch.long), onehot_logits(target))
    assert got == expected
    assert isinstance(got[0], int) and isinstance(got[1], int)


def test_verify_greedy_ignores_draft_distribution_only_argmax_matters():
    logits = torch.tensor([[0.0, 1.0, 0.9], [2.0, 0.0, 1.99]])
    assert verify_greedy(torch.tensor([1]), logits) == (1, 0)
    assert verify_greedy(torch.tensor([2]), logits) == (0, 1)
