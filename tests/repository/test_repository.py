"""The repository stands alone: its code reads no path outside it, and the package ships its benchmark files."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from erpo_lightning.data.sources import BENCHMARK_DIR, REGISTRY, DataError, load_queries

REPO = Path(__file__).resolve().parents[2]
CODE_DIRS = ("erpo_lightning", "tests", "bench", "studies")


def _python_files() -> list[Path]:
    return sorted(path for folder in CODE_DIRS for path in (REPO / folder).rglob("*.py"))


def _anchored_paths(tree: ast.AST, source: Path) -> list[tuple[int, Path]]:
    """Each `Path(__file__)...parents[k]` / `.parent` chain in a module, with the folder it resolves to."""
    found = []
    for node in ast.walk(tree):
        levels, current = 0, node
        while True:
            if isinstance(current, ast.Subscript):
                parents = current.value
                if isinstance(parents, ast.Attribute) and parents.attr == "parents":
                    if isinstance(current.slice, ast.Constant) and isinstance(current.slice.value, int):
                        levels += current.slice.value + 1
                    current = parents.value
                else:
                    current = parents
            elif isinstance(current, ast.Attribute):
                levels += current.attr == "parent"
                current = current.value
            elif isinstance(current, ast.Call) and isinstance(current.func, ast.Attribute):
                current = current.func  # .resolve() / .absolute()
            else:
                break
        is_anchor = isinstance(current, ast.Call) and isinstance(current.func, ast.Name) and current.func.id == "Path"
        if is_anchor and current.args and isinstance(current.args[0], ast.Name) and current.args[0].id == "__file__":
            if levels and node is not current:
                found.append((node.lineno, source.resolve().parents[levels - 1]))
    return found


def test_no_code_reads_a_path_outside_the_repository():
    offenders = []
    for path in _python_files():
        text = path.read_text()
        for lineno, folder in _anchored_paths(ast.parse(text), path):
            if REPO != folder and REPO not in folder.parents:
                offenders.append(f"{path.relative_to(REPO)}:{lineno} resolves to {folder}")
        for lineno, line in enumerate(text.splitlines(), start=1):
            if re.search(r"""["'][^"']*(\.\./|/shared/)""", line) and "test_repository.py" not in str(path):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert offenders == [], "code reaching outside the repository:\n" + "\n".join(offenders)


def test_no_code_edits_the_import_path():
    """Studies run as `python -m studies.<name>` and tests import them through pytest's `pythonpath`: nothing puts a
    folder on the import path itself."""
    edits = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+=|=)|site\.addsitedir")
    offenders = [f"{path.relative_to(REPO)}:{lineno}: {line.strip()}" for path in _python_files()
                 for lineno, line in enumerate(path.read_text().splitlines(), start=1)
                 if edits.search(line) and path.name != "test_repository.py"]  # fmt: skip
    assert offenders == [], "code editing the import path:\n" + "\n".join(offenders)


def _tracked(folder: str) -> list[str]:
    done = subprocess.run(["git", "-C", str(REPO), "ls-files", folder], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_docs_tracks_user_pages_only():
    """Study plans, reports, claims, figures and runs live in studies/<name>/; docs/ holds the user pages."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    others = [name for name in _tracked("docs") if not re.fullmatch(r"docs/[a-z_]+\.md", name)]
    assert others == [], f"docs/ tracks files other than its pages: {others[:10]}"


# Test files still importing another test file's helpers, each left while that file was being edited (issue 42).
IMPORTS_LEFT: set[tuple[str, str]] = set()  # none: shared set-up lives in tests/helpers/


def test_test_files_share_helpers_through_tests_helpers_not_each_other():
    """What several test files use lives in tests/helpers/ (imported as `helpers.<module>`)."""
    found = set()
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found |= {(path.name, name) for name in names if name.split(".")[0].startswith("test_")}
    assert found <= IMPORTS_LEFT, sorted(found - IMPORTS_LEFT)


def test_the_bench_index_lists_every_script():
    """bench/README.md names each script in bench/ (what it measures, its command, its last figure)."""
    index = (REPO / "bench" / "README.md").read_text()
    scripts = sorted(path.name for path in (REPO / "bench").iterdir() if path.suffix in (".py", ".sh"))
    assert [name for name in scripts if f"`{name}`" not in index] == []


def test_the_path_scan_would_catch_an_escape(tmp_path):
    escape = REPO / "tests" / "x.py"  # not written: the scan works on the parsed text
    tree = ast.parse('DATA = Path(__file__).resolve().parents[2] / "beside_the_clone"\nA = Path(__file__).parent\n')
    folders = [folder for _, folder in _anchored_paths(tree, escape)]
    assert sorted(folders) == [REPO.parent, REPO / "tests"]


def _readme_row_counts() -> dict[str, int]:
    rows = re.findall(r"^\| (\w+)\.jsonl \| (\d+) \|", (BENCHMARK_DIR / "README.md").read_text(), re.M)
    return {name: int(count) for name, count in rows}


def test_every_packaged_benchmark_reads_offline_by_name_with_its_documented_row_count():
    counts = _readme_row_counts()
    assert sorted(counts) == sorted(path.stem for path in BENCHMARK_DIR.glob("*.jsonl"))
    assert set(counts) <= set(REGISTRY)
    for name, count in counts.items():
        queries, skipped = load_queries({"name": name})
        assert (len(queries), sum(skipped.values())) == (count, 0), name
        assert all(q.query_id.startswith(f"{name}/") for q in queries)
    limited, _ = load_queries({"name": "gsm8k", "limit": 3, "label": "g"})
    assert [q.query_id.split("/")[0] for q in limited] == ["g"] * 3 and limited[0].answer == "18"
    with pytest.raises(DataError, match="add hub: true"):
        load_queries({"name": "math500", "split": "train"})


@pytest.mark.slow
def test_a_hub_only_name_offline_says_how_to_use_a_local_file():
    assert not (BENCHMARK_DIR / "aime25.jsonl").exists()
    script = (
        "from erpo_lightning.data.sources import load_queries, DataError\n"
        "for spec in ({'name': 'aime25'}, {'name': 'math500', 'hub': True}):\n"
        "    try:\n"
        "        load_queries(spec)\n"
        "    except DataError as error:\n"
        "        print(error)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout + result.stderr
    assert lines[0].startswith("no network: cannot read hub:math-ai/aime25")
    assert lines[1].startswith("no network: cannot read hub:HuggingFaceH4/MATH-500")
    assert all(line.endswith("download it on a machine with access and point `path:` at the file") for line in lines)


@pytest.mark.slow
def test_the_wheel_carries_the_package_data(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    done = subprocess.run([*build, str(REPO)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("erpo_lightning-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"erpo_lightning/benchmarks/{p.name}" for p in BENCHMARK_DIR.iterdir()}
    shipped_toy = REPO / "erpo_lightning" / "toy" / "shipped"
    if shipped_toy.is_dir():
        wanted |= {f"erpo_lightning/toy/shipped/{p.name}" for p in shipped_toy.iterdir() if p.is_file()}
    assert wanted <= names, sorted(wanted - names)
    research = sorted(name for name in names if name.split("/")[0] in ("studies", "tests", "bench", "experiments"))
    assert research == [], f"the wheel ships research or test files: {research[:10]}"
    metadata = next(n for n in names if n.endswith("METADATA"))
    assert "erpo-lightning" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_no_lock_file_is_tracked_under_studies():
    """A committed run is its logs and results; the lock files a run leaves beside them are noise (.gitignore keeps
    them out, and this test catches one added with `git add -f`)."""
    tracked = subprocess.run(["git", "ls-files", "studies"], cwd=REPO, capture_output=True, text=True, check=True)
    locks = [path for path in tracked.stdout.splitlines() if path.endswith(".lock")]
    assert not locks, f"{len(locks)} lock files tracked under studies/, e.g. {locks[:3]}"
