"""Training-trajectory summary from metrics rows: first-N vs last-N means, and final EMAs.

N (the window) adapts to the run: min(20, rows // 2), at least 1, so the two windows do not
overlap and Δ means something for short runs too; an explicit n is used as given.

EMA over the logged steps (pandas ewm(span, adjust=False)): e_1 = x_1,
e_t = a * x_t + (1 - a) * e_{t-1}, a = 2 / (span + 1). Rows lacking a key (or holding
None / NaN for it) are skipped for that key only; keys no row has are left out.
With an explicit n and fewer than 2n rows the windows overlap; "rows" says how many there were.
"""

from __future__ import annotations

import math

from rhlab.report.tables import md_table

# overseer/*: an overseen arm's training flags against the env's hack flag (rhlab/interventions/oversight.py)
DEFAULT_KEYS = ("reward_mean", "reward_std", "grad_norm", "entropy", "reward/penalty_rate",
                "overseer/disagree", "overseer/recall", "overseer/fpr")
SPANS = (20, 50)
MAX_WINDOW = 20


def window(n_rows: int) -> int:
    """The adaptive first/last window: half the rows, at most MAX_WINDOW, at least 1."""
    return max(1, min(MAX_WINDOW, n_rows // 2))


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


def trajectory_summary(rows: list[dict], keys=DEFAULT_KEYS, n: int | None = None, spans=SPANS) -> dict:
    """{key: {rows, window, first, last, delta, ema_<span>...}}: first/last = mean of the first/last
    `window` values (n, or window(rows) when n is None)."""
    assert n is None or n >= 1, f"trajectory window n must be >= 1 (got {n})"
    out = {}
    for key in keys:
        xs = series(rows, key)
        if not xs:
            continue
        w = n or window(len(xs))
        first, last = xs[:w], xs[-w:]
        s = {"rows": len(xs), "window": w, "first": sum(first) / len(first), "last": sum(last) / len(last)}
        s["delta"] = s["last"] - s["first"]
        s.update({f"ema_{k}": ema(xs, k) for k in spans})
        out[key] = s
    return out


def format_trajectory(summary: dict) -> str:
    """A markdown table: metric | first n | last n | delta | EMAs (an n column when windows differ)."""
    if not summary:
        return "(no trajectory: no metric rows)"
    emas = sorted({k for s in summary.values() for k in s if k.startswith("ema_")}, key=lambda k: int(k[4:]))
    windows = {s["window"] for s in summary.values()}
    one = windows.pop() if len(windows) == 1 else None
    head = ["metric", *([] if one else ["n"]), f"first {one or 'n'}", f"last {one or 'n'}", "Δ", *emas]
    rows = [[key, *([] if one else [str(s["window"])]), f"{s['first']:.4f}", f"{s['last']:.4f}",
             f"{s['delta']:+.4f}", *(f"{s[e]:.4f}" if e in s else "—" for e in emas)] for key, s in summary.items()]
    return md_table(head, rows)
