"""The package's imports (docs/architecture.md, "Layers"): no loop, at any depth; imports point up (the Layers table's
order; only the CLI imports the callbacks, nothing imports the CLI); nothing of the repository's studies or benches;
a root of at most three modules and folders that each say what they are for."""

import ast
import re
import subprocess
from pathlib import Path

import pytest
from helpers.imports import PACKAGE, import_cycles, import_graph, imported_modules

CLI, CALLBACKS = "erpo_lightning.cli", "erpo_lightning.callbacks"  # the top two layers


def test_the_package_has_no_import_loop():
    """Every import counts: at the top of a file, inside a function, under TYPE_CHECKING."""
    graph = import_graph()
    assert len(graph) > 100
    loops = [" -> ".join(loop) for loop in import_cycles(graph)]
    assert loops == [], f"import loops: {'; '.join(loops)}"


def test_the_loop_finder_names_a_loop_through_a_function_and_a_folder(tmp_path):
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.inner import b\n")
    (package / "inner" / "b.py").write_text("def f():\n    from pkg.a import g\n")
    (package / "c.py").write_text("from pkg import a\n")
    assert import_cycles(import_graph(package)) == [["pkg.a", "pkg.inner.b", "pkg.a"]]


def test_the_package_imports_no_study_or_bench():
    found = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in imported_modules(path)
        if name.split(".")[0] in ("studies", "bench")
    }
    assert not found, sorted(found)


def test_only_the_cli_imports_the_callbacks_and_nothing_imports_the_cli():
    upward = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        above = {"cli": (), "callbacks": (CLI,)}.get(path.relative_to(PACKAGE).parts[0], (CLI, CALLBACKS))
        upward |= {f"{path.relative_to(PACKAGE)}: {name}" for name in imported_modules(path) if name.startswith(above)}
    assert not upward, sorted(upward)


def test_the_root_holds_three_modules_at_most_and_every_folder_says_its_job():
    assert len(list(PACKAGE.glob("*.py"))) <= 3, sorted(path.name for path in PACKAGE.glob("*.py"))
    folders = sorted({path.parent for path in PACKAGE.rglob("*.py")} - {PACKAGE})
    assert len(folders) >= 15
    for folder in folders:
        init = folder / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text())) if init.is_file() else None
        assert docstring, f"{folder.relative_to(PACKAGE)}/ has no __init__.py opening with what the folder is for"


WHOLE_FOLDERS = ("objectives", "rewards", "toy")  # the Layers table describes these folders, not each file


def layers_section() -> str:
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    return text.split("## Layers", 1)[1].split("\n## ", 1)[0]


def test_the_layer_table_names_every_module():
    """docs/architecture.md's Layers table names each tracked module (by file name), or the folder it belongs to."""
    tracked = subprocess.run(["git", "-C", str(PACKAGE.parent), "ls-files", "erpo_lightning/*.py"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    if not tracked:
        pytest.skip("not a git checkout")
    table = layers_section()
    unnamed = [
        path
        for path in tracked
        if Path(path).name not in ("__init__.py", "__main__.py")
        and f"`{Path(path).name}`" not in table
        and not any(f"`{folder}/`" in table for folder in Path(path).parent.parts[1:2] if folder in WHOLE_FOLDERS)
    ]
    assert unnamed == [], f"docs/architecture.md's Layers table does not name {unnamed}"


def test_each_layer_imports_only_from_its_row_and_the_rows_above():
    """The Layers table's order is the import order: a folder (or root module) imports its own row's and the rows
    above it, never a row below."""
    rows = [line.split("|")[2] for line in layers_section().splitlines() if line.startswith("| ") and "`" in line]
    row_of = {part: row for row, cell in enumerate(rows) for part in re.findall(r"`([\w.]+)/?`", cell)}
    assert len(row_of) >= 17

    def place(module: str) -> str:
        parts = module.split(".")
        return parts[1] if (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"

    graph = import_graph()
    unplaced = sorted({place(module) for module in graph if module != "erpo_lightning"} - row_of.keys())
    assert unplaced == [], f"the Layers table has no row for {unplaced}"
    downward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module != "erpo_lightning"
        for target in targets
        if row_of[place(target)] > row_of[place(module)]
    )
    assert downward == [], f"imports of a row below: {downward}"
