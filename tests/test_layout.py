"""The package's layout: a few entry points at the top of ``uniclr_tf/``, everything else in a
package by concern, and imports that flow one way (no module imports itself through others when the
package loads).

Read from the source (``ast``), so these tests import nothing of the package."""

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "uniclr_tf"
TOP_LEVEL = {"__init__", "train", "launch", "linear_eval", "finetune", "export"}


def _modules():
    """``{dotted name: path}`` of every module and package of uniclr_tf."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _load_time_imports(tree):
    """The import statements that run when the module loads: at module level and in class bodies,
    not inside functions (those run later, once every module has loaded)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def _import_graph():
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _load_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level == 0 and node.module:
                # `from P import x`: the module P.x when x is one, else P itself
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                targets = []
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_only_entry_points_sit_at_the_top_of_the_package():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL, f"modules at the top of uniclr_tf/ beyond the entry points: {sorted(top - TOP_LEVEL)}"
    for name in TOP_LEVEL - {"__init__"}:
        source = (PACKAGE / f"{name}.py").read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 12, f"uniclr_tf/{name}.py should only forward to its package"


def test_no_module_imports_itself_through_others_when_the_package_loads():
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles at load time: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
