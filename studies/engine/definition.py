"""What a study is: a base config, arms (label -> `erpo fit` flags), seeds, steps, the final sweep's settings, the
claims with their decision rules, and where its runs and report go. studies/engine/run.py runs any study;
studies/toy/study.py and studies/real_model/study.py define the two there are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from erpo_lightning.objectives.algorithms import ALGORITHMS
from studies.engine.claims import BASE_ARM, Claim
from studies.engine.report import RunRecord

ALL_QUERIES = 100_000  # a train_sample_size meaning every training query (the sample is at most the training set)


@dataclass(frozen=True)
class StudySettings:
    """What one study trains and measures (recorded in `study.json` and the claims file: `record`).

    `sweep_every` (RL steps between sweeps, >= 2) adds sweeps during training, each the final sweep's (held-out
    problems and training queries at every temperature), logged into the run's metrics.csv: a trajectory
    (studies/engine/trajectory.py). `save_completions` keeps every sweep's graded responses in the run folder too
    (TemperatureSweepCallback `save_completions`). Both default to off: one final sweep, as the first studies ran.
    `validation` (a JSONL path relative to the work directory) sweeps a second benchmark of other problems, at the
    same temperatures and k, labelled VALIDATION: a study that selects a step by it reads the held-out set there.
    """

    steps: int
    seeds: tuple[int, ...]
    temperatures: tuple[float, ...] = (0.1, 0.6, 1.0, 1.5)
    eval_problems: int = 200  # held-out test problems in the final sweep
    eval_k: int = 4  # samples per problem and temperature
    train_sample_size: int = 64  # training queries for the train-vs-eval gap (all of them when at least their number)
    sweep_every: int | None = None  # RL steps between sweeps during training; None: only the final sweep
    save_completions: bool = False  # keep every sweep's graded responses (sweep_completions.jsonl.gz)
    validation: str | None = None  # a JSONL of other problems swept beside the held-out set, labelled VALIDATION

    def __post_init__(self) -> None:
        # A sweep every step would put the start sweep and the first one at the same logged step.
        if self.sweep_every is not None and self.sweep_every < 2:
            raise ValueError(f"StudySettings sweep_every must be >= 2 (or None), got {self.sweep_every}")

    def record(self) -> dict:
        """The settings as `study.json` and the claims file hold them; the trajectory fields only when set, so that
        the files of the studies that ran without them keep their shape."""
        record = asdict(self)
        for name, default in (("sweep_every", None), ("save_completions", False), ("validation", None)):
            if record[name] == default:
                del record[name]
        return record


@dataclass(frozen=True)
class ReportInputs:
    """What a study's report is written from.

    Attributes:
        records: the finished runs, seed-major (studies.engine.runs.load_runs).
        settings: the study's settings.
        path: the report (markdown); its figures and claims file go beside it.
        command: the command that wrote it, as the report quotes it.
        minutes: the runs' wall time, first start to last end.
        jobs: runs in parallel.
        description: `study.json` (arms, settings, model identity, command), stored with the claims.
        base_config: the study's base config.
    """

    records: list[RunRecord]
    settings: StudySettings
    path: Path
    command: str
    minutes: float
    jobs: int
    description: dict
    base_config: str


ReportWriter = Callable[[ReportInputs], list[dict]]  # writes a study's report; returns its evaluated claims


@dataclass(frozen=True)
class Study:
    """One study, as the engine runs it.

    Attributes:
        name: what the study is called in messages (`no <name> runs under ...`).
        module: the study's module, run as `python -m <module>` (`studies.toy`); the report quotes that command.
        base_config: the `erpo fit --config` every run starts from (relative to the work directory); the final
            sweep's held-out benchmark (its path and label) is the first of this config's TemperatureSweepCallback.
        arms: label -> `erpo fit` flags; claims name arms by these labels.
        default_arms: the arms a plain run trains (`--arms` chooses others).
        full, quick: the settings of a full and of a `--quick` run.
        claims: the claims and their decision rules (studies/engine/claims.py).
        out, quick_out: run directory (relative to the work directory) of a full and of a quick run.
        report: the full study's report (markdown; its figures and `<stem>_claims.json` go beside it); a quick run
            writes a report of the same name into its run directory.
        fit_flags: `erpo fit` flags every run gets.
        quick_fit_flags: flags a quick run gets on top (e.g. an engine that needs neither a GPU nor vLLM).
        model_path: the default `--model.model_path` of a quick run (None: the base config's); a full run's comes
            from `--model-path`, or `resolve_model_path` when the study needs one.
        resolve_model_path: the model directory a full run trains when `--model-path` is not given (None: the base
            config names it).
        model_identity: (work directory, model path or None) -> what `study.json` records to identify the model
            (a `sha256` at least).
        write_report: the study's report (studies/engine/report.py has the pieces).
        jobs: runs in parallel by default.
        derived_arms: rows a study's report derives from its runs rather than trains (grpo read at an earlier step
            of its trajectory, say), which claims may name besides the arms.
        table: (finished runs, settings) -> the per-seed table its claims read, when they read more than the
            engine's final values (studies.engine.report.collect): a trajectory's, derived rows (None: collect's).
    """

    name: str
    module: str
    base_config: str
    arms: dict[str, list[str]]
    default_arms: tuple[str, ...]
    full: StudySettings
    quick: StudySettings
    claims: tuple[Claim, ...]
    out: Path
    quick_out: Path
    report: Path
    model_identity: Callable[[Path, str | None], dict]
    write_report: ReportWriter
    fit_flags: tuple[str, ...] = ()
    quick_fit_flags: tuple[str, ...] = ()
    model_path: str | None = None
    resolve_model_path: Callable[[], str] | None = None
    jobs: int = 1
    derived_arms: tuple[str, ...] = ()
    table: Callable[[list[RunRecord], StudySettings], dict] | None = None

    def settings(self, quick: bool) -> StudySettings:
        """The full or the quick settings."""
        return self.quick if quick else self.full

    def check(self) -> None:
        """Refuse, before any run, an arm whose `--model.algorithm` is not a preset of
        erpo_lightning.objectives.algorithms, a default arm that is not an arm, or a claim (or gate) naming an arm the
        study does not define (the base model, BASE_ARM, is every study's; `derived_arms` are the study's too, but not
        as default arms)."""
        check_arms(self.arms)
        named = {arm for claim in self.claims for arm in (claim.method, claim.baseline)}
        named |= {arm for claim in self.claims for gate in claim.gates for arm in gate.arms()}
        unknown = ((named - set(self.derived_arms)) | set(self.default_arms)) - set(self.arms) - {BASE_ARM}
        if unknown:
            raise SystemExit(f"study {self.name}: {sorted(unknown)} named but not among its arms {list(self.arms)}")

    def with_arms(self, labels: list[str]) -> Study:
        """The study restricted to the arms `labels`, in that order."""
        return replace(self, arms={label: self.arms[label] for label in labels}, default_arms=tuple(labels))


def check_arms(arms: dict[str, list[str]]) -> None:
    """Refuse an arm whose `--model.algorithm` is not a preset of erpo_lightning.objectives.algorithms (the flag
    defaults to the base config's algorithm, taken to be `erpo`)."""
    for label, flags in arms.items():
        algorithm = flags[flags.index("--model.algorithm") + 1] if "--model.algorithm" in flags else "erpo"
        if algorithm not in ALGORITHMS:
            raise SystemExit(f"method {label!r}: --model.algorithm {algorithm!r} is not one of {sorted(ALGORITHMS)}")
