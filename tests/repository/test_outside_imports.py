"""The scripts outside the package (bench/, studies/, scripts/) import only names the package has: a module moved or a
function renamed inside `erpo_lightning` breaks them silently otherwise, since no test runs most benches (a bench
imported a helper for a year after it was gone). Read from the scripts' source; the package modules are imported."""

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = ("bench", "studies", "scripts")


def package_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None for a plain `import`) of every `erpo_lightning` import in `path`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("erpo_lightning"):
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.startswith("erpo_lightning")]
    return found


def missing(module: str, name: str | None) -> str | None:
    """Why `from module import name` (or `import module`) fails, or None when it works."""
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        return f"no module {module} ({error})"
    if name is None or hasattr(imported, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def scripts() -> list[Path]:
    paths = [path for folder in OUTSIDE for path in sorted((REPO / folder).rglob("*.py"))]
    return [path for path in paths if not {"runs", "pilot_runs"} & set(path.relative_to(REPO).parts)]


def test_every_package_name_a_bench_study_or_script_imports_exists():
    paths = scripts()
    assert {path.relative_to(REPO).parts[0] for path in paths} == set(OUTSIDE) and len(paths) > 30
    broken = [
        f"{path.relative_to(REPO)}:{line}: {why}"
        for path in paths
        for line, module, name in package_imports(path)
        if (why := missing(module, name))
    ]
    assert not broken, "\n".join(broken)


def test_a_gone_name_is_named_with_its_file_and_line(tmp_path):
    script = tmp_path / "bench_old.py"
    script.write_text("import json\nfrom erpo_lightning.data.reference_logprobs import plan_chunks, right_padded\n")
    found = package_imports(script)
    assert found == [(2, "erpo_lightning.data.reference_logprobs", "plan_chunks"),
                     (2, "erpo_lightning.data.reference_logprobs", "right_padded")]  # fmt: skip
    assert [missing(module, name) for _, module, name in found] == [
        None, "erpo_lightning.data.reference_logprobs has no right_padded"
    ]  # fmt: skip
    assert missing("erpo_lightning.checkpointing", None).startswith("no module erpo_lightning.checkpointing")
    assert missing("erpo_lightning", "cli") is None  # a subpackage named in `from package import sub`
