"""What the package's files import, read from their source (nothing is imported)."""

import ast
from collections import deque
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "erpo_lightning"


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """`erpo_lightning/data/cache.py` -> `erpo_lightning.data.cache`; a folder's `__init__.py` is the folder."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports, at any depth (inside functions and under
    TYPE_CHECKING too). `from a import b` is an import of the module `a.b` when there is one, else of `a`; a name
    under a module (`a.b.C`) is its module's."""
    paths = {module_name(path, package): path for path in sorted(package.rglob("*.py"))}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's own package, up `level - 1` folders
                    parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{parent}.{base}" if base else parent
                targets |= {known(f"{base}.{alias.name}") or known(base) for alias in node.names}
        graph[name] = targets - {None, name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop of imports per group of modules that import each other (a strongly connected component), as
    `[a, b, ..., a]`; [] when the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_shortest_loop(graph, group) for group in groups]


def _shortest_loop(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path inside `group` from its first module back to itself."""
    start = min(group)
    came_from = {start: None}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module] & group):
            if target == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), start]
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    raise AssertionError(f"{sorted(group)} is not a strongly connected group")
