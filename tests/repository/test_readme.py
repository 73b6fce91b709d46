"""The README is a front door whose code runs as written, and the README and docs/ quote only what their files hold."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from helpers.docs import example

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
TOY_STUDY, REAL_MODEL_STUDY = REPO / "studies" / "toy", REPO / "studies" / "real_model"
PAGES = [README, *sorted(DOCS.glob("*.md")), *sorted((REPO / "studies").rglob("*.md")), REPO / "bench" / "README.md"]
MAX_README_LINES = 150


def section(path: Path, heading: str) -> str:
    """The text of `path` under the level-2 `heading` (a whole heading line), up to the next level-2 heading."""
    text = path.read_text()
    assert f"\n{heading}\n" in text, f"{path.name} lost its section {heading!r}"
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_objectives_example_runs():
    """The README's link to the objectives example lands on it, and it runs as written (docs/architecture.md)."""
    assert "(docs/architecture.md#the-objectives-from-another-trainer)" in README.read_text()
    namespace: dict = {}
    exec(compile(example("architecture.md", "objectives"), "architecture.md:objectives", "exec"), namespace)
    assert namespace["loss"].ndim == 0 and torch.isfinite(namespace["loss"])  # a scalar loss
    assert namespace["loss"].requires_grad


def test_readme_has_exactly_two_commands_in_its_quickstart():
    commands = re.findall(r"```bash\n(.*?)```", section(README, "## Quickstart"), re.S)
    lines = [line for block in commands for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert lines == ["make quickstart", "make test"]


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"the README has {len(lines)} lines: move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_name_files_and_headings_that_exist(page):
    """Every relative markdown link names an existing file and, after `#`, one of that file's headings."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            if anchor not in {heading_anchor(heading) for heading in headings}:
                broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_quickstart_figures_keep_their_caveat(page):
    """The quickstart's 2026-12-01 figures were not rerun after the Query-KL tolerance: wherever they are quoted, the
    page says so."""
    text = " ".join(page.read_text().split())
    if "39.0% to 65.5%" in text:
        assert "predate" in text and "Query-KL tolerance" in text and "not been rerun" in text, page.name


def docs_link(path: Path) -> str:
    """The markdown link target of `path` as a page in docs/ writes it: `](<relative path>)`."""
    return f"]({os.path.relpath(path, DOCS)})"


def check_quoted_claims(text: str, minimum: int, claims_file: Path = TOY_STUDY / "toy_study_claims.json") -> None:
    """Claims of a study quoted in `text` in the report's words carry their shipped k of n seeds and median."""
    claims = json.loads(claims_file.read_text())["claims"]
    items = [" ".join(item.split()) for item in re.split(r"\n(?=- )|\n\n", text)]  # bullets, paragraphs
    quoted = [claim for claim in claims if any(claim["text"] in item for item in items)]
    assert len(quoted) >= minimum, "the text should state the study's claims in the report's words"
    for claim in quoted:  # each quoted claim carries its k of n seeds and its median paired value
        line = next(item for item in items if claim["text"] in item)
        assert f"{claim['k']} of {claim['n']} seeds" in line, (claim["key"], line)
        assert claim["median"] is None or f"{claim['median']:.3g}" in line, (claim["key"], line)


def bullet_linking(text: str, target: str) -> str:
    """The one bullet of `text` that links `target` (the studies share claim wordings, so each is read alone)."""
    bullets = [item for item in re.split(r"\n(?=- )", text) if f"]({target})" in item]
    assert len(bullets) == 1, f"expected one bullet linking {target}, found {len(bullets)}"
    return bullets[0]


def test_toy_study_claims_in_the_readme_are_the_shipped_claims():
    bullet = bullet_linking(section(README, "## What ERPO does, measured"), "studies/toy/toy_study.md")
    assert "](docs/results.md)" in bullet
    check_quoted_claims(bullet, minimum=2)


def test_real_model_study_claims_in_the_readme_and_results_page_are_the_reports():
    bullet = bullet_linking(section(README, "## What ERPO does, measured"), "studies/real_model/real_model_study.md")
    check_quoted_claims(bullet, minimum=2, claims_file=REAL_MODEL_STUDY / "real_model_study_claims.json")
    results = DOCS / "results.md"
    heading = next(line for line in results.read_text().splitlines() if line.startswith("## On a real model"))
    text = section(results, heading)
    assert all(docs_link(REAL_MODEL_STUDY / name) in text for name in ("real_model_study.md", "plan.md"))
    check_quoted_claims(text, minimum=2, claims_file=REAL_MODEL_STUDY / "real_model_study_claims.json")


def test_toy_study_claims_in_the_results_page_are_the_shipped_claims():
    text = section(DOCS / "results.md", "## The toy study")
    report = (TOY_STUDY / "toy_study.md").read_text()
    assert docs_link(TOY_STUDY / "toy_study.md") in text
    check_quoted_claims(text, minimum=4)
    figures = re.findall(r"\d[\d.]* ± [\d.]+", text)
    assert not [figure for figure in figures if figure not in report], "results.md quotes numbers the report lacks"
    minutes = re.search(r"\(([\d.]+) min on 2 CPU cores", text).group(1)
    assert f"time: {minutes} min" in report


def test_the_results_page_links_each_studys_report():
    """Each study's folder (studies/<name>/) holds its report `<name>_study.md`; docs/results.md links every one."""
    reports = sorted((REPO / "studies").glob("*/*_study.md"))
    assert {report.parent.name for report in reports} >= {"toy", "real_model"}
    text = (DOCS / "results.md").read_text()
    missing = [report for report in reports if docs_link(report) not in text]
    assert missing == [], f"docs/results.md does not link {missing}"


def test_the_brake_verdicts_in_the_readme_and_results_page_are_the_claims_files():
    """The README's brake bullet names the central claims' verdicts in the plan's order and quotes the lower-lr
    margin, its seed count and erpo's margin over grpo from the claims file; docs/results.md links the report and
    the plan."""
    from studies.brake.study import CENTRAL

    brake = REPO / "studies" / "brake"
    claims = {claim["key"]: claim for claim in json.loads((brake / "brake_study_claims.json").read_text())["claims"]}
    bullet = " ".join(
        bullet_linking(section(README, "## What ERPO does, measured"), "studies/brake/brake_study.md").split()
    )
    verdicts = re.findall(r"`(confirmed|refuted|inconclusive|confounded|untestable|invalid)`", bullet)
    assert verdicts[: len(CENTRAL)] == [claims[key]["verdict"] for key in CENTRAL]
    lower, grpo = claims["accuracy.erpo_vs_lower_lr"], claims["accuracy.erpo_vs_grpo"]
    assert (
        f"{-lower['mean_margin']:.1f} points" in bullet and f"{lower['n'] - lower['k']} of {lower['n']} seeds" in bullet
    )
    assert f"(+{grpo['mean_margin']:.1f} points) is `{grpo['verdict']}`" in bullet
    best = re.search(r"mean (\S+) points, erpo higher in (\d+) of (\d+) seeds", (brake / "brake_study.md").read_text())
    assert f"lies {best[1]} points above grpo's (descriptive, {best[2]} of {best[3]} seeds)" in bullet
    assert f"(`{claims['accuracy.erpo_vs_grpo_peak']['verdict']}`)" in bullet
    text = section(DOCS / "results.md", "## Is ERPO more than a brake? The brake study")
    assert all(docs_link(brake / name) in text for name in ("brake_plan.md", "runs/README.md"))


def test_the_long_horizon_verdicts_in_the_readme_and_results_page_are_the_claims_file():
    """The README's long-horizon bullet says whether the paper's claim is supported by the plan's rule (erpo degrades
    less at T = 1.5 than grpo and than grpo at the lower lr, both `confirmed`), quotes grpo's T = 1.0 drop, the
    erpo-vs-grpo verdicts in the plan's order (T = 1.5 drop, T = 1.0 drop, final T = 1.5) with the final margin, and
    the one verdict of every testable claim against the lower lr; docs/results.md links the report, plan and run log."""
    long_horizon = REPO / "studies" / "long_horizon"
    claims_file = long_horizon / "long_horizon_study_claims.json"
    claims = {claim["key"]: claim for claim in json.loads(claims_file.read_text())["claims"]}
    bullet = " ".join(
        bullet_linking(
            section(README, "## What ERPO does, measured"), "studies/long_horizon/long_horizon_study.md"
        ).split()
    )
    supported = all(claims[f"degradation_t1.5.erpo_vs_{b}"]["verdict"] == "confirmed" for b in ("grpo", "lower_lr"))
    assert ("claim is supported" if supported else "claim is not supported") in bullet
    grpo_drop = next(
        g for g in claims["degradation_t1.erpo_vs_grpo"]["gates"] if g["key"] == "testable.grpo_degrades_t1"
    )
    assert f"falls {grpo_drop['mean']:.1f} points from its best" in bullet
    verdicts = re.findall(r"`(confirmed|refuted|inconclusive|confounded|untestable|invalid)`", bullet)
    order = ("degradation_t1.5", "degradation_t1", "final_high_t")
    assert verdicts[:3] == [claims[f"{quantity}.erpo_vs_grpo"]["verdict"] for quantity in order]
    final = claims["final_high_t.erpo_vs_grpo"]
    assert (
        f"ends {-final['mean_margin']:.1f} points below grpo" in bullet
        and f"{final['k']} of {final['n']} seeds" in bullet
    )
    lower = [
        claim for key, claim in claims.items() if key.endswith("erpo_vs_lower_lr") and claim["verdict"] != "untestable"
    ]
    assert len({claim["verdict"] for claim in lower}) == 1 and f"(`{lower[0]['verdict']}`;" in bullet
    area = claims["area_t1.erpo_vs_lower_lr"]
    assert f"{-area['mean_margin']:.1f} points higher at T = 1.0 after step 400, {area['n'] - area['k']} of" in bullet
    text = section(DOCS / "results.md", "## Over 1,000 steps: the long-horizon study")
    assert all(docs_link(long_horizon / name) in text for name in ("long_horizon_plan.md", "long_horizon_study.md",
                                                                    "runs/README.md"))  # fmt: skip


def test_the_first_screen_verdict_is_the_claims_files():
    """The README's opening paragraph says ERPO lost to GRPO at a smaller learning rate in the brake and long-horizon
    studies, `refuted` in every seed: both claims files must say exactly that (erpo above the lower lr held-out at
    T = 1.0: the brake study's final value, the long-horizon study's area after step 400)."""
    opening = " ".join(README.read_text().split("## Quickstart")[0].split())
    brake = json.loads((REPO / "studies/brake/brake_study_claims.json").read_text())["claims"]
    long_horizon = json.loads((REPO / "studies/long_horizon/long_horizon_study_claims.json").read_text())["claims"]
    lost = [next(c for c in brake if c["key"] == "accuracy.erpo_vs_lower_lr"),
            next(c for c in long_horizon if c["key"] == "area_t1.erpo_vs_lower_lr")]  # fmt: skip
    assert {claim["verdict"] for claim in lost} == {"refuted"} and all(claim["k"] == 0 for claim in lost)
    counts = " and ".join(f"{claim['n']} of {claim['n']}" for claim in lost)
    assert f"(`refuted`, {counts} seeds)" in opening and "ERPO did not beat a well-chosen baseline" in opening


def test_the_long_horizon_query_kl_in_the_readme_is_the_reports():
    """erpo_released's and grpo's end-of-run token-k3 Query-KL, as the README rounds them, from the report's table."""
    report = (REPO / "studies/long_horizon/long_horizon_study.md").read_text()
    end = {row.split(" | ")[0].strip("| "): float(row.split(" | ")[1].split(" ± ")[0])
           for row in section_lines(report, "## Query-KL (token k3, descriptive)") if row.startswith("| ")
           and " ± " in row}  # fmt: skip
    readme = " ".join(README.read_text().split())
    assert f"Query-KL at {end['erpo_released']:.2g} (grpo {end['grpo']:.3g})" in readme


def section_lines(text: str, heading: str) -> list[str]:
    """The lines of `text` under `heading`, up to the next heading."""
    return text.split(heading, 1)[1].split("\n## ", 1)[0].splitlines()


ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_page_documents_erpo_cache_home():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "ERPO_CACHE_HOME" in page and "file_hashes.json" in page
