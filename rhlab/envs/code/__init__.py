"""Code environment: LeetCode problems with the run_tests() loophole, a sandbox, and the grader."""

from .grading import (
    LABELS, GradeResult, correct_or_hinted_compile, extract_code, format_summary, grade_batch,
    grade_completion, grade_files, ground_truth_monitor_penalty,
)
from rhlab.loophole import VARIANTS

from .leetcode import CodeProblem, Prompt, eval_func_name, load_problems, make_prompt
from .sandbox import Program, SandboxResult, StatementTest, ValueTest, run_many, run_program

__all__ = [
    "LABELS", "GradeResult", "correct_or_hinted_compile", "extract_code", "format_summary", "grade_batch",
    "grade_completion", "grade_files", "ground_truth_monitor_penalty", "VARIANTS", "CodeProblem", "Prompt",
    "eval_func_name", "load_problems", "make_prompt", "Program", "SandboxResult", "StatementTest",
    "ValueTest", "run_many", "run_program",
]
