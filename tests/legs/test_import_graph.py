"""The leg producers' import graph has no cycle.

Every `import` and `from ... import` in tica/legs/**/*.py counts, at module level or inside a
function: a function-level import that closes a cycle still runs the two modules' top levels in
an order that depends on who is imported first. Parsed with ast, nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "tica" / "legs"


def module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def legs_modules(repo: Path, root: Path) -> dict[str, Path]:
    return {module_name(p, repo): p for p in sorted(root.rglob("*.py"))}


def imported_names(path: Path, name: str, known: set[str]) -> set[str]:
    """The tica.legs modules `path` (module `name`) imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            for alias in node.names:  # `from pkg import submodule` imports pkg.submodule
                out.add(f"{target}.{alias.name}")
    # keep tica.legs modules only (a name imported from a module is not one), not the module itself
    return {m for m in out if m in known and m != name}


def import_graph(repo: Path = REPO, root: Path = ROOT) -> dict[str, set[str]]:
    """Each tica.legs module and the tica.legs modules it imports."""
    mods = legs_modules(repo, root)
    known = set(mods)
    return {name: imported_names(path, name, known) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (iterative three-colour DFS)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {n: WHITE for n in graph}
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = GREY
        while stack:
            node, children = stack[-1]
            for child in children:
                if colour.get(child, BLACK) == GREY:
                    return path[path.index(child):] + [child]
                if colour.get(child) == WHITE:
                    colour[child] = GREY
                    path.append(child)
                    stack.append((child, iter(sorted(graph.get(child, ())))))
                    break
            else:
                colour[node] = BLACK
                path.pop()
                stack.pop()
    return None


def test_the_leg_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert "tica.legs.vllm_kernels.producers" in graph and "tica.legs.trainers" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_function_level_and_relative_imports():
    """The imports the cycles of issue 14 hid in: absolute inside a function (trainers imports
    megatron_trainer in load_trainer), relative inside a function (the launcher's `from .tp import`),
    and a submodule named by `from . import legio`."""
    graph = import_graph()
    assert "tica.legs.megatron_trainer" in graph["tica.legs.trainers"]
    assert "tica.legs.vllm_kernels.tp" in graph["tica.legs.vllm_kernels.launcher"]
    assert "tica.legs.vllm_kernels.legio" in graph["tica.legs.vllm_kernels.tp"]  # `from . import legio`


def test_the_cycle_finder_finds_a_planted_cycle():
    """Negative control of the search: a cycle three modules long is found; with one edge cut, none."""
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(planted) == ["a", "b", "c", "a"]
    assert find_cycle({**planted, "c": set()}) is None


def test_the_parser_finds_a_planted_function_level_cycle(tmp_path):
    """Negative control of the parsing: a relative import inside a function closing a cycle with a
    module-level `from package import submodule` is a cycle; without that import, none."""
    pkg = tmp_path / "tica" / "legs"
    (pkg / "sub").mkdir(parents=True)
    for p in (tmp_path / "tica", pkg, pkg / "sub"):
        (p / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from tica.legs.sub import two\nx = 1\n")
    (pkg / "sub" / "two.py").write_text("def f():\n    from ..one import x\n    return x\n")
    assert find_cycle(import_graph(tmp_path, pkg)) == ["tica.legs.one", "tica.legs.sub.two", "tica.legs.one"]
    (pkg / "sub" / "two.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path, pkg)) is None
