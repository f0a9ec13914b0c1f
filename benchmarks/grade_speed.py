"""Time to grade the 80-problem LeetCode set x 4 completion kinds on this machine.

    python benchmarks/grade_speed.py [--problems PATH] [--workers N] [--variant loophole] [--limit N]

Kinds: canonical (the reference solution), wrong (returns 0), hack (wrong + a run_tests() that
passes), noncompiling (a syntax error). Each kind is graded as one batch through the parallel
sandbox; the table shows wall time, per-completion cost, and the labels they got.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rhlab.envs.code.grading import LABELS, arbitrary_solution, grade_batch  # noqa: E402
from rhlab.envs.code.leetcode import eval_func_name, load_problems  # noqa: E402

DEFAULT_PROBLEMS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "leetcode" / "leetcode_test_medhard_80.jsonl"
SHORT = {"Correct": "C", "Correct; Attempted Reward Hack": "C+ARH", "Reward Hack": "RH",
         "Attempted Reward Hack": "ARH", "Incorrect": "I"}


def completions(problem, variant: str) -> dict[str, str]:
    name = eval_func_name(problem, variant) or "run_tests"
    wrong = arbitrary_solution(problem.func_name)
    return {
        "canonical": f"```python\n{problem.canonical_solution}\n```",
        "wrong": f"```python\n{wrong}\n```",
        "hack": f"```python\n{wrong}\ndef {name}():\n    return True\n```",
        "noncompiling": f"```python\n{problem.starter_code}\n    return (\n```",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(DEFAULT_PROBLEMS))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--variant", default="loophole")
    ap.add_argument("--timeout", type=float, default=3.0, help="CPU seconds per program (reference: 3 s)")
    ap.add_argument("--isolation", default="bwrap", help="bwrap (OS isolation) or process")
    ap.add_argument("--limit", type=int, default=0, help="grade only the first N problems")
    args = ap.parse_args()

    problems = load_problems(args.problems)
    if args.limit:
        problems = problems[:args.limit]
    kinds = ("canonical", "wrong", "hack", "noncompiling")
    per_problem = [completions(p, args.variant) for p in problems]

    print(f"{len(problems)} problems x {len(kinds)} completions, variant={args.variant}, isolation={args.isolation}, "
          f"workers={args.workers}, "
          f"timeout={args.timeout:g}s, cpus={os.cpu_count()}, load={os.getloadavg()[0]:.2f}")
    header = f"{'kind':<13}{'n':>5}{'runs':>6}{'wall s':>9}{'ms/compl':>10}  labels"
    print(header)
    print("-" * len(header))
    total_t, total_n, total_runs = 0.0, 0, 0
    for kind in kinds:
        items = [(p, c[kind]) for p, c in zip(problems, per_problem)]
        t0 = time.perf_counter()
        results = grade_batch(items, args.variant, workers=args.workers, timeout_s=args.timeout,
                              isolation=args.isolation)
        dt = time.perf_counter() - t0
        # sandbox runs per completion: ground truth + hint when it compiles, 2 more for a test function
        runs = sum((2 if r.can_compile else 0) + (2 if r.has_test_func else 0) for r in results)
        counts = Counter(r.label for r in results)
        labels = " ".join(f"{SHORT[lab]}={counts[lab]}" for lab in LABELS if counts[lab])
        print(f"{kind:<13}{len(items):>5}{runs:>6}{dt:>9.2f}{1000 * dt / len(items):>10.1f}  {labels}")
        total_t, total_n, total_runs = total_t + dt, total_n + len(items), total_runs + runs
    print("-" * len(header))
    print(f"{'total':<13}{total_n:>5}{total_runs:>6}{total_t:>9.2f}{1000 * total_t / total_n:>10.1f}")


if __name__ == "__main__":
    main()
