"""rhlab command line: demo, pretrain, train, eval, grade, report.

One error path: every anticipated failure (bad YAML, invalid config or option, a run directory
in use or holding another run, an unwritable folder) prints one line `error: ...` to stderr and
exits 2; an unexpected exception keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from rhlab.config import ConfigError, load_config
from rhlab.envs.code.isolation import IsolationUnavailable
from rhlab.rundir import RunDirError

try:  # recent typer vendors click; its usage errors are typer's own click's
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

PRESETS = Path(__file__).parent / "presets"
# Not a terminal (a pipe, a file, a log): no wrapping, so paths and table rows stay whole.
_TTY = sys.stdout.isatty()
console = Console() if _TTY else Console(width=10_000, soft_wrap=True)
ANTICIPATED = (ConfigError, RunDirError, IsolationUnavailable)  # the last: bwrap missing, from any command


def _one_line(msg: str) -> str:
    return "; ".join(line.strip() for line in str(msg).splitlines() if line.strip())


def _print_error(msg: str) -> None:
    print(f"error: {_one_line(msg)}", file=sys.stderr, flush=True)


def _fail(msg: str) -> None:
    _print_error(msg)
    raise typer.Exit(2)


class _OneErrorPath(TyperGroup):
    """Anticipated failures of any command, and click's usage errors, as one line and exit 2."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except ClickException as e:
            where = f"{e.ctx.command_path}: " if getattr(e, "ctx", None) is not None else ""
            _print_error(where + e.format_message())
            raise typer.Exit(e.exit_code) from None
        except PermissionError as e:
            _print_error(f"cannot write {e.filename}: permission denied" if e.filename else str(e))
            raise typer.Exit(2) from None
        except ANTICIPATED as e:
            _print_error(str(e))
            raise typer.Exit(2) from None


app = typer.Typer(cls=_OneErrorPath, add_completion=False, no_args_is_help=True,
                  help="rhlab: make a policy hack a reward on purpose, measure it, compare mitigations.")


def _rule(title: str) -> None:
    if _TTY:
        console.rule(title)
    else:  # a rule as wide as the (unbounded) console would be one very long line
        console.print(f"---- {title} ----", highlight=False, markup=False)


def _writable_dir(path: Path, what: str) -> Path:
    """Fail before the work when the folder could not be written: it (or the nearest existing parent,
    where it would be created) must be a directory this process can write into. Creates nothing."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        _fail(f"{what}: cannot create {path}: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        _fail(f"{what}: cannot write into {p}: permission denied")
    return path


def _at_least(value, low, option: str, strict: bool = False) -> None:
    """Bounds of a numeric option: value >= low (value > low when strict); NaN fails too."""
    if value is not None and not (value > low if strict else value >= low):
        _fail(f"{option} must be {'>' if strict else '>='} {low} (got {value})")


def _load(config: Optional[Path], overrides: List[str]):
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        _fail(str(e))


def _metrics_table(title: str, cols: dict[str, dict], keys: list[str]) -> Table:
    t = Table(title=title)
    t.add_column("metric")
    for c in cols:
        t.add_column(c, justify="right")
    for k in keys:
        t.add_row(k, *[f"{v[k]:.3f}" if k in v else "—" for v in cols.values()])
    return t


SHOW = ["reward_mean", "task_score", "pass_rate", "hack_rate", "kl", "distinct_2", "jaccard", "repetition",
        "completion_len"]


def _run(cfg, show_samples: int = 3) -> dict:
    from rhlab.trainer import Trainer

    if cfg.log.suite:  # a malformed suite fails now, not after training
        from rhlab.eval.suites import load_suite

        try:
            load_suite(cfg.log.suite)
        except ValueError as e:
            _fail(f"log.suite: {e}")
    try:
        trainer = Trainer(cfg)  # takes the run directory's lock first: a run dir in use fails at once
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"run: [bold]{trainer.name}[/]  ->  {trainer.dir}", highlight=False)
    summary = _train_interruptible(trainer)
    if not summary.get("final"):
        console.print("run already complete; nothing to do")
        return summary
    from rhlab.eval.trajectory import format_trajectory

    windows = {s["window"] for s in summary["trajectory"].values()}
    n = windows.pop() if len(windows) == 1 else "n"
    console.print(f"trajectory (training batches): first vs last {n} logged steps, EMAs over 20 and 50 steps")
    console.print(format_trajectory(summary["trajectory"]), highlight=False)
    console.print(_metrics_table("held-out evaluation: initial policy vs trained policy",
                                 {"before": summary["initial"], "after": summary["final"]}, SHOW))
    if show_samples:
        from rhlab.models.checkpoint import read_json

        first = read_json(trainer.dir / "eval" / "step_00000.json")["samples"]
        last = read_json(trainer.dir / "eval" / f"step_{cfg.train.steps:05d}.json")["samples"]
        for tag, samples in [("before", first), ("after", last)]:
            _rule(f"samples {tag} training")
            for s in samples[:show_samples]:
                console.print(f"[dim]{s['prompt']}[/] {s['completion']}  [cyan](reward {s['reward']:.2f}, "
                              f"task {s['task_score']:.2f}, hack {s['hack']})[/]", highlight=False)
    if cfg.log.suite:
        _suite_after_training(trainer.dir, cfg.log.suite)
    console.print(f"\nmetrics: {trainer.dir / 'metrics.jsonl'}\nplot:    {trainer.dir / 'plots' / 'training.png'}",
                  highlight=False)
    return summary


def _train_interruptible(trainer) -> dict:
    """trainer.train(); Ctrl-C or SIGTERM stop it with a line saying where and how to resume (exit 130)."""
    import threading

    def stop(signum, frame):
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread
    old = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        return trainer.train()
    except KeyboardInterrupt:
        from rhlab.models.checkpoint import latest, read_json

        last = latest(trainer.dir / "checkpoints")
        after = (f"from the checkpoint at step {read_json(last / 'state.json')['step']}" if last
                 else "from the start (no checkpoint yet)")
        print(f"interrupted at step {trainer.step}; resume with the same command (it continues {after})",
              file=sys.stderr, flush=True)
        raise typer.Exit(130) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)


def _suite_after_training(run_dir: Path, suite_path: str) -> None:
    """log.suite: the gated evaluation suite, initial policy vs the final checkpoint (saved in eval/)."""
    from rhlab.eval.suites import format_gate_table, run_suite_for_run, suite_passed

    try:
        results = run_suite_for_run(run_dir, suite_path)
    except (ValueError, FileNotFoundError) as e:
        _fail(f"log.suite: {e}")
    _rule(f"evaluation suite {suite_path}")
    console.print(format_gate_table(results), highlight=False)
    console.print("promotion gates: " + ("[green]passed[/]" if suite_passed(results) else "[red]FAILED[/]"))


@app.command()
def demo(steps: Optional[int] = typer.Option(None, help="override train.steps"),
         seed: Optional[int] = typer.Option(None, help="override the preset's seed"),
         output_dir: str = typer.Option("runs", help="where the run directory goes")):
    """Watch the built-in tiny model learn to hack the "happy" reward (a few minutes on a CPU)."""
    _at_least(steps, 1, "--steps")
    overrides = ([f"output_dir={output_dir}"] + ([f"train.steps={steps}"] if steps else [])
                 + ([f"seed={seed}"] if seed is not None else []))
    cfg = _load(PRESETS / "demo.yaml", overrides)
    summary = _run(cfg)
    fin, ini = summary.get("final", {}), summary.get("initial", {})
    if fin:
        console.print(f"\nhack rate {ini['hack_rate']:.0%} -> {fin['hack_rate']:.0%}, reward "
                      f"{ini['reward_mean']:.2f} -> {fin['reward_mean']:.2f}, task score "
                      f"{ini['task_score']:.2f} -> {fin['task_score']:.2f}", highlight=False)


@app.command()
def train(config: Path = typer.Argument(..., help="run config YAML"),
          overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides")):
    """Train one run from a config, e.g. `rhlab train configs/happy_vanilla.yaml train.lr=3e-4 seed=1`."""
    _run(_load(config, overrides or []))


@app.command()
def pretrain(out: Optional[Path] = typer.Option(None, help="output directory (default: the built-in model's)"),
             seed: int = typer.Option(0), steps: Optional[int] = typer.Option(None, help="default 800 (stories), 600 (code)"),
             corpus: str = typer.Option("stories", help="stories -> builtin:tiny-stories, code -> builtin:tiny-code"),
             threads: int = typer.Option(2),
             hack_share: Optional[float] = typer.Option(None, help="code corpus: share of loophole documents that "
                                                                   "overwrite run_tests (default 0.02; 0: none)")):
    """Pretrain a built-in tiny model (tokenizer + LLaMA) on one of rhlab's generated corpora."""
    if corpus not in ("stories", "code"):
        _fail(f"--corpus: unknown corpus {corpus!r}; allowed: stories, code")
    if hack_share is not None and (corpus != "code" or not 0 <= hack_share <= 0.99):
        _fail(f"--hack-share: {hack_share} needs --corpus code and a value in [0, 0.99]")
    _at_least(steps, 1, "--steps")
    _at_least(threads, 1, "--threads")
    if out is not None:
        _writable_dir(out, "--out")
    from rhlab.models.pretrain import PretrainConfig, code_pretrain_config
    from rhlab.models.pretrain import pretrain as run_pretrain

    builtin = Path(__file__).parent / "models" / "builtin"
    if corpus == "code":
        cfg = code_pretrain_config(seed=seed, steps=steps or 600, threads=threads,
                                   hack_share=0.02 if hack_share is None else hack_share)
    else:
        cfg = PretrainConfig(seed=seed, steps=steps or 800, threads=threads)
    info = run_pretrain(out or builtin / ("tiny-code" if corpus == "code" else "tiny-stories"), cfg)
    console.print(info)


@app.command("eval")
def eval_cmd(target: Path = typer.Argument(..., help="a run directory or one of its checkpoints"),
             prompts: int = typer.Option(64, help="number of held-out prompts"),
             samples: int = typer.Option(3, help="completions to print"),
             suite: Optional[Path] = typer.Option(None, help="evaluation suite YAML: gates on baseline vs trained; "
                                                             "exits 1 when a gate fails")):
    """Fresh samples from a trained policy: reward, task score, hack rate, diversity (or a gated suite)."""
    _at_least(prompts, 1, "--prompts")
    _at_least(samples, 0, "--samples")
    from rhlab.eval.evaluate import evaluate_checkpoint

    if suite is not None:
        from rhlab.eval.suites import format_gate_table, run_suite_for_run, suite_passed

        try:
            results = run_suite_for_run(target, suite)
        except (ValueError, FileNotFoundError) as e:
            _fail(str(e))
        console.print(format_gate_table(results), highlight=False)
        raise typer.Exit(0 if suite_passed(results) else 1)

    try:
        m, rows, where = evaluate_checkpoint(target, prompts)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(_metrics_table(f"evaluation of {where}", {"value": m}, [k for k in SHOW if k in m]))
    names = sorted({k.split("/")[0] for k in m if k.endswith("/hack_rate")})  # the intervention's extra modes
    modes = {n: {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith(n + "/")} for n in names}
    if modes:
        console.print(_metrics_table("intervention evaluation modes", modes,
                                     [k for k in SHOW if any(k in v for v in modes.values())]))
    for s in rows[:samples]:
        console.print(f"[dim]{s['prompt']}[/] {s['completion']}", highlight=False)


@app.command()
def report(runs: List[Path] = typer.Argument(..., help="run directories or folders holding them"),
           out: Path = typer.Option(..., "--out", help="output directory"),
           reference: Optional[str] = typer.Option(None, help="reference arm for delta SafePass (default vanilla)"),
           hypotheses: Optional[Path] = typer.Option(None, help="YAML of preregistered claims"),
           table: Optional[List[str]] = typer.Option(None, "--table", help="an extra table by name (repeatable): "
                                                     "projection, overopt, routing (rhlab/report/extra.py)")):
    """Tables (mean ± SEM by arm), hack-vs-pass Pareto plot, learning curves, hypothesis checks, HTML."""
    from rhlab.report import ReportError, build_report
    from rhlab.report.extra import check_table

    tables = table or []
    for name in tables:
        try:
            check_table(name)
        except ValueError as e:
            _fail(f"--table: {e}")
    _writable_dir(out, "--out")
    try:
        res = build_report(runs, out, reference_arm=reference, hypotheses_path=hypotheses)
    except ReportError as e:
        _fail(str(e))
    console.print(res["table_text"], highlight=False)
    for h in res.get("hypotheses") or []:
        console.print(f"hypothesis {h['name']}: [bold]{h['verdict']}[/]", highlight=False)
    _extra_tables(tables, list(runs), reference, out)
    console.print(f"report: {out / 'report.html'}", highlight=False)


@app.command()
def grade(problems: Path = typer.Argument(..., help="problems JSONL (rl-rewardhacking row format)"),
          completions: Path = typer.Argument(..., help='completions JSONL: {"id": ..., "completion": ...}'),
          variant: str = typer.Option("loophole", help="prompt variant the completions answered"),
          out: Optional[Path] = typer.Option(None, help="graded JSONL (default: COMPLETIONS.graded.jsonl)"),
          workers: Optional[int] = typer.Option(None, help="parallel sandboxes (default: one per core)"),
          timeout: float = typer.Option(3.0, help="CPU seconds per program (a problem's own timeout_s raises it)"),
          isolation: str = typer.Option("bwrap", help="bwrap (OS isolation) or process (no isolation; warns)")):
    """Grade code completions offline in the sandbox: compile, ground truth, own run_tests, hack labels."""
    _at_least(workers, 1, "--workers")
    _at_least(timeout, 0, "--timeout", strict=True)  # 0 would time every program out: all Incorrect
    from rhlab.envs.code.grading import format_summary, grade_files

    for p in (problems, completions):
        if not p.exists():
            _fail(f"file not found: {p}")
    out = out or completions.with_suffix(".graded.jsonl")
    _writable_dir(out.parent, "--out")
    try:
        summary = grade_files(problems, completions, variant, out, workers, timeout_s=timeout, isolation=isolation)
    except (ValueError, KeyError) as e:
        _fail(str(e))
    console.print(format_summary(summary), highlight=False)
    console.print(f"graded: {out}", highlight=False)


@app.command("train-rm")
def train_rm(config: Path = typer.Argument(..., help="reward-model config YAML (see configs/rm_happy.yaml)"),
             overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides"),
             out: Optional[Path] = typer.Option(None, help="output directory (default: out_dir in the config)")):
    """Train a Bradley-Terry reward model on gold-labelled preference pairs (for env.name=preference)."""
    from rhlab.rm.train import train_rm_cli

    if out is not None:
        _writable_dir(out, "--out")
    try:
        m = train_rm_cli(config, overrides or [], out)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print({k: v for k, v in m.items() if k != "history"})


@app.command()
def rlhf(config: Path = typer.Argument(..., help="policy run config with env.name=preference"),
         rm_config: Path = typer.Option(..., help="reward-model config YAML"),
         rm_only: bool = typer.Option(False, help="train the reward model and stop"),
         skip_rm: bool = typer.Option(False, help="use the saved reward model in the run config's env.params.rm_dir"),
         overrides: Optional[List[str]] = typer.Argument(None, help="overrides for the policy run")):
    """The pipeline: train the reward model, then optimise the policy against it."""
    from rhlab.rm.train import load_rm_config

    if rm_only and skip_rm:
        _fail("--rm-only and --skip-rm exclude each other")
    try:
        rm_dir = load_rm_config(rm_config).out_dir
    except (ConfigError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    if not skip_rm:
        _rule("reward model")
        train_rm(rm_config, [], None)
    if rm_only:
        return
    _rule("policy")
    _run(_load(config, [f"env.params.rm_dir={rm_dir}", *(overrides or [])]))


@app.command()
def overopt(run_dirs: List[Path] = typer.Argument(..., help="policy runs against a reward model, or folders holding them"),
            out: Path = typer.Option(Path("runs/overopt"), help="output directory"),
            source: str = typer.Option("train", help="train | eval: which metrics to fit"),
            kl_unit: str = typer.Option("sequence", help="sequence | token KL for d = sqrt(KL)")):
    """Fit gold = d (alpha - beta log d) over d = sqrt(KL); plot proxy and gold against d."""
    from rhlab.rm.overopt import overopt_report

    from rhlab.report.runs import ReportError, discover_run_dirs

    _writable_dir(out, "--out")
    try:
        run_dirs = discover_run_dirs(run_dirs)  # run directories, or folders holding them (a sweep's output_dir)
        res = overopt_report(run_dirs, out, source=source, kl_unit=kl_unit)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    table = Table(title=f"gold = y0 + α d − β d ln d per run ({source} metrics, d = sqrt({kl_unit} KL))")
    for col in ["run", "α", "β", "d* (peak)", "max d", "gold max (step)", "gold final", "over-optimised"]:
        table.add_column(col)
    for name, r in res["runs"].items():
        g = r["gold_fit"]
        table.add_row(name, f"{g['alpha']:.3g}", f"{g['beta']:.3g}", f"{g['d_peak']:.3g}", f"{r['max_d']:.3g}",
                      f"{r['gold_max_observed']:.3f} ({r['step_at_gold_max']})", f"{r['final_gold']:.3f}",
                      "yes" if r["overoptimised"] else "no")
    console.print(table)
    from rhlab.rm.overopt import arm_overopt_table

    try:  # by arm over seeds, when the runs carry config.yaml (the trainer's run directories do)
        console.print(arm_overopt_table(run_dirs), highlight=False)
    except (AssertionError, ReportError):
        pass
    console.print(f"fits: {out / 'overopt.json'}\nplot: {out / 'overopt.png'}", highlight=False)


def _pairs(items: List[str], what: str) -> dict:
    """--grid / --fixed key.path=value items (the run config's override syntax) -> {key.path: value}."""
    from rhlab.config import ConfigError, parse_override

    try:
        return {".".join(path): value for path, value in map(parse_override, items)}
    except ConfigError as e:
        _fail(f"--{what}: {e}")


@app.command()
def sweep(spec: Path = typer.Argument(..., help="sweep YAML (arms x grid x seeds)"),
          grid: Optional[List[str]] = typer.Option(None, help="key=v1,v2 adds a grid axis (repeatable)"),
          fixed: Optional[List[str]] = typer.Option(None, help="key=value applied to every run (repeatable)"),
          dry_run: bool = typer.Option(False, help="list the runs and exit"),
          backend: str = typer.Option("local", help="local | ray"),
          workers: Optional[int] = typer.Option(None, help="parallel local runs (default: the file's, else one per core)"),
          address: Optional[str] = typer.Option(None, help="Ray cluster address (default: start a local Ray)"),
          report_out: Optional[Path] = typer.Option(None, "--report", help="build the report here when done "
                                                    "(default: the sweep file's report.out, if any)"),
          no_report: bool = typer.Option(False, "--no-report", help="skip the sweep file's report section"),
          arm: Optional[List[str]] = typer.Option(None, "--arm", help="run only this arm (repeatable); the sweep "
                                                  "file's report, which compares every arm, is then skipped")):
    """Run arms x hyperparameters x seeds; complete runs are skipped, partial ones resumed; then report."""
    from rhlab.config import ConfigError
    from rhlab.sweep.grid import default_workers, expand, load_sweep
    from rhlab.sweep.runner import run_local, run_ray

    if backend not in ("local", "ray"):
        _fail(f"--backend {backend!r}; allowed: local, ray")
    _at_least(workers, 1, "--workers")
    extra_grid = {k: (v if isinstance(v, list) else [x.strip() for x in str(v).split(",")])
                  for k, v in _pairs(grid or [], "grid").items()}
    try:
        sp, base = load_sweep(spec, extra_grid, _pairs(fixed or [], "fixed"))
        runs = expand(sp, base)
    except ConfigError as e:
        _fail(str(e))
    n_workers = workers or default_workers(sp)
    n_points = len(runs) // len(sp.arms) // len(sp.seeds)
    if arm:
        unknown = [a for a in arm if a not in sp.arms]
        if unknown:
            _fail(f"--arm {unknown[0]!r} is not an arm of {spec}; allowed: {', '.join(sp.arms)}")
        runs, no_report = [r for r in runs if r.arm in arm], True
    n_arms = len(arm) if arm else len(sp.arms)
    console.print(f"{len(runs)} runs ({n_arms} arms x {n_points} grid points x {len(sp.seeds)} seeds) -> "
                  f"{sp.output_dir}", highlight=False)
    if dry_run:
        for r in runs:
            console.print(f"  {r.name}", highlight=False)
        return
    _writable_dir(Path(sp.output_dir), "output_dir")
    spec_report = sp.report if not no_report else None
    if report_out is not None or spec_report is not None:  # before hours of runs, not after
        _writable_dir(report_out or Path(spec_report.out), "--report" if report_out else "report.out")
    colour = {"failed": "red", "locked": "yellow"}
    done = lambda r: console.print(f"  [{colour.get(r.status, 'green')}]{r.status:>8}[/] "  # noqa: E731
                                   f"{r.name} ({r.seconds:.0f}s) {r.error}", highlight=False)
    results = (run_local(runs, n_workers, done) if backend == "local"
               else run_ray(runs, address, sp.gpus_per_run, done))
    console.print(_sweep_table(results, runs, list(sp.grid)))
    n_failed = sum(r.status == "failed" for r in results)
    if n_failed:
        console.print(f"[red]{n_failed} of {len(results)} runs failed[/] (logs under {sp.output_dir}/_logs)",
                      highlight=False)
    n_locked = sum(r.status == "locked" for r in results)
    if n_locked:
        console.print(f"[yellow]{n_locked} of {len(results)} runs are in use by another process[/] (left alone: "
                      "run the sweep again when they are done)", highlight=False)
    if report_out is not None or spec_report is not None:
        _sweep_report(sp, report_out)
    if n_failed or n_locked:
        raise typer.Exit(1)


def _sweep_table(results, runs, grid_keys: list[str]) -> Table:
    """One row per run: its arm, grid values and seed as columns (run names are too long to tell apart)."""
    planned = {r.name: r for r in runs}
    table = Table(title="sweep summary")
    for col in ["arm", *grid_keys, "seed", "status", "reward", "task", "pass", "hack", "kl", "s"]:
        table.add_column(col)
    for r in results:
        cfg = planned[r.name].config.dump()
        f = r.final
        table.add_row(r.arm, *[str(_get(cfg, k)) for k in grid_keys], str(r.seed), r.status,
                      *[f"{f[k]:.3f}" if k in f else "—" for k in
                        ("reward_mean", "task_score", "pass_rate", "hack_rate", "kl")], f"{r.seconds:.0f}")
    return table


def _get(d: dict, key: str):
    for k in key.split("."):
        d = d[k]
    return d


def _extra_tables(names: list[str], runs: list, reference: Optional[str], out: Path) -> None:
    """Registered report tables (rhlab/report/extra.py) by name: printed and written to OUT/NAME_table.md."""
    from rhlab.report.extra import TABLES

    for name in names:
        try:
            text = TABLES[name](runs, reference, out)
        except (ValueError, FileNotFoundError, AssertionError) as e:
            _fail(f"report table {name!r}: {e}")
        (out / f"{name}_table.md").write_text(text + "\n")
        console.print(f"\n[bold]{name}[/]\n{text}", highlight=False)


def _sweep_report(sp, out: Optional[Path]) -> None:
    """The sweep's report: `rhlab report` on its output_dir, plus the extra tables the file asks for."""
    from rhlab.report import ReportError, build_report
    from rhlab.sweep.grid import ReportSpec

    rs = sp.report or ReportSpec(out=str(out))
    out = out or Path(rs.out)
    try:
        res = build_report([sp.output_dir], out, reference_arm=rs.reference, hypotheses_path=rs.hypotheses)
    except ReportError as e:
        _fail(str(e))
    console.print(res["table_text"], highlight=False)
    for h in res.get("hypotheses") or []:
        console.print(f"hypothesis {h['name']}: [bold]{h['verdict']}[/]", highlight=False)
    _extra_tables(rs.tables, [sp.output_dir], rs.reference, out)
    console.print(f"report: {out / 'report.html'} (Pareto: {out / 'pareto.png'})", highlight=False)


@app.command("filter-prompts")
def filter_prompts(config: Path = typer.Argument(..., help="run config (its env and model)"),
                   out: Path = typer.Option(..., "--out", help="pool file to write (use as env.params.pool_file)"),
                   overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides"),
                   prompts: int = typer.Option(300, help="prompts of the env's pool to measure (the first N)"),
                   generations: int = typer.Option(8, help="completions per prompt"),
                   min_spread: float = typer.Option(0.02, help="keep prompts whose group-reward std exceeds this"),
                   buckets: int = typer.Option(3, help="difficulty buckets (3: hard / medium / easy)"),
                   by_profile: bool = typer.Option(True, help="rewrite env: bucket = profile/difficulty"),
                   seed: int = typer.Option(0, help="sampling seed")):
    """Difficulty filter: sample the initial policy on the env's prompts, drop prompts whose group
    rewards do not spread (no GRPO signal), cut the rest into difficulty buckets, save a pool file."""
    import tempfile

    _at_least(prompts, 1, "--prompts")
    _at_least(generations, 2, "--generations")  # a spread needs at least two completions per prompt
    _at_least(min_spread, 0, "--min-spread")
    _at_least(buckets, 1, "--buckets")
    _writable_dir(out.parent, "--out")
    from rhlab.envs.stratified import difficulty_filter, measure_group_rewards, rebucket, save_pool
    from rhlab.trainer import Trainer

    cfg = _load(config, (overrides or []) + ["log.progress=false"])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            trainer = Trainer(cfg, Path(tmp))
        except (ValueError, FileNotFoundError) as e:
            _fail(str(e))
        pool = getattr(trainer.env, "prompts", None)
        if not pool:
            _fail(f"env {cfg.env.name!r} has no prompt pool (env.prompts) to filter")
        groups = measure_group_rewards(trainer, trainer.env, list(dict.fromkeys(pool))[:prompts], generations, seed)
    res = difficulty_filter(groups, min_spread)
    if len(res.kept) < buckets:
        _fail(f"only {len(res.kept)} of {len(groups)} prompts have spread > {min_spread}: lower --min-spread")
    key = None
    if by_profile and cfg.env.name == "rewrite":
        from rhlab.envs.rewrite import profile_of
        key = profile_of
    pool_buckets = rebucket(res.kept, buckets, key=key)
    save_pool(out, pool_buckets)
    table = Table(title=f"difficulty filter: kept {len(res.kept)} of {len(groups)} prompts (spread > {min_spread})")
    for col in ["bucket", "prompts", "mean reward (min .. max)"]:
        table.add_column(col)
    for name, ps in pool_buckets.items():
        vals = [res.kept[p] for p in ps]
        table.add_row(name, str(len(ps)), f"{min(vals):.3f} .. {max(vals):.3f}")
    console.print(table)
    console.print(f"pool: {out}  (env.params.pool_file={out})", highlight=False)


@app.command("extract-direction")
def extract_direction(config: Path = typer.Argument(..., help="run config with intervention svd_projection"),
                      overrides: Optional[List[str]] = typer.Argument(None, help="key.path=value overrides"),
                      out: Optional[Path] = typer.Option(None, help="v_hack file (default: the cached path training uses)")):
    """Extract v_hack from contrastive pairs (gradient side), validate it on held-out pairs, save it."""
    from rhlab.interventions.direction import GATE_FRAC, DirectionError
    from rhlab.interventions.projection import extract_for_config

    try:
        path, meta = extract_for_config(_load(config, overrides or []), out)
    except (ValueError, FileNotFoundError, DirectionError) as e:
        _fail(str(e))
    val = meta["validation"]
    console.print(f"v_hack: {path}\nheld-out: median cos {val['median_cos']:.3f}, {val['frac_pos']:.0%} of "
                  f"{val['n_modules']} modules > 0 (gate {GATE_FRAC:.0%}); per mode: " + ", ".join(
                      f"{m} {v['median_cos']:.2f}" for m, v in val["per_mode"].items()), highlight=False)
    if val["frac_pos"] < GATE_FRAC:
        _fail("validation gate failed: training with this direction refuses to start")


def main() -> None:  # pragma: no cover
    sys.exit(app())
