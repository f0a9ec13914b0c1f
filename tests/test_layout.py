"""Modules sit where their layer says: no import circle between rhlab modules, no import upwards,
and a training loop that names no arm.

The import graph is read with ast from every module under rhlab/: every `import` and `from`
statement counts, at module level and inside functions alike (a lazy import is still a
dependency). An edge goes to the module named (`from rhlab.models import checkpoint` -> the
submodule); importing a submodule's parent packages implicitly is not counted.
"""

import ast
from pathlib import Path

RHLAB = Path(__file__).resolve().parents[1] / "rhlab"

# Bottom first: a module may import only from its own layer or a lower one. A module belongs to
# the layer of the longest prefix naming it ("rhlab" names only the package itself).
LAYERS = [
    ["rhlab", "rhlab.utils", "rhlab.registry", "rhlab.loophole", "rhlab.rundir"],
    ["rhlab.models", "rhlab.adapters", "rhlab.algos", "rhlab.rewards", "rhlab.eval.diversity", "rhlab.tracking"],
    ["rhlab.envs", "rhlab.rm.model", "rhlab.rm.pairs"],
    ["rhlab.interventions"],
    ["rhlab.config", "rhlab.components"],  # config checks names against every registered component
    ["rhlab.trainer", "rhlab.eval", "rhlab.report", "rhlab.sweep", "rhlab.rm", "rhlab.config_doc"],
    ["rhlab.cli", "rhlab.__main__"],
]
ARMS = ("routing", "projection", "screening", "monitor", "penalty")


def _modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package's __init__)."""
    out = {}
    for path in RHLAB.rglob("*.py"):
        parts = list(path.relative_to(RHLAB.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()

    def known(name: str) -> str:  # rhlab.x.y.SomeName -> the longest prefix that is a module
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for mod, (path, is_pkg) in mods.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names if a.name.split(".")[0] == "rhlab"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from .x import y
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] == "rhlab":
                    deps |= {known(f"{source}.{a.name}") for a in node.names}
        graph[mod] = deps - {mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer(mod: str) -> int:
    matches = [(len(p), i) for i, prefixes in enumerate(LAYERS) for p in prefixes
               if mod == p or (p != "rhlab" and mod.startswith(p + "."))]
    assert matches, f"{mod} is in no layer: add it to LAYERS in tests/test_layout.py"
    return max(matches)[1]


def test_the_graph_sees_lazy_relative_and_submodule_imports():
    g = import_graph()
    assert "rhlab.trainer" in g["rhlab.cli"]  # imported inside a command function
    assert "rhlab.report.runs" in g["rhlab.report.tables"]  # from .runs import ...
    assert "rhlab.models.checkpoint" in g["rhlab.trainer"]  # from rhlab.models import checkpoint
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_between_rhlab_modules():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{m} -> {d}" for m, deps in sorted(import_graph().items()) for d in sorted(deps)
              if layer(d) > layer(m)]
    assert not upward, "imports upwards: " + "; ".join(upward)


def test_the_training_loop_names_no_arm():
    text = (RHLAB / "trainer.py").read_text().lower()
    named = [arm for arm in ARMS if arm in text]
    assert not named, f"rhlab/trainer.py names arms {named}: arm logic belongs in rhlab/interventions/ (hooks)"
