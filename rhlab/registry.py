"""Registries: a name (or a name pattern) -> a factory, whose params come from YAML.

A factory's keyword parameters (annotations and defaults) are its declared params: check()
validates a config's params against them at config load, before anything is built. Unknown
names and params fail loudly, naming the allowed values. A component registers itself when its
module is imported; rhlab.components imports every built-in one, and a lookup imports it first
(by name, at run time: this bottom layer imports nothing above it), so a name resolves whatever
the caller imported.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from typing import Any, Callable, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from rhlab.utils import format_validation_error


@functools.cache
def _load_builtins() -> None:
    importlib.import_module("rhlab.components")


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
        _load_builtins()
        return ", ".join(sorted(self.exact) + [ex for _, _, ex in self.patterns])

    def resolve(self, name: str, params: dict | None = None) -> tuple[Callable, dict]:
        """(factory, params including those a pattern name implies)."""
        _load_builtins()
        params = dict(params or {})
        if name in self.exact:
            return self.exact[name], params
        for regex, factory, _ in self.patterns:
            m = regex.fullmatch(name)
            if m:
                implied = {k: int(v) if v.isdigit() else v for k, v in m.groupdict().items()}
                return factory, {**implied, **params}
        raise ValueError(f"unknown {self.kind} {name!r}; allowed: {self.allowed()}")

    def build(self, name: str, params: dict | None = None):
        factory, params = self.resolve(name, params)
        return _call(factory, params, self.kind, name)

    def check(self, name: str, params: dict | None, where: str) -> None:
        """Validate params against the factory's declared ones; one-line ValueError naming the key."""
        try:
            factory, params = self.resolve(name, params)
        except ValueError as e:
            raise ValueError(f"{where}.name: {e}") from None
        validate_params(params_model(factory), params, f"{where}.params", f"{self.kind} {name!r}")


def _call(factory, params: dict, kind: str, name: str):
    sig = inspect.signature(factory)
    unknown = set(params) - set(sig.parameters)
    if unknown:
        raise ValueError(f"{kind} {name!r}: unknown params {sorted(unknown)}; "
                         f"allowed: {sorted(sig.parameters)}")
    return factory(**params)


@functools.cache
def params_model(factory: Callable) -> type[BaseModel]:
    """A factory's keyword parameters as a pydantic model (unknown keys forbidden)."""
    fn = factory.__init__ if inspect.isclass(factory) else factory
    hints = get_type_hints(fn)
    fields = {n: (hints.get(n, Any), ... if p.default is p.empty else p.default)
              for n, p in inspect.signature(factory).parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return create_model(f"{factory.__name__}_params", __config__=ConfigDict(extra="forbid",
                        arbitrary_types_allowed=True), **fields)


def validate_params(model: type[BaseModel], params: dict, where: str, what: str) -> BaseModel:
    """params as `model`; a one-line ValueError naming each bad key under `where` (unknown: with the allowed
    ones; missing; mistyped: with what was given) and `what` they are for."""
    try:
        return model.model_validate(params)
    except ValidationError as err:
        raise ValueError(format_validation_error(err, model, where, what)) from None
