"""Committed result artifacts, and the doc tables generated from them.

An experiment's artifacts live in ``results/<exp>/`` (kilobytes, no checkpoints):

* ``sweep.yaml``: the sweep file that made the runs, verbatim (``source.txt`` says where it was);
* ``hypotheses.yaml``: its preregistered hypotheses, when the sweep names them;
* ``runs/<run>/``: ``config.yaml``, ``summary.json`` and ``metrics.jsonl`` of every complete planned
  run, the per-step metrics downsampled to every ``every``-th step (plus the first and the last) and
  to scalar values at 5 significant digits; for a sweep whose report has the projection table, also
  the final evaluation's ``eval/step_N.json`` (its completions give the hack modes); any gated
  evaluation suite's ``eval/suite_<name>.json``. ``results/<exp>/runs`` is a run folder like any other: ``rhlab report`` reads it.

Doc tables are blocks in README.md or docs/*.md::

    <!-- results KIND PATH [key=value ...] -->
    (generated)
    <!-- /results -->

``python -m rhlab.report.results docs`` (``make docs``) rewrites every block from its artifacts;
``--check`` lists stale blocks and exits 1 (tests/test_results.py runs it). KINDS below.

    python -m rhlab.report.results collect configs/sweep_projection.yaml --out results/projection
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import yaml

from .hypotheses import evaluate, load_hypotheses
from .runs import ReportError, load_runs
from .tables import arm_names, arm_table, fmt_num, fmt_stat, md_table, t_half_width, welch

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", "docs/*.md"]
# a block starts at the beginning of a line (an indented one, e.g. an example in a doc, is not a block)
BLOCK = re.compile(r"^<!-- results (?P<spec>[^\n]*?) -->\n(?:(?P<body>.*?)\n)??<!-- /results -->", re.S | re.M)


# ---- collect ---------------------------------------------------------------------------
def _downsample(metrics: Path, every: int) -> str:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    last = rows[-1]["step"] if rows else None
    keep = [{k: v if isinstance(v, int) else float(f"{v:.5g}") for k, v in r.items()  # 5 significant digits
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for r in rows if r["step"] % every == 0 or r["step"] in (1, last)]
    return "".join(json.dumps(r) + "\n" for r in keep)


def collect(sweep_file: str | Path, out: str | Path, every: int = 5) -> tuple[int, list[str]]:
    """Copy the compact artifacts of a sweep's complete runs to out/; (n collected, names missing)."""
    from rhlab.sweep.grid import expand, load_sweep

    sweep_file, out = Path(sweep_file), Path(out)
    spec, base = load_sweep(sweep_file)
    planned = expand(spec, base)
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")  # the artifacts are exactly the sweep's current runs
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sweep_file, out / "sweep.yaml")
    (out / "source.txt").write_text(f"{sweep_file}\n")
    if spec.report and spec.report.hypotheses:
        shutil.copyfile(spec.report.hypotheses, out / "hypotheses.yaml")  # load_sweep made it a path from here
    missing, root = [], str(ROOT) + "/"
    keep_eval = bool(spec.report and "projection" in spec.report.tables)
    for run in planned:
        summary = run.run_dir / "summary.json"
        if not summary.exists() or json.loads(summary.read_text()).get("status") != "complete":
            missing.append(run.name)
            continue
        dest = out / "runs" / run.name
        dest.mkdir(parents=True)
        for name in ("config.yaml", "summary.json"):  # paths inside the repo are written relative to it
            (dest / name).write_text((run.run_dir / name).read_text().replace(root, ""))
        absolute = _absolute_paths(yaml.safe_load((dest / "config.yaml").read_text()))
        if absolute:  # a machine's path in a committed artifact: the sweep ran in another checkout
            key, value = absolute[0]
            raise ReportError(f"{dest / 'config.yaml'}: {key} = {value!r} is outside {ROOT}; "
                              "collect from the checkout that ran the sweep")
        (dest / "metrics.jsonl").write_text(_downsample(run.run_dir / "metrics.jsonl", every))
        steps = json.loads(summary.read_text())["steps"]
        final_eval = run.run_dir / "eval" / f"step_{steps:05d}.json"  # its completions give the hack modes
        suites = sorted((run.run_dir / "eval").glob("suite_*.json"))  # gated evaluations (log.suite)
        for f in ([final_eval] if keep_eval and final_eval.exists() else []) + suites:
            (dest / "eval").mkdir(exist_ok=True)
            shutil.copyfile(f, dest / "eval" / f.name)
        validation = run.run_dir / "v_hack" / "v_hack.validation.json"  # the direction's held-out check
        if validation.exists():
            (dest / "v_hack").mkdir()
            shutil.copyfile(validation, dest / "v_hack" / validation.name)
    if spec.report and "overopt" in spec.report.tables and len(missing) < len(planned):
        from rhlab.rm.overopt import arm_fits

        arm_fits([out / "runs"], plot=out / "overopt.png")  # drawn from the artifacts, as the doc table is
    return len(planned) - len(missing), missing


def _absolute_paths(node, key: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every string in a config that is an absolute path."""
    if isinstance(node, dict):
        return [hit for k, v in node.items() for hit in _absolute_paths(v, f"{key}.{k}" if key else str(k))]
    if isinstance(node, list):
        return [hit for i, v in enumerate(node) for hit in _absolute_paths(v, f"{key}[{i}]")]
    return [(key, node)] if isinstance(node, str) and node.startswith("/") else []


# ---- doc blocks ------------------------------------------------------------------------
def _opts(args: list[str]) -> dict[str, str]:
    bad = [a for a in args if "=" not in a]
    if bad:
        raise ReportError(f"results block: expected key=value, got {bad[0]!r}")
    return dict(a.split("=", 1) for a in args)


def _runs(path: Path):
    runs = [r for r in load_runs([path / "runs"]) if r.complete]
    if not runs:
        raise ReportError(f"{path}: no complete runs")
    return runs


def _seeds_line(runs, path: Path) -> str:
    seeds = sorted({r.seed for r in runs})
    return (f"Source: `{path.relative_to(ROOT)}` ({len(runs)} runs; seeds {', '.join(map(str, seeds))}). "
            f"n = seeds per arm; cells: mean ± SEM [95 % Student-t interval] over seeds")


def _arm_order(path: Path, runs, arms: str, default: list[str]) -> list[str]:
    """The arms a block shows: `arms` (comma-separated, in that order) or the default; an unknown one fails."""
    order = arms.split(",") if arms else default
    present = sorted({r.arm for r in runs})
    unknown = [a for a in order if a not in present]
    if unknown:
        raise ReportError(f"{path}: unknown arm {unknown[0]!r}; allowed: {', '.join(present)}")
    return order


def _at_start(runs):
    """The runs with their step-0 evaluation (summary.json "initial") in place of the final one."""
    missing = [r.path for r in runs if not r.initial]
    if missing:
        raise ReportError(f"{missing[0]}: summary.json has no step-0 evaluation ('initial')")
    return [replace(r, final=r.initial) for r in runs]


def arms_block(path: Path, metrics: str, reference: str = "", arms: str = "", labels: str = "",
               at: str = "final") -> str:
    """Per-arm metrics of the final evaluation (or, at=initial, the step-0 one) with intervals, and each arm's
    difference from the reference arm."""
    if at not in ("final", "initial"):
        raise ReportError(f"arms block: at={at!r}; allowed: final, initial")
    runs = _runs(path) if at == "final" else _at_start(_runs(path))
    ms = metrics.split(",")
    table = arm_table(runs, ms, reference or None)
    order = _arm_order(path, runs, arms, arm_names(runs, reference or None))
    names = labels.split(",") if labels else ms
    rows = [[a, str(max(s.n for s in table[a].values()))] + [fmt_stat(table[a][m].mean, table[a][m].sem,
                                                                     table[a][m].n) for m in ms] for a in order]
    out = [md_table(["arm", "n", *names], rows), ""]
    if reference:
        drows = []
        for a in order:
            if a == reference:
                continue
            cells = []
            for m in ms:
                d, se, df = welch(table[a][m], table[reference][m])
                h = t_half_width(se, df)
                cells.append(f"{d:+.3f} [{fmt_num(d - h)}, {fmt_num(d + h)}]" if math.isfinite(h) else f"{d:+.3f}")
            drows.append([a, *cells])
        out += [md_table(["arm", *(f"Δ {n} vs {reference}" for n in names)], drows), ""]
    out.append(_seeds_line(runs, path) + ("; the step-0 evaluation, before training" if at == "initial" else "")
               + ("; Δ: difference of means with its Welch 95 % interval." if reference else "."))
    return "\n".join(out)


def hypotheses_block(path: Path) -> str:
    """The preregistered hypotheses' verdicts (decided on 95 % Welch intervals, rhlab/report/hypotheses.py)."""
    runs = _runs(path)
    hyps = load_hypotheses(path / "hypotheses.yaml")
    metrics = sorted({m for h in hyps for c in h.checks for m in (c.metric, c.ref_metric)})
    rows = []
    for h in evaluate(hyps, arm_table(runs, metrics)):
        for i, c in enumerate(h.checks):
            rows.append([h.name if i == 0 else "", h.verdict if i == 0 else "", f"{h.arm} − {h.reference}",
                         f"{c.metric}{'' if c.ref_metric == c.metric else ' vs ' + c.ref_metric} {c.op} {c.delta:g}",
                         f"{c.diff:+.3f} [{fmt_num(c.lo)}, {fmt_num(c.hi)}]",
                         f"{c.n_arm}/{c.n_ref}", c.verdict])
    return "\n".join([md_table(["hypothesis", "verdict", "difference", "check", "diff [95 %]", "n", "check verdict"],
                               rows), "", _seeds_line(runs, path) + "."])


def overopt_block(path: Path, reference: str = "") -> str:
    """Proxy vs gold per arm (rhlab.rm.overopt, training batches) and the goodness of the pooled fits."""
    from rhlab.rm.overopt import POOR_R2, arm_fits, arm_overopt_table

    runs = _runs(path)
    fits = arm_fits([path / "runs"])
    rows = []
    for arm, f in fits.items():
        g, pr = f["gold_fit"], f["proxy_fit"]
        peak = f"{g['d_peak']:.1f}" if g["d_peak"] < float("inf") else "none"
        poor = sum(r < POOR_R2 for r in f["seed_gold_r2"])
        rows.append([arm, str(f["n_runs"]), str(f["n_points"]), f"{g['alpha']:.3f}", f"{g['beta']:.3f}",
                     f"{g['r2']:.2f}", f"{g['rmse']:.3f}", f"{pr['r2']:.2f}", f"{peak} / {f['max_d']:.1f}",
                     f"{poor} of {f['n_runs']}"])
    poor_arms = [a for a, f in fits.items() if f["gold_fit"]["r2"] < POOR_R2]
    verdict = (f"Gold fit poor (pooled R² < {POOR_R2}) for: {', '.join(poor_arms)}; read those arms off the "
               "observed points, not the curve." if poor_arms else f"Every arm's pooled gold fit has R² ≥ {POOR_R2}.")
    return "\n".join([arm_overopt_table([path / "runs"]), "",
                      md_table(["arm", "runs", "points", "gold α", "gold β", "gold R²", "gold rmse", "proxy R²",
                                "fitted gold peak d* / max d", f"seeds with gold R² < {POOR_R2}"], rows), "",
                      verdict, "", _seeds_line(runs, path) + "; training-batch points every 5th step; fit "
                      "y = y0 + α d − β d ln d pooled over an arm's seeds (plot: "
                      f"`{path.relative_to(ROOT)}/overopt.png`)."])


def projection_block(path: Path, reference: str = "vanilla") -> str:
    """The projection experiment's preregistered headline table (rhlab/report/projection_headline.py)."""
    from .projection_headline import headline

    runs = _runs(path)
    return "\n".join([headline([path / "runs"], reference), "", _seeds_line(runs, path) +
                      "; percentages for rates; Δ SafePass: Welch 95 % interval."])


def routing_block(path: Path, metrics: str = "") -> str:
    """The routing table: each arm under each adapter mode (rhlab/report/routing_table.py)."""
    from .routing_table import routing_table

    runs = _runs(path)
    return "\n".join([routing_table([path / "runs"], metrics.split(",") if metrics else None), "",
                      _seeds_line(runs, path) + "."])


def trajectory_block(path: Path, metrics: str, window: str = "20", labels: str = "", arms: str = "") -> str:
    """Training batches: each metric's mean over a run's first and last `window` steps (its finite values),
    then mean ± SEM [95 % t] over seeds, by arm (`arms`: these, in this order): "start → end"."""
    from .tables import mean_sem

    runs, w, ms = _runs(path), int(window), metrics.split(",")
    names = labels.split(",") if labels else ms

    def window_mean(r, m, first: bool):
        xs = [x[m] for x in r.metrics if m in x and math.isfinite(x[m])
              and (x["step"] <= w if first else x["step"] > r.steps - w)]
        assert xs, f"{r.path}: no finite {m} in its {'first' if first else 'last'} {w} steps"
        return sum(xs) / len(xs)

    order = _arm_order(path, runs, arms, sorted({r.arm for r in runs}))
    runs = [r for r in runs if r.arm in order]
    out = []
    for arm in order:
        mine = [r for r in runs if r.arm == arm]
        cells = []
        for m in ms:
            a, b = (mean_sem(window_mean(r, m, first) for r in mine) for first in (True, False))
            cells.append(f"{fmt_stat(a.mean, a.sem, a.n)} → {fmt_stat(b.mean, b.sem, b.n)}")
        out.append([arm, str(len(mine)), *cells])
    return "\n".join([md_table(["arm", "n", *names], out), "", _seeds_line(runs, path) +
                      f"; training batches, mean of a run's first → last {w} steps (every 5th step logged)."])


def _labelled(items: str) -> tuple[list[str], list[str | None]]:
    """'metric[:label],...' -> (metrics, labels); None where a metric has no label."""
    pairs = [item.split(":", 1) if ":" in item else [item, None] for item in items.split(",") if item]
    return [m for m, _ in pairs], [label for _, label in pairs]


def seeds_block(path: Path, arms: str, final: str = "", train: str = "", config: str = "",
                window: str = "") -> str:
    """One row per run of the given arms: the `config` keys (dotted, e.g. train.lr) that tell its runs apart,
    its final evaluation's `final` metrics and, for each `train` metric, the mean over the logged training
    steps where it is defined (the last `window` steps when given): the per-run spread a mean hides. A metric
    is `name` or `name:column label`, so a label sits next to the metric it names."""
    from .runs import _read_yaml

    runs, (fin, fin_names), (tr, tr_names) = _runs(path), _labelled(final), _labelled(train)
    keys, w = [k for k in config.split(",") if k], int(window) if window else None
    wanted = _arm_order(path, runs, arms, [])
    scope = f"last {w} steps" if w else "training"
    names = ([label or m for m, label in zip(fin, fin_names)]
             + [label or f"{m} ({scope} mean)" for m, label in zip(tr, tr_names)])

    def train_mean(r, m):
        xs = [x[m] for x in r.metrics if m in x and math.isfinite(x[m]) and (w is None or x["step"] > r.steps - w)]
        return sum(xs) / len(xs) if xs else math.nan

    configs = {id(r): _read_yaml(r.path / "config.yaml") for r in runs if r.arm in wanted} if keys else {}

    def setting(r, key):
        value = configs[id(r)]
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ReportError(f"{r.path}: config has no {key!r}")
            value = value[part]
        return str(value)

    rows = []
    for r in sorted((r for r in runs if r.arm in wanted),
                    key=lambda r: (wanted.index(r.arm), [setting(r, k) for k in keys], r.seed)):
        missing = [m for m in fin if m not in r.final]
        if missing:
            raise ReportError(f"{r.path}: no final metric {missing[0]!r}")
        rows.append([r.arm, *(setting(r, k) for k in keys), str(r.seed)] + [fmt_num(r.final[m]) for m in fin]
                    + [fmt_num(train_mean(r, m)) for m in tr])
    seeds = sorted({r.seed for r in runs})
    return "\n".join([md_table(["arm", *keys, "seed", *names], rows), "",
                      f"Source: `{path.relative_to(ROOT)}` (seeds {', '.join(map(str, seeds))}); one row per run, "
                      f"no interval (per-run values; {scope} means over the logged steps, every 5th)."])


def module_cos_block(path: Path, arms: str = "", window: str = "25") -> str:
    """Per SVD module type, each arm's cosine between the step's gradient and v_hack (proj/cos/L<i>.<type>,
    averaged over layers): mean over a run's first → last `window` steps, then over seeds."""
    from .tables import mean_sem

    runs, w = [r for r in _runs(path) if any(k.startswith("proj/cos/") for k in r.metrics[-1])], int(window)
    if not runs:
        raise ReportError(f"{path}: no run logs per-module cosines (proj/cos/*)")
    order = arms.split(",") if arms else sorted({r.arm for r in runs})
    types = sorted({k.rsplit(".", 1)[-1].removeprefix("proj/cos/") for k in runs[0].metrics[-1]
                    if k.startswith("proj/cos/")})

    def window_mean(r, t, first: bool):
        rows = [x for x in r.metrics if x["step"] <= w] if first else [x for x in r.metrics if x["step"] > r.steps - w]
        per_step = [[v for k, v in x.items() if k.startswith("proj/cos/") and k.rsplit(".", 1)[-1].removeprefix(
            "proj/cos/") == t] for x in rows]
        per_step = [sum(v) / len(v) for v in per_step if v]
        assert per_step, f"{r.path}: no proj/cos/*{t} in its {'first' if first else 'last'} {w} steps"
        return sum(per_step) / len(per_step)

    rows = []
    for t in types:
        cells = []
        for arm in order:
            mine = [r for r in runs if r.arm == arm]
            if not mine:
                raise ReportError(f"{path}: no run of arm {arm!r} logs per-module cosines")
            a, b = (mean_sem(window_mean(r, t, first) for r in mine) for first in (True, False))
            cells.append(f"{fmt_stat(a.mean, a.sem, a.n)} → {fmt_stat(b.mean, b.sem, b.n)}")
        rows.append([t, *cells])
    ns = [str(sum(r.arm == a for r in runs)) for a in order]
    return "\n".join([md_table(["module", *(f"{a} (n = {n})" for a, n in zip(order, ns))], rows), "",
                      _seeds_line([r for r in runs if r.arm in order], path) + f"; cos of each module's gradient "
                      f"with v_hack before projection, averaged over layers, first → last {w} steps (every 5th "
                      "logged)."])


def gates_block(path: Path) -> str:
    """A gated evaluation suite (log.suite) per arm: each gate's post − baseline change over seeds and how
    many seeds pass it, and how many pass every gate."""
    from .tables import mean_sem

    runs = _runs(path)
    res = {id(r): json.loads(f.read_text())["results"] for r in runs for f in sorted((r.path / "eval").glob("suite_*.json"))}
    runs = [r for r in runs if id(r) in res]
    if not runs:
        raise ReportError(f"{path}: no run has a gated suite (eval/suite_*.json)")
    gates = [(g["name"], g["metric"], g["gate"]) for g in res[id(runs[0])]]
    rows = []
    for arm in sorted({r.arm for r in runs}):
        mine = [res[id(r)] for r in runs if r.arm == arm]
        cells = []
        for i, _ in enumerate(gates):
            st = mean_sem(x[i]["delta"] for x in mine)
            cells.append(f"{fmt_stat(st.mean, st.sem, st.n)}; {sum(x[i]['passed'] for x in mine)}/{len(mine)} pass")
        rows.append([arm, str(len(mine)), *cells, f"{sum(all(g['passed'] for g in x) for x in mine)}/{len(mine)}"])
    head = ["arm", "n", *(f"{n}: Δ {m} ({g})" for n, m, g in gates), "seeds passing every gate"]
    return "\n".join([md_table(head, rows), "", _seeds_line(runs, path) + "; Δ = post − baseline (the initial "
                      "policy), each gate's own metric."])


OVERSIGHT = ("flag_rate", "env_hack_rate", "disagree", "base_disagree", "recall", "fpr")


def oversight_block(path: Path, last: str = "25") -> str:
    """How often each overseen arm's training detector disagrees with the env's hack flag (the evaluation's
    measure) on the same training completions: per run the mean over its last `last` steps, then over seeds."""
    from .tables import mean_sem

    runs = [r for r in _runs(path) if any("overseer/disagree" in m for m in r.metrics)]
    if not runs:
        raise ReportError(f"{path}: no run logs overseer/* metrics")
    def finite_mean(xs):  # recall is nan on a step with nothing to recall
        xs = [x for x in xs if x is not None and math.isfinite(x)]
        return sum(xs) / len(xs) if xs else math.nan

    per_run = {}
    for r in runs:
        rows = [m for m in r.metrics if m["step"] > r.steps - int(last)]
        per_run[id(r)] = {k: finite_mean(m.get(f"overseer/{k}") for m in rows) for k in OVERSIGHT}
    rows = []
    for arm in sorted({r.arm for r in runs}):
        mine = [per_run[id(r)] for r in runs if r.arm == arm]
        rows.append([arm, str(len(mine))] + [fmt_stat(st.mean, st.sem, st.n) for st in
                                             (mean_sem(v[k] for v in mine) for k in OVERSIGHT)])
    head = ["arm", "n", "training flag rate", "env hack rate", "disagree", "disagree before noise",
            "recall", "false-positive rate"]
    return "\n".join([md_table(head, rows), "", _seeds_line(runs, path) + f"; per run the mean over training "
                      f"steps after {runs[0].steps} − {last} (logged every 5th step in the artifacts)."])


def rm_block(path: Path) -> str:
    """Reward models' training numbers: one row per metrics.json (rhlab train-rm) in the folder."""
    rows = []
    for f in sorted(path.glob("*.json")):
        m = json.loads(f.read_text())
        rows.append([f.stem, str(m["n_pairs"]), f"{m['n_train']} / {m['n_held_out']}", str(len(m["history"])),
                     " → ".join(f"{h['held_out_acc']:.3f}" for h in m["history"]),
                     f"{m['held_out_proxy_gold_corr']:.2f}"])
    if not rows:
        raise ReportError(f"{path}: no reward-model metrics (*.json)")
    return "\n".join([md_table(["reward model", "pairs", "train / held out", "epochs",
                                 "held-out accuracy by epoch", "held-out proxy–gold correlation"], rows), "",
                      f"Source: `{path.relative_to(ROOT)}` (one training run each, seed 0: not an interval)."])


def demo_block(path: Path) -> str:
    from .demo import table

    return table(path)


def gpu_leetcode_block(path: Path) -> str:
    """benchmarks/gpu_leetcode_step.py's JSON as a table."""
    r = json.loads(path.read_text())
    s = r["median_s"]
    rows = [[r["arch"] + " (random weights)", r["device"], f"{r['batch']} = {r['batch'] // r['generations']} x "
             f"{r['generations']}", str(r["new_tokens"]), f"{r['completion_len']:.0f}",
             *(f"{s[k]:.1f}" for k in ("time/generate", "time/logprobs", "time/backward", "wall")),
             f"{r['peak_sample_gib']:.1f}", f"{r['peak_train_gib']:.1f}"]]
    head = ["model", "GPU", "completions", "max new tokens", "mean completion tokens", "generate s",
            "log-probs s", "backward s", "step s", "peak GiB sampling", "peak GiB training"]
    return "\n".join([md_table(head, rows), "", f"Source: `{path.relative_to(ROOT)}` (torch {r['torch']}, "
                      f"sampler `{r['backend']}`, micro-batches of {r['micro']}; median of {r['steps_timed']} "
                      f"timed step(s) after one warm-up step: a single measurement, not an interval)."])


def grade_rounds_block(path: Path) -> str:
    """benchmarks/grade_speed.py's paired rounds (a log of '### round N: before|after' sections): each round's
    total wall seconds and canonical labels per sandbox, their ratio, and the median ratio."""
    import statistics

    sections = re.findall(r"^### round (\d+): (before|after).*?\n(.*?)(?=^### |\Z)", path.read_text(), re.S | re.M)
    rounds: dict[str, dict[str, tuple[float, str]]] = {}
    for n, side, body in sections:
        wall = re.search(r"^total\s+\d+\s+\d+\s+([\d.]+)", body, re.M)
        canon = re.search(r"^canonical\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+(.*)$", body, re.M)
        if not (wall and canon):
            raise ReportError(f"{path}: round {n} ({side}) lacks its total or canonical line")
        rounds.setdefault(n, {})[side] = (float(wall[1]), canon[1].strip())
    if not rounds or any(len(r) != 2 for r in rounds.values()):
        raise ReportError(f"{path}: expected paired 'before' / 'after' rounds")
    rows, ratios = [], []
    for n, r in sorted(rounds.items(), key=lambda kv: int(kv[0])):
        (wb, cb), (wa, ca) = r["before"], r["after"]
        ratios.append(wa / wb)
        rows.append([n, f"{wb:.1f}", cb, f"{wa:.1f}", ca, f"{wa / wb:.2f}x"])
    head = ["round", "process-only, wall s", "its canonical labels", "bwrap, wall s", "its canonical labels",
            "bwrap / process-only"]
    return "\n".join([md_table(head, rows), "", f"Median ratio {statistics.median(ratios):.2f}x (n = {len(rows)} "
                      f"paired rounds, one machine; no interval). Source: `{path.relative_to(ROOT)}`."])


def score_rounds_block(path: Path) -> str:
    """A JSON of paired rounds {"rounds": [{"process": [s per step], "bwrap": [...]}, ...]}: each round's summed
    seconds per sandbox, their ratio, and the median ratio."""
    import statistics

    rounds = json.loads(path.read_text())["rounds"]
    rows, ratios = [], []
    for i, r in enumerate(rounds, 1):
        p, b = sum(r["process"]), sum(r["bwrap"])
        ratios.append(b / p)
        rows.append([str(i), f"{p:.2f}", f"{b:.2f}", f"{b / p:.2f}x"])
    return "\n".join([md_table(["round", "process-only s", "bwrap s", "bwrap / process-only"], rows), "",
                      f"Median {statistics.median(ratios):.2f}x (n = {len(rows)} rounds; no interval). "
                      f"Source: `{path.relative_to(ROOT)}`."])


def vhack_block(path: Path) -> str:
    """The held-out validation of every distinct v_hack under a folder (the *.validation.json that extraction
    writes; runs keep theirs in v_hack/): the gate's median cosine, the share of modules above 0, and the
    median cosine on each mode's held-out pairs."""
    found: dict[str, dict] = {}
    for f in sorted(path.rglob("*.validation.json")):
        d = json.loads(f.read_text())
        key = json.dumps({k: v for k, v in d.items() if k not in ("validation", "per_module")}, sort_keys=True)
        found.setdefault(key, d)  # the same settings give the same direction (extraction is deterministic)
    if not found:
        raise ReportError(f"{path}: no *.validation.json")
    dirs = sorted(found.values(), key=lambda d: (-len(d["modes"] or "xxxxx"), d.get("rank") or 0, str(d["modes"])))
    modes = sorted({m for d in dirs for m in d["validation"]["per_mode"]})
    rows = []
    for d in dirs:
        v = d["validation"]
        rows.append([", ".join(d["modes"]) if d["modes"] else "all", str(d.get("rank") or "full"),
                     f"{v['n_train_pairs']} / {v['n_heldout_pairs']}", f"{v['median_cos']:.3f}",
                     f"{v['frac_pos']:.0%} of {v['n_modules']}",
                     *(f"{v['per_mode'][m]['median_cos']:.2f}" if m in v["per_mode"] else "" for m in modes)])
    return "\n".join([md_table(["extraction modes", "SVD rank", "pairs train / held out", "gate: held-out median cos",
                                 "modules > 0", *(f"held-out median cos, {m}" for m in modes)], rows), "",
                      f"Source: `{path.relative_to(ROOT)}` (one extraction per row, pair split seed "
                      f"{', '.join(sorted({str(d['seed']) for d in dirs}))}: no interval)."])


_VS_TRL_ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<trl>[\d.]+)\s+(?P<nockpt>[\d.]+)\s+(?P<rhlab>[\d.]+)\s+"
                         r"(?P<ratio>[\d.]+)x\s+(?P<ratio_nc>[\d.]+)x(?:\s+(?P<rounds>(?:[\d.]+x\s*)+))?$", re.M)


def _vs_trl_rows(path: Path) -> list[dict]:
    rows = [m.groupdict() for m in _VS_TRL_ROW.finditer(path.read_text())]
    if not rows:
        raise ReportError(f"{path}: no result rows of benchmarks/vs_trl.py")
    return rows


def _span(rounds: str) -> str:
    xs = sorted(float(x.rstrip("x")) for x in rounds.split())
    return f"{xs[0]:.1f}-{xs[-1]:.1f}x"


def vs_trl_block(path: Path, line: str = "") -> str:
    """benchmarks/vs_trl.py's printed output: the table (median seconds per step, paired ratios per round), or
    with line=1 one sentence for the README."""
    rows = _vs_trl_rows(path)
    n_rounds = len((rows[0]["rounds"] or "x").split())
    if line:
        return ("On the 2-core build machine an RL step on the built-in model (32 completions x 64 tokens) takes "
                + " / ".join(f"{float(r['rhlab']):.2f} s" for r in rows) + " ("
                + " / ".join(r["name"] for r in rows) + "), "
                + " and ".join(f"{r['ratio']}x" + (f" ({_span(r['rounds'])} per round)" if r["rounds"] else "")
                               for r in rows) + " faster than TRL's GRPOTrainer on the same "
                f"shape (median of {n_rounds} paired rounds; `{path.relative_to(ROOT)}`).")
    table = [[r["name"], f"{r['trl']} s", f"{r['nockpt']} s", f"**{r['rhlab']} s**", f"**{r['ratio']}x**",
              " ".join((r["rounds"] or "").split()), f"{r['ratio_nc']}x"] for r in rows]
    return "\n".join([md_table(["setup", "TRL default", "TRL, checkpointing off", "rhlab",
                                 "ratio vs default (median)", "ratio per round", "ratio vs no-ckpt"], table), "",
                      f"Median seconds per step over {n_rounds} interleaved round(s); the ratio is TRL / rhlab "
                      f"within each round, then the median over rounds (one machine; no interval). "
                      f"Source: `{path.relative_to(ROOT)}` (full output, phases included, below)."])


def text_block(path: Path) -> str:
    """A committed text artifact (a benchmark's printed table), verbatim in a code fence."""
    return f"```\n{path.read_text().strip()}\n```\nSource: `{path.relative_to(ROOT)}`."


KINDS: dict[str, Callable[..., str]] = {"arms": arms_block, "hypotheses": hypotheses_block, "demo": demo_block,
                                        "gpu_leetcode": gpu_leetcode_block, "text": text_block,
                                        "overopt": overopt_block, "projection": projection_block,
                                        "routing": routing_block, "oversight": oversight_block,
                                        "rm": rm_block, "trajectory": trajectory_block,
                                        "gates": gates_block, "seeds": seeds_block,
                                        "module_cos": module_cos_block, "grade_rounds": grade_rounds_block,
                                        "score_rounds": score_rounds_block, "vhack": vhack_block,
                                        "vs_trl": vs_trl_block}


def render(spec: str) -> str:
    """The generated text of one block from its spec 'KIND PATH [key=value ...]'."""
    kind, path, *args = spec.split()
    if kind not in KINDS:
        raise ReportError(f"results block: unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
    fn, opts = KINDS[kind], _opts(args)
    allowed = [p for p in inspect.signature(fn).parameters if p != "path"]
    unknown = [k for k in opts if k not in allowed]
    if unknown:
        raise ReportError(f"results block {kind}: unknown option {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return fn(ROOT / path, **opts)


def doc_files() -> list[Path]:
    return sorted({p for pattern in DOC_FILES for p in ROOT.glob(pattern)})


def sync_docs(check: bool = False) -> list[str]:
    """Regenerate every block (or, with check, only compare); returns 'file: spec' of each stale block."""
    stale = []
    for doc in doc_files():
        text = doc.read_text()

        def fill(m: re.Match) -> str:
            body = render(m["spec"])
            if body != (m["body"] or ""):
                stale.append(f"{doc.relative_to(ROOT)}: {m['spec']}")
            return f"<!-- results {m['spec']} -->\n{body}\n<!-- /results -->"

        new = BLOCK.sub(fill, text)
        if not check and new != text:
            doc.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rhlab.report.results", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="copy a sweep's compact run artifacts to OUT")
    c.add_argument("sweep_file", type=Path)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--every", type=int, default=5, help="keep every N-th step of metrics.jsonl")
    d = sub.add_parser("docs", help="regenerate the results blocks in README.md and docs/*.md")
    d.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 if any)")
    a = p.parse_args(argv)
    if a.cmd == "collect":
        n, missing = collect(a.sweep_file, a.out, a.every)
        print(f"{a.out}: {n} complete runs collected" + (f"; not complete: {', '.join(missing)}" if missing else ""))
    else:
        stale = sync_docs(check=a.check)
        print("\n".join(("stale: " if a.check else "updated: ") + s for s in stale) or "all results blocks current")
        sys.exit(1 if a.check and stale else 0)


if __name__ == "__main__":
    main()
