"""Proxy vs gold over-optimisation (Gao et al. 2022): fit gold = d (alpha - beta ln d), d = sqrt(KL).

KL units: the trainer logs "kl" as the mean per-TOKEN k3 KL to the reference, weighted by tokens
(sum of token KLs / number of completion tokens), and "completion_len" as the mean number of
completion tokens. Their product is therefore exactly the mean per-SEQUENCE KL (sum of token KLs
/ number of completions), the quantity Gao et al. use. By default d = sqrt(kl * completion_len);
kl_unit="token" gives d = sqrt(kl) instead.

Gold is measured relative to the initial policy: we fit
    y = y0 + alpha * d - beta * d * ln d       (d ln d -> 0 at d = 0)
which is linear in (y0, alpha, beta) given d, so least squares has a closed form. y0 is the
fitted initial score (fit_intercept=False pins it at 0 for data already relative to the start).
For beta > 0 the curve peaks at d* = exp(alpha / beta - 1) with y(d*) = y0 + beta * d*.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rhlab.utils import read_jsonl, write_json

KEYS = ("kl", "completion_len", "reward/gold", "reward/proxy")


def d_log_d(d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    return np.where(d > 0, d * np.log(np.where(d > 0, d, 1.0)), 0.0)


def overopt_curve(d, alpha: float, beta: float, y0: float = 0.0) -> np.ndarray:
    return y0 + alpha * np.asarray(d, dtype=float) - beta * d_log_d(d)


def fit_overopt(d, y, fit_intercept: bool = True) -> dict:
    """Least-squares (y0, alpha, beta) of y = y0 + alpha d - beta d ln d; the peak when beta > 0."""
    d, y = np.asarray(d, dtype=float), np.asarray(y, dtype=float)
    assert d.shape == y.shape and d.ndim == 1, f"d {d.shape} and y {y.shape} must be equal 1-d arrays"
    assert np.all(d >= 0), "d = sqrt(KL) must be non-negative"
    assert np.all(np.isfinite(y)), "non-finite rewards"
    cols = [np.ones_like(d)] if fit_intercept else []
    X = np.stack(cols + [d, -d_log_d(d)], axis=1)
    assert len(d) >= X.shape[1], f"{len(d)} points cannot determine {X.shape[1]} parameters"
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    y0, alpha, beta = (coef if fit_intercept else (0.0, *coef))
    resid = y - X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out = {"y0": float(y0), "alpha": float(alpha), "beta": float(beta),
           "rmse": float(np.sqrt((resid ** 2).mean())),
           "r2": 1 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else math.nan,
           "d_peak": math.inf, "y_peak": math.nan, "kl_peak": math.inf}
    if beta > 0:
        ratio = alpha / beta - 1
        if ratio < 700:  # exp overflows beyond: effectively no peak
            d_peak = math.exp(ratio)
            out.update(d_peak=d_peak, y_peak=float(y0 + beta * d_peak), kl_peak=d_peak ** 2)
    return out


def load_run_points(run_dir: str | Path, source: str = "train", kl_unit: str = "sequence") -> dict:
    """Per-step kl, completion_len, gold, proxy and d from a run directory.

    source="train": metrics.jsonl rows (every logged step, training batches).
    source="eval":  eval/step_*.json (held-out prompts; includes step 0, the initial policy)."""
    run_dir = Path(run_dir)
    if source == "train":
        rows = read_jsonl(run_dir / "metrics.jsonl", torn_tail=True)  # the run may still be going
        where = run_dir / "metrics.jsonl"
    elif source == "eval":
        files = sorted((run_dir / "eval").glob("step_*.json"))
        rows = [{"step": j["step"], **j["metrics"]} for j in (json.loads(f.read_text()) for f in files)]
        where = run_dir / "eval"
    else:
        raise ValueError(f"source: unknown {source!r}; allowed: train, eval")
    if kl_unit not in ("sequence", "token"):
        raise ValueError(f"kl_unit: unknown {kl_unit!r}; allowed: sequence, token")
    if not rows:
        raise FileNotFoundError(f"{where}: no metrics rows")
    missing = [k for k in KEYS if k not in rows[0]]
    if missing:
        raise ValueError(f"{where}: rows lack {missing} (needs {list(KEYS)}: a preference-env run "
                         "with the reference kept, log.log_kl or train.beta > 0)")
    col = {k: np.array([float(r[k]) for r in rows]) for k in KEYS}
    assert np.all(col["kl"] > -1e-6), f"{where}: negative KL"
    kl = np.clip(col["kl"], 0, None)
    kl_seq = kl * col["completion_len"]
    name = run_dir.name
    summary = run_dir / "summary.json"
    if summary.exists():
        name = json.loads(summary.read_text()).get("run_name", name)
    return {"name": name, "label": _label(run_dir, name), "dir": str(run_dir), "step": [int(r["step"]) for r in rows],
            "kl_token": kl, "kl_seq": kl_seq, "completion_len": col["completion_len"],
            "d": np.sqrt(kl_seq if kl_unit == "sequence" else kl),
            "gold": col["reward/gold"], "proxy": col["reward/proxy"]}


def _label(run_dir: Path, name: str) -> str:
    """A short plot label: "<arm> s<seed>" from config.yaml (run names share long prefixes), else the name."""
    import yaml

    cfg_path = run_dir / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else None
    if isinstance(cfg, dict) and "arm" in cfg and "seed" in cfg:
        return f"{cfg['arm']} s{cfg['seed']}"
    return name[-40:]


def _run_result(p: dict, fit_intercept: bool) -> dict:
    gold_fit = fit_overopt(p["d"], p["gold"], fit_intercept)
    i = int(np.argmax(p["gold"]))
    return {
        "dir": p["dir"], "n_points": len(p["d"]), "max_d": float(p["d"].max()),
        "gold_fit": gold_fit, "proxy_fit": fit_overopt(p["d"], p["proxy"], fit_intercept),
        "gold_max_observed": float(p["gold"][i]), "step_at_gold_max": p["step"][i], "d_at_gold_max": float(p["d"][i]),
        "final_gold": float(p["gold"][-1]), "final_proxy": float(p["proxy"][-1]), "final_d": float(p["d"][-1]),
        # over-optimised: the fitted gold peak lies inside the range of KL the run explored
        "overoptimised": bool(gold_fit["beta"] > 0 and gold_fit["d_peak"] < float(p["d"].max())),
    }


def overopt_report(run_dirs: list[str | Path], out_dir: str | Path, source: str = "train",
                   kl_unit: str = "sequence", fit_intercept: bool = True) -> dict:
    """Fit each run and all runs pooled; write overopt.json and overopt.png to out_dir; return the results."""
    assert run_dirs, "overopt_report: no run directories"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    points = [load_run_points(r, source, kl_unit) for r in run_dirs]
    names = [p["name"] for p in points]
    if len(set(names)) != len(names):  # same run name in two places: label by directory instead
        for p in points:
            p["name"] = p["dir"]
    runs = {p["name"]: _run_result(p, fit_intercept) for p in points}
    all_d = np.concatenate([p["d"] for p in points])
    pooled = {"gold_fit": fit_overopt(all_d, np.concatenate([p["gold"] for p in points]), fit_intercept),
              "proxy_fit": fit_overopt(all_d, np.concatenate([p["proxy"] for p in points]), fit_intercept)}
    result = {
        "model": "y = y0 + alpha * d - beta * d * ln(d)",
        "d": "sqrt(mean per-sequence KL) = sqrt(kl * completion_len)" if kl_unit == "sequence"
             else "sqrt(mean per-token KL)",
        "kl_unit": kl_unit, "source": source, "fit_intercept": fit_intercept,
        "runs": runs, "pooled": pooled, "plot": str(out_dir / "overopt.png"),
    }
    _plot(points, runs, pooled, out_dir / "overopt.png", kl_unit)
    write_json(out_dir / "overopt.json", result)
    return result


def _plot(points: list[dict], runs: dict, pooled: dict, path: Path, kl_unit: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, key, title in zip(axes, ["proxy", "gold"], ["proxy (reward model)", "gold"]):
        for i, p in enumerate(points):
            color = f"C{i % 10}"
            ax.scatter(p["d"], p[key], s=8, alpha=0.35, color=color)
            fit = runs[p["name"]][f"{key}_fit"]
            grid = np.linspace(0, float(p["d"].max()), 200)
            ax.plot(grid, overopt_curve(grid, fit["alpha"], fit["beta"], fit["y0"]), color=color, lw=2,
                    label=f"{p.get('label', p['name'][:40])}  (α={fit['alpha']:.3g}, β={fit['beta']:.3g})")
        if len(points) > 1:
            fit = pooled[f"{key}_fit"]
            grid = np.linspace(0, max(float(p["d"].max()) for p in points), 200)
            ax.plot(grid, overopt_curve(grid, fit["alpha"], fit["beta"], fit["y0"]), color="k", lw=1.5,
                    ls="--", label="pooled fit")
        ax.set_xlabel("d = sqrt(KL per sequence)" if kl_unit == "sequence" else "d = sqrt(KL per token)")
        ax.set_ylabel(key)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("over-optimisation: y = y0 + α d − β d ln d")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---- one table per algorithm / arm: mean ± SEM over seeds ---------------------------------
ARM_COLUMNS = ["proxy start", "proxy end", "gold start", "gold peak", "peak step", "gold end",
               "peak − end", "d end", "hack end", "distinct-2 end"]


def run_curve_stats(run_dir: str | Path, window: int = 5) -> dict:
    """Start / peak / end of a run's training-batch proxy and gold, each a mean over ``window`` steps.

    The peak is the maximum of the ``window``-step rolling mean (a single batch is noisy);
    "peak − end" > 0 means the gold fell after its peak while the run went on."""
    p = load_run_points(run_dir, "train")
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl", torn_tail=True)
    w = max(1, min(window, len(p["gold"])))
    roll = np.convolve(p["gold"], np.ones(w) / w, mode="valid")
    i = int(np.argmax(roll))
    last = lambda key: float(np.mean([float(r[key]) for r in rows[-w:]])) if key in rows[-1] else math.nan  # noqa: E731
    return {"proxy start": float(p["proxy"][:w].mean()), "proxy end": float(p["proxy"][-w:].mean()),
            "gold start": float(p["gold"][:w].mean()), "gold peak": float(roll[i]),
            "peak step": float(p["step"][i + w - 1]), "gold end": float(p["gold"][-w:].mean()),
            "peak − end": float(roll[i] - p["gold"][-w:].mean()), "d end": float(p["d"][-w:].mean()),
            "hack end": last("hack_rate"), "distinct-2 end": last("distinct_2")}


def arm_overopt_table(run_dirs: list[str | Path], window: int = 5) -> str:
    """Markdown table, one row per arm (config.yaml's ``arm``), cells mean ± SEM over its complete runs."""
    from rhlab.report.runs import load_runs
    from rhlab.report.tables import arm_names, fmt_stat, md_table, mean_sem

    runs = [r for r in load_runs(run_dirs) if r.complete]
    assert runs, f"no complete runs under {[str(d) for d in run_dirs]}"
    stats = {id(r): run_curve_stats(r.path, window) for r in runs}
    rows = []
    for arm in arm_names(runs):
        mine = [stats[id(r)] for r in runs if r.arm == arm]
        cells = [arm, str(len(mine))]
        for col in ARM_COLUMNS:
            s = mean_sem(m[col] for m in mine)
            cells.append(f"{s.mean:.0f}" if col == "peak step" and s.n else fmt_stat(s.mean, s.sem, s.n))
        rows.append(cells)
    return md_table(["arm", "n"] + ARM_COLUMNS, rows)


# ---- per arm: the fit pooled over an arm's seeds, its goodness, and the plot -----------------
POOR_R2 = 0.5  # below this the functional form explains less than half the gold variance: "poor fit"


def arm_fits(run_dirs: list[str | Path], plot: str | Path | None = None) -> dict:
    """arm -> gold / proxy fits pooled over the arm's complete runs (training-batch points), each with
    rmse and R², plus the per-seed gold R² values; optionally the fitted curves over the points as a PNG."""
    from rhlab.report.runs import load_runs

    runs = [r for r in load_runs(run_dirs) if r.complete]
    assert runs, f"no complete runs under {[str(d) for d in run_dirs]}"
    by_arm: dict[str, list[dict]] = {}
    for r in sorted(runs, key=lambda r: (r.arm, r.seed)):
        by_arm.setdefault(r.arm, []).append(load_run_points(r.path, "train"))
    out = {}
    for arm, pts in by_arm.items():
        d = np.concatenate([p["d"] for p in pts])
        out[arm] = {"n_runs": len(pts), "n_points": int(len(d)), "max_d": float(d.max()),
                    "gold_fit": fit_overopt(d, np.concatenate([p["gold"] for p in pts])),
                    "proxy_fit": fit_overopt(d, np.concatenate([p["proxy"] for p in pts])),
                    "seed_gold_r2": [fit_overopt(p["d"], p["gold"])["r2"] for p in pts]}
    if plot is not None:
        _plot_arms(by_arm, out, Path(plot))
    return out


def _plot_arms(by_arm: dict[str, list[dict]], fits: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    for ax, key in zip(fig.subplots(1, 2), ["proxy", "gold"]):
        for i, (arm, pts) in enumerate(by_arm.items()):
            color = f"C{i % 10}"
            for p in pts:
                ax.scatter(p["d"], p[key], s=5, alpha=0.25, color=color)
            fit = fits[arm][f"{key}_fit"]
            grid = np.linspace(0, fits[arm]["max_d"], 200)
            ax.plot(grid, overopt_curve(grid, fit["alpha"], fit["beta"], fit["y0"]), color=color, lw=2,
                    label=f"{arm} (n={len(pts)}, R²={fit['r2']:.2f})")
        ax.set_xlabel("d = sqrt(KL per sequence)")
        ax.set_ylabel(key)
        ax.set_title(f"{key}: observed (dots) and pooled fit per arm (lines)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: the bytes depend on the data only
