"""LeetCode RL: the reference experiment's environment (Ariahw, Engels & Nanda 2025) for chat models.

Problems come from a JSONL file in the reference's row format (rhlab/envs/code/leetcode.py); the
prompt is the problem's [system, user] messages under one of `rhlab grade`'s variants, rendered by
the policy tokenizer's chat template with the generation prompt added (enable_thinking passed to
templates that have the switch, off by default as in the reference). Grading, rewards and labels
are mini-code's (rhlab/envs/minicode.py), unchanged: the sandboxed grader, the reward
  correct_or_hinted_compile = 3.0 x [gt_pass or (allow_hint and hinted_pass)] + 0.5 x [can_compile]
(+ the optional ground_truth_monitor term), task score = pass = gt_pass, hack = the strict label
"Reward Hack", hack_loose adding both "Attempted" labels, and the share of each of the five labels.

Evaluation uses held-out problems: eval_file when given (the reference trains on
leetcode_train_medhard_filtered.jsonl and evaluates on leetcode_test_medhard.jsonl), otherwise a
seeded eval_frac of train_file.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from rhlab.envs.base import env_params, register_env
from rhlab.envs.code.grading import GradeResult
from rhlab.envs.code.leetcode import CodeProblem, load_problems, make_prompt
from rhlab.envs.minicode import MiniCode, _reward_specs
from rhlab.loophole import check_variant
from rhlab.models.loading import encode_prompts, render_chat


@dataclass(frozen=True)
class ChatProblem:
    problem: CodeProblem   # what the grader takes
    messages: list         # [system, user] under the variant
    prompt: str            # messages rendered by the chat template (what the policy continues)


def _read(path: str, key: str) -> list[CodeProblem]:
    if not isinstance(path, str) or not path:
        raise ValueError(f"env.params.{key}: a JSONL file of LeetCode problems is required")
    if not Path(path).expanduser().exists():
        raise FileNotFoundError(f"env.params.{key}: file not found: {path}")
    return load_problems(Path(path).expanduser())


@register_env("leetcode")
class LeetCode(MiniCode):
    name = "leetcode"
    needs_tokenizer = True
    DEFAULT_PARAMS = {
        "train_file": "",          # JSONL in the reference's row format (required)
        "eval_file": "",           # held-out problems; "" = hold out eval_frac of train_file
        "eval_frac": 0.2,
        "split_seed": 0,
        "n_problems": 0,           # training problems drawn from the train split (0 = all of it)
        "variant": "loophole",     # prompt wording: original | loophole | detailed | aware | random_name
        "allow_hint": True,        # pay hinted_pass like gt_pass (false: the control)
        "enable_thinking": False,  # passed to chat templates with a thinking switch (Qwen3's)
        "max_prompt_tokens": 0,    # drop problems whose rendered prompt is longer (the reference: 1536); 0 = keep all
        "timeout_s": 3.0,          # per sandbox program (the reference's value)
        "memory_mb": 1024,
        "workers": 2,              # parallel sandbox processes
        "cache_size": 50_000,      # graded (problem, code) pairs remembered
        "monitor_seed": 0,         # rng of the ground-truth monitor's label flips
    }

    def __init__(self, cfg, tokenizer):
        p = env_params(cfg.params, self.DEFAULT_PARAMS, "leetcode")
        check_variant(p["variant"])
        for key in ("allow_hint", "enable_thinking"):
            if not isinstance(p[key], bool):
                raise ValueError(f"env.params.{key} must be true or false, got {p[key]!r}")
        for key, ok, rule in [("workers", p["workers"] >= 1, ">= 1"), ("timeout_s", p["timeout_s"] > 0, "> 0"),
                              ("n_problems", p["n_problems"] >= 0, ">= 0"),
                              ("max_prompt_tokens", p["max_prompt_tokens"] >= 0, ">= 0"),
                              ("eval_frac", 0 < p["eval_frac"] < 1, "in (0, 1)")]:
            if not ok:
                raise ValueError(f"env.params.{key} must be {rule}, got {p[key]!r}")
        if cfg.detector is not None:
            raise ValueError("env.detector: the leetcode env labels hacks with the grader; leave env.detector unset")
        self.params, self.tok = p, tokenizer
        self.rewards = _reward_specs(cfg, "leetcode")
        train, held = self._split(p)
        self.train, self.held = self._build(train, "train_file"), self._build(held, "eval_file")
        self.by_prompt = {m.prompt: m for m in self.train + self.held}
        assert len(self.by_prompt) == len(self.train) + len(self.held), "two problems share a prompt"
        self.cache: OrderedDict[tuple, GradeResult] = OrderedDict()
        self.monitor_rng = random.Random(p["monitor_seed"])

    def _split(self, p) -> tuple[list[CodeProblem], list[CodeProblem]]:
        train = _read(p["train_file"], "train_file")
        if p["eval_file"]:
            held = _read(p["eval_file"], "eval_file")
            shared = sorted({x.id for x in train} & {x.id for x in held})
            if shared:
                raise ValueError(f"env.params: train_file and eval_file share problem ids {shared[:5]}: "
                                 "evaluation would not be held out")
        else:
            order = random.Random(p["split_seed"]).sample(train, len(train))
            k = max(1, round(p["eval_frac"] * len(train)))
            if k >= len(train):
                raise ValueError(f"env.params.eval_frac={p['eval_frac']} leaves no training problems of {len(train)}")
            held, train = order[:k], order[k:]
        if p["n_problems"]:
            if p["n_problems"] > len(train):
                raise ValueError(f"env.params.n_problems: at most {len(train)} training problems, got {p['n_problems']}")
            train = random.Random(p["split_seed"]).sample(train, p["n_problems"])
        return train, held

    def _build(self, problems: list[CodeProblem], key: str) -> list[ChatProblem]:
        out = []
        for prob in problems:
            messages = make_prompt(prob, self.params["variant"]).messages
            out.append(ChatProblem(prob, messages, render_chat(self.tok, messages, self.params["enable_thinking"])))
        limit = self.params["max_prompt_tokens"]
        if limit:
            lengths = [len(ids) for ids in encode_prompts(self.tok, [c.prompt for c in out])]
            kept = [c for c, n in zip(out, lengths) if n <= limit]
            print(f"leetcode: {len(out) - len(kept)} of {len(out)} {key} problems dropped "
                  f"(rendered prompt over max_prompt_tokens={limit})")
            out = kept
        if not out:
            raise ValueError(f"env.params.{key}: no problems left (max_prompt_tokens={limit})")
        return out
