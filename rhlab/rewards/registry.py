"""Name -> factory registries for rewards and hack detectors, bound to YAML params.

A reward factory takes keyword params and returns fn(prompts, completions) -> list[float].
A detector factory returns fn(prompts, completions) -> list[bool].
Names may also be patterns (e.g. sentence_length_5): a resolver turns a name into
(factory, implied params). Unknown names and params fail loudly, naming the allowed values.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable

RewardFn = Callable[[list[str], list[str]], list[float]]
DetectorFn = Callable[[list[str], list[str]], list[bool]]


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self.exact: dict[str, Callable] = {}
        self.patterns: list[tuple[re.Pattern, Callable, str]] = []

    def register(self, name: str):
        def deco(factory):
            assert name not in self.exact, f"{self.kind} {name!r} registered twice"
            self.exact[name] = factory
            return factory
        return deco

    def register_pattern(self, regex: str, example: str):
        """factory receives the regex's named groups (as ints where numeric) plus params."""
        def deco(factory):
            self.patterns.append((re.compile(regex), factory, example))
            return factory
        return deco

    def allowed(self) -> str:
        return ", ".join(sorted(self.exact) + [ex for _, _, ex in self.patterns])

    def build(self, name: str, params: dict | None = None):
        from rhlab.envs.base import load_builtin_envs

        load_builtin_envs()

        params = dict(params or {})
        if name in self.exact:
            return _call(self.exact[name], params, self.kind, name)
        for regex, factory, _ in self.patterns:
            m = regex.fullmatch(name)
            if m:
                implied = {k: int(v) if v.isdigit() else v for k, v in m.groupdict().items()}
                return _call(factory, {**implied, **params}, self.kind, name)
        raise ValueError(f"unknown {self.kind} {name!r}; allowed: {self.allowed()}")


def _call(factory, params: dict, kind: str, name: str):
    sig = inspect.signature(factory)
    unknown = set(params) - set(sig.parameters)
    if unknown:
        raise ValueError(f"{kind} {name!r}: unknown params {sorted(unknown)}; "
                         f"allowed: {sorted(sig.parameters)}")
    return factory(**params)


REWARDS = Registry("reward")
DETECTORS = Registry("hack detector")
