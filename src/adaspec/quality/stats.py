"""Statistics for comparing task accuracy, pure Python (``math`` only).

Plain and speculative decoding are scored on the same items, so their outcomes are paired: per item, both right
(n11), only A right (b), only B right (c), both wrong (n22). Only the discordant pairs b, c carry evidence of a
difference, which is why the paired tests below are far sharper than comparing two independent accuracies.

* :func:`wilson_interval`: score interval for one accuracy (Wilson 1927).
* :func:`mcnemar_exact`: exact two-sided McNemar test of "A and B are equally accurate" (McNemar 1947).
* :func:`paired_difference`: accuracy difference, its Newcombe (1998) method-10 interval and the McNemar p-value.
* :func:`mean_interval`: Student's t interval for the mean of a few measurements (per-prompt speedups).

References:
    E. B. Wilson (1927), "Probable inference, the law of succession, and statistical inference", JASA 22:209.
    Q. McNemar (1947), "Note on the sampling error of the difference between correlated proportions or
    percentages", Psychometrika 12:153.
    R. G. Newcombe (1998), "Improved confidence intervals for the difference between binomial proportions based
    on paired data", Statistics in Medicine 17:2635.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # standard normal 97.5% quantile: two-sided 95% intervals


# Student's t 97.5 % quantiles for 1-30 degrees of freedom (two-sided 95 % intervals), as printed in any table.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 97.5 % quantile with ``df`` >= 1 degrees of freedom: the table to 30, then the first two
    terms of the Cornish-Fisher expansion, z + (z³ + z) / (4 df) + (5z⁵ + 16z³ + 3z) / (96 df²) (within 2e-4 of
    the exact value there)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """95 % Student's t interval for the mean of ``values``: mean ± t(n − 1) · s / √n.

    For the handful of prompts a profile measures (3–8) this is the honest interval: a percentile bootstrap of 3
    values cannot reach beyond their min and max and covers the mean far less than 95 % of the time (Efron &
    Tibshirani 1993, §13.6). One value gives ``(-inf, inf)``: a spread cannot be estimated from it.

    Raises:
        ValueError: no values.
    """
    n = len(values)
    if n == 0:
        raise ValueError("an interval needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return -math.inf, math.inf
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    With p = k/n: centre = (k + z²/2) / (n + z²), half-width = z·sqrt(k(n-k)/n + z²/4) / (n + z²).
    The bounds are exactly 0 when k = 0 and 1 when k = n (as in ``scipy.stats.binomtest(...).proportion_ci``).

    Args:
        successes: k, 0 <= k <= n.
        n: trials; n = 0 gives the uninformative ``(0.0, 1.0)``.
        z: normal quantile (default: 95% two-sided).

    Returns:
        ``(low, high)``, proportions in [0, 1].

    Raises:
        ValueError: k or n out of range.
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (successes + z2 / 2) / (n + z2)
    half = z * math.sqrt(successes * (n - successes) / n + z2 / 4) / (n + z2)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pair counts.

    Under H0 each discordant pair is equally likely to favour either side, so min(b, c) is the lower tail of
    X ~ Binomial(b + c, 1/2): p = min(1, 2·P(X <= min(b, c))), computed with exact integers. Equals
    ``scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue``.

    Args:
        b: pairs where A is right and B wrong.
        c: pairs where A is wrong and B right.

    Returns:
        The p-value in (0, 1]; 1.0 when b + c = 0 (no evidence either way).

    Raises:
        ValueError: a negative count.
    """
    if b < 0 or c < 0:
        raise ValueError(f"counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / (1 << n))  # int / int: correctly rounded, no overflow for large n


def paired_difference(a: Sequence[bool], b: Sequence[bool], z: float = Z95) -> dict:
    """Accuracy difference between two systems scored on the same items, with interval and test.

    With n items, b = #(A right, B wrong), c = #(A wrong, B right), accuracies p_A, p_B and d = p_B - p_A =
    (c - b)/n, the interval is Newcombe's (1998) method 10 (square-and-add of Wilson intervals, corrected for the
    pairing): with (l_A, u_A), (l_B, u_B) the Wilson intervals of p_A, p_B,

        low  = d - sqrt((p_B - l_B)² - 2φ(p_B - l_B)(u_A - p_A) + (u_A - p_A)²)
        high = d + sqrt((u_B - p_B)² - 2φ(u_B - p_B)(p_A - l_A) + (p_A - l_A)²)

    where φ estimates the correlation of the paired outcomes: with N = n11·n22 - b·c and the four margins'
    product M, φ = (N - n/2)/sqrt(M) if N > n/2, 0 if 0 <= N <= n/2, N/sqrt(M) if N < 0, and 0 when a margin is
    empty (Newcombe's continuity-corrected φ, as in Fagerland, Lydersen & Laake's ``contingencytables``).

    Args:
        a: per-item correctness of system A (e.g. plain decoding).
        b: per-item correctness of system B (e.g. speculative decoding), same items in the same order.
        z: normal quantile of the interval (default: 95% two-sided).

    Returns:
        ``{"n", "acc_a", "acc_b", "diff", "ci95": (low, high), "b", "c", "p_mcnemar"}``; ``diff`` and the
        interval are differences of proportions in [-1, 1] (``ci95`` is at level ``z``). With no items the
        accuracies and ``diff`` are NaN, the interval the uninformative (-1, 1) and the p-value 1.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes must have equal length, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        nan = float("nan")
        return {"n": 0, "acc_a": nan, "acc_b": nan, "diff": nan, "ci95": (-1.0, 1.0), "b": 0, "c": 0,
                "p_mcnemar": 1.0}
    n11 = sum(1 for x, y in zip(a, b) if x and y)
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    n22 = n - n11 - only_a - only_b
    right_a, right_b = n11 + only_a, n11 + only_b
    p_a, p_b = right_a / n, right_b / n
    diff = p_b - p_a
    l_a, u_a = wilson_interval(right_a, n, z)
    l_b, u_b = wilson_interval(right_b, n, z)
    margins = right_a * (n - right_a) * right_b * (n - right_b)
    cross = n11 * n22 - only_a * only_b
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > 0 else cross) / math.sqrt(margins)
    lower = math.sqrt(max(0.0, (p_b - l_b) ** 2 - 2 * phi * (p_b - l_b) * (u_a - p_a) + (u_a - p_a) ** 2))
    upper = math.sqrt(max(0.0, (u_b - p_b) ** 2 - 2 * phi * (u_b - p_b) * (p_a - l_a) + (p_a - l_a) ** 2))
    return {"n": n, "acc_a": p_a, "acc_b": p_b, "diff": diff,
            "ci95": (max(-1.0, diff - lower), min(1.0, diff + upper)),
            "b": only_a, "c": only_b, "p_mcnemar": mcnemar_exact(only_a, only_b)}
