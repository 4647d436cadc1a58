"""The layers' one direction: runners/ (installed as omni_cli.runners) never imports the rest of
omni_cli, and no two modules import each other, directly or through others.

Read from the source with ast (imports inside functions count too: a lazy import only hides
a cycle), not by importing, so a violation is found even on a path no test runs."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

# source folder -> the package name it installs as (pyproject.toml: package-dir)
ROOTS = {REPO / "omni_cli": "omni_cli", REPO / "runners": "omni_cli.runners"}


def _modules() -> dict[str, Path]:
    mods = {}
    for root, name in ROOTS.items():
        for path in root.rglob("*.py"):
            if root == REPO / "omni_cli" and "runners" in path.relative_to(root).parts:
                continue  # a checkout's omni_cli/runners link to runners/: counted under runners
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([name, *parts])] = path
    return mods


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every project module that `module`'s source imports, wherever in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule where there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t:
                found.add(t)
    return found - {module}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_runners_never_import_the_cli_layer():
    graph = _graph()
    bad = {m: sorted(t for t in ts if not t.startswith("omni_cli.runners") and t != "omni_cli")
           for m, ts in graph.items() if m.startswith("omni_cli.runners")}
    assert {m: ts for m, ts in bad.items() if ts} == {}
    assert any(t.startswith("omni_cli.runners") for m, ts in graph.items() if not m.startswith("omni_cli.runners")
               for t in ts), "the check found no import of runners from omni_cli: it reads nothing"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle():
    """The checker itself: a cycle through three modules, and a lazy import that closes one."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
