"""Training-trajectory summary from metrics rows: first-N vs last-N means, and final EMAs.

EMA over the logged steps (pandas ewm(span, adjust=False)): e_1 = x_1,
e_t = a * x_t + (1 - a) * e_{t-1}, a = 2 / (span + 1). Rows lacking a key (or holding
None / NaN for it) are skipped for that key only; keys no row has are left out.
With fewer than 2N rows the first and last windows overlap; "rows" says how many there were.
"""

from __future__ import annotations

import math

from rhlab.report.tables import md_table

DEFAULT_KEYS = ("reward_mean", "reward_std", "grad_norm", "entropy", "reward/penalty_rate")
SPANS = (20, 50)


def ema(values: list[float], span: int) -> float:
    assert values, "ema of no values"
    assert span >= 1, f"ema span must be >= 1 (got {span})"
    a = 2 / (span + 1)
    e = values[0]
    for x in values[1:]:
        e = a * x + (1 - a) * e
    return e


def series(rows: list[dict], key: str) -> list[float]:
    """The key's values in step order, skipping rows without a finite value."""
    ordered = sorted(rows, key=lambda r: r.get("step", 0))
    return [float(r[key]) for r in ordered
            if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])]


def trajectory_summary(rows: list[dict], keys=DEFAULT_KEYS, n: int = 20, spans=SPANS) -> dict:
    """{key: {rows, first, last, delta, ema_<span>...}}: first/last = mean of the first/last n values."""
    assert n >= 1, f"trajectory window n must be >= 1 (got {n})"
    out = {}
    for key in keys:
        xs = series(rows, key)
        if not xs:
            continue
        first, last = xs[:n], xs[-n:]
        s = {"rows": len(xs), "first": sum(first) / len(first), "last": sum(last) / len(last)}
        s["delta"] = s["last"] - s["first"]
        s.update({f"ema_{k}": ema(xs, k) for k in spans})
        out[key] = s
    return out


def format_trajectory(summary: dict, n: int = 20) -> str:
    """A markdown table: metric | first n | last n | delta | EMAs."""
    if not summary:
        return "(no trajectory: no metric rows)"
    emas = sorted({k for s in summary.values() for k in s if k.startswith("ema_")}, key=lambda k: int(k[4:]))
    head = ["metric", f"first {n}", f"last {n}", "Δ", *emas]
    rows = [[key, f"{s['first']:.4f}", f"{s['last']:.4f}", f"{s['delta']:+.4f}",
             *(f"{s[e]:.4f}" if e in s else "—" for e in emas)] for key, s in summary.items()]
    return md_table(head, rows)
