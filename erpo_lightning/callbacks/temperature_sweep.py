"""TemperatureSweepCallback: every N training steps, a (small) temperature sweep and the train-vs-eval gap.

It drives a `Sweep` with the RolloutCallback's `RolloutSampler` (engine weights synced to the current policy first),
given by `bind` (the erpo CLI binds it to the `rollout:` and `data:` groups). Besides the eval benchmarks it evaluates
a fixed random sample of training queries (labelled `train`, left out of the `mean` over benchmarks) and logs
`train_eval_gap[/<temperatures>]` = Avg@k on that sample − mean Avg@k over the eval benchmarks: a policy that only
gets better on the training queries shows a growing gap. With `save_completions` every sweep's graded responses are
kept too (`COMPLETIONS_FILE`), for measures that read the text and not only the grade.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from rich.console import Console
from rich.table import Table

from erpo_lightning.callbacks.progress import phase
from erpo_lightning.common import step_phases
from erpo_lightning.data.prepare import PreparedQueries, PromptFormat
from erpo_lightning.evaluation.overlap import overlap_warnings
from erpo_lightning.evaluation.sweep import PreparedBenchmark, Sweep, SweepConfig
from erpo_lightning.evaluation.sweep_metrics import MEAN, metric_name, temperature_groups, temperature_label
from erpo_lightning.rollout.sampler import RolloutSampler

TRAIN = "train"
COMPLETIONS_FILE = "sweep_completions.jsonl.gz"


class TemperatureSweepCallback(pl.Callback):
    """Runs `sweep` after every `every_n_steps` training batches and logs it (`val/...`, `train_eval_gap`).

    Args:
        sweep: benchmarks, temperatures, k, ... (keep it small: it runs inside training).
        every_n_steps: training batches (RL steps) between sweeps.
        train_sample_size: training queries in the fixed sample for the train-vs-eval gap (0 = no gap).
        train_k: samples per training query at each temperature.
        train_sample_seed: seed of the choice of that sample.
        run_at_start: also sweep before the first training step (the starting point, logged at step 0).
        run_at_end: also sweep after the last step, and print a before/after table (with `run_at_start`) plus the
            final Query-KL; written to `<log_dir>/sweep_summary.json` too.
        save_completions: append every sweep's graded responses to `<log_dir>/sweep_completions.jsonl.gz`
            (`write_completions`; under several ranks each rank writes its share to `sweep_completions.rank<r>...`).

    `bind` gives it the sampler, prompt format and training queries before `fit` (the erpo CLI does).
    """

    def __init__(
        self,
        sweep: SweepConfig,
        every_n_steps: int = 50,
        train_sample_size: int = 64,
        train_k: int = 4,
        train_sample_seed: int = 0,
        run_at_start: bool = False,
        run_at_end: bool = False,
        save_completions: bool = False,
    ) -> None:
        for name, value, minimum in (
            ("every_n_steps", every_n_steps, 1),
            ("train_sample_size", train_sample_size, 0),
            ("train_k", train_k, 1),
        ):
            if value < minimum:
                raise ValueError(f"TemperatureSweepCallback {name} must be >= {minimum}, got {value}")
        self.sweep = sweep
        self.every_n_steps = every_n_steps
        self.train_sample_size = train_sample_size
        self.train_k = train_k
        self.train_sample_seed = train_sample_seed
        self.run_at_start, self.run_at_end = run_at_start, run_at_end
        self.save_completions = save_completions
        self.history: list[tuple[int, dict[str, float]]] = []  # (global step, values) of every sweep
        self.runner: Sweep | None = None
        self._training_queries: Callable[[], PreparedQueries] | None = None
        self._batches = 0

    def bind(
        self,
        sampler: RolloutSampler,
        prompts: PromptFormat | None = None,
        training_queries: Callable[[], PreparedQueries] | None = None,
    ) -> None:
        """Give the sweep what it samples with, before `fit`.

        Args:
            sampler: the RolloutCallback's `sampler` (engine, reward, tokenizer), which training sets up.
            prompts: the training data's prompt format (`QueryDataModule.prompt_format()`); None = the sweep config's
                `template` and `max_prompt_length` with the sampler's tokenizer.
            training_queries: returns the prepared training set (`QueryDataModule.prepare_queries`), from which the
                fixed sample of `train_sample_size` queries is drawn; needed when `train_sample_size > 0`.
        """
        self.runner = Sweep(self.sweep, sampler, prompts, keep_completions=self.save_completions)
        self._training_queries = training_queries

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Declare the sweep's longest sequence to the engine: `setup` runs before any callback's `on_fit_start`,
        where the RolloutCallback builds the engine. Before a fit, warn of each benchmark that shares problems with
        the training set (`evaluation.overlap`), on the first rank."""
        if self.runner is None:
            raise ValueError(
                "TemperatureSweepCallback has no sampler: call bind(rollout.sampler, datamodule.prompt_format(), "
                "datamodule.prepare_queries) before fit (the erpo CLI binds it to the rollout: and data: groups)"
            )
        self.runner.declare_context()
        if stage == "fit" and trainer.is_global_zero and self._training_queries is not None:
            for line in overlap_warnings(self.sweep, self._training_queries().queries):
                print(f"[erpo] warning: {line}", file=sys.stderr, flush=True)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.run_at_start and trainer.global_step == 0:
            log_outside_step(trainer, self.evaluate(trainer, pl_module))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches += 1
        if self._batches % self.every_n_steps == 0:
            # Not `pl_module.log_dict`: Lightning would write the values again at every later step.
            log_outside_step(
                trainer, self.evaluate(trainer, pl_module), trainer.fit_loop.epoch_loop._batches_that_stepped
            )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.run_at_end:
            return
        if not self.history or self.history[-1][0] != trainer.global_step:
            log_outside_step(trainer, self.evaluate(trainer, pl_module))
        log_dir = trainer.log_dir  # a collective under several ranks: every rank asks
        if trainer.is_global_zero:
            query_kl = trainer.callback_metrics.get("train/query_kl")
            print_sweep_summary(self.history, None if query_kl is None else float(query_kl), log_dir)

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, torch.Tensor]:
        """One sweep of the current policy on every rank's share of the problems; the global metrics."""
        if self.runner.benchmarks is None:
            self.runner.prepare(self._training_sample())
        with phase(f"temperature sweep at step {trainer.global_step}", sweep_size(self.runner.benchmarks, self.sweep)):
            with step_phases.timed("sweep"):
                result = self.runner.run(pl_module.policy, trainer.global_rank, trainer.world_size, pl_module.device)
        values = result.values
        if self.train_sample_size > 0:
            groups = [temperature_label(t) for t in self.sweep.temperatures] + list(
                temperature_groups(self.sweep.temperatures)
            )
            for group in groups:
                gap = (
                    values[metric_name("val", "avg@k", TRAIN, group)] - values[metric_name("val", "avg@k", MEAN, group)]
                )
                values["train_eval_gap" if group == "all" else f"train_eval_gap/{group}"] = gap
        if self.save_completions:
            rank = "" if trainer.world_size == 1 else f".rank{trainer.global_rank}"
            name = COMPLETIONS_FILE.replace(".jsonl", f"{rank}.jsonl")
            write_completions(Path(trainer.log_dir) / name, trainer.global_step, result.completions)
        values["val/problems_per_s"] = torch.tensor(result.timing.summary()["problems_per_s"])
        values.update({f"val/grader_{key}": torch.tensor(float(value)) for key, value in result.grader.items()})
        self.history.append((trainer.global_step, {name: float(value) for name, value in values.items()}))
        return values

    def _training_sample(self) -> list[PreparedBenchmark]:
        """The fixed random sample of `train_sample_size` training queries, as one benchmark (none when 0)."""
        if self.train_sample_size == 0:
            return []
        if self._training_queries is None:
            raise ValueError(
                "TemperatureSweepCallback train_sample_size > 0 needs the training queries: "
                "bind(..., training_queries=datamodule.prepare_queries), or set train_sample_size: 0"
            )
        data = self._training_queries()
        generator = torch.Generator().manual_seed(self.train_sample_seed)
        rows = torch.randperm(len(data.queries), generator=generator)[: self.train_sample_size].tolist()
        prompts, answers = [list(data.prompt_ids[i]) for i in rows], [data.queries[i].answer for i in rows]
        problems, columns = data.problems(rows), data.data_columns(rows)
        return [PreparedBenchmark(TRAIN, self.train_k, self.train_k, prompts, answers, problems, columns)]

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self._batches, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._batches = state_dict["batches"]
        self.history = [tuple(entry) for entry in state_dict.get("history", [])]


def log_outside_step(trainer: pl.Trainer, values: dict[str, torch.Tensor], step: int | None = None) -> None:
    """Write `values` to the loggers once, at `step` (None = the global step), and into `trainer.callback_metrics`.

    Used where Lightning allows no `self.log` (train start/end), and for sweeps during training: values given to
    `self.log` stay in Lightning's step results and are written again at every later step.
    """
    for logger in trainer.loggers:
        logger.log_metrics(
            {name: float(value) for name, value in values.items()}, step=trainer.global_step if step is None else step
        )
    trainer.callback_metrics.update({name: torch.as_tensor(value) for name, value in values.items()})


def write_completions(path: Path, step: int, rows: list[dict]) -> None:
    """Append one sweep's graded responses (`SweepResult.completions`) to the gzip JSON-lines file `path`, one line
    per problem and temperature with the sweep's `step` (optimizer steps before it) first. Each call adds a gzip
    member, which `gzip.open` reads back as one stream."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "at", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n")


def print_sweep_summary(
    history: list[tuple[int, dict[str, float]]], query_kl: float | None, log_dir: str | None
) -> None:
    """A table of every Avg@k / Pass@k value at the first and the last sweep, and the final Query-KL."""
    if not history:
        return
    (first_step, first), (last_step, last) = history[0], history[-1]
    table = Table(title="erpo: held-out accuracy before and after training")
    for column in ("metric", f"step {first_step}", f"step {last_step}", "change"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    # Per benchmark and temperature; Pass@1 is left out (it equals Avg@k when every problem has k samples).
    names = [
        n for n in last if n in first and "/T=" in n and "/mean/" not in n and n.split("/")[1] in ("avg@k", "pass@k")
    ]
    for name in names:
        change = 100 * (last[name] - first[name])
        table.add_row(name, f"{100 * first[name]:.1f}%", f"{100 * last[name]:.1f}%", f"{change:+.1f} pts")
    console = Console()
    console.print(table)
    if query_kl is not None:
        console.print(f"final Query-KL(ρθ ‖ ρθ0): {query_kl:.3g}")
    if log_dir is not None:
        summary = {
            "first_step": first_step,
            "last_step": last_step,
            "before": first,
            "after": last,
            "query_kl": query_kl,
        }
        (Path(log_dir) / "sweep_summary.json").write_text(json.dumps(summary, indent=2))


def sweep_size(benchmarks: list[PreparedBenchmark], sweep: SweepConfig) -> str:
    """What one sweep generates, for its start line: problems x temperatures x samples per problem."""
    problems = sum(len(b.prompt_ids) for b in benchmarks)
    samples = sum(len(b.prompt_ids) * b.k for b in benchmarks) * len(sweep.temperatures)
    temperatures = len(sweep.temperatures)
    return f"{problems} problems in {len(benchmarks)} benchmark(s) x {temperatures} temperature(s): {samples} samples"
