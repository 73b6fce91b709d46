"""TemperatureSweepCallback: every N training steps, a (small) temperature sweep and the train-vs-eval gap.

It samples with the RolloutCallback's engine (weights synced to the current policy first) and grades with its
reward. Besides the eval benchmarks it evaluates a fixed random sample of training queries (labelled `train`, left
out of the `mean` over benchmarks) and logs `train_eval_gap[/<temperatures>]` = Avg@k on that sample − mean Avg@k
over the eval benchmarks: a policy that only gets better on the training queries shows a growing gap.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from erpo_lightning.evaluation.metrics import MEAN, SweepMetric, metric_name, temperature_groups, temperature_label
from erpo_lightning.evaluation.sweep import (
    PreparedBenchmark,
    SweepConfig,
    SweepRunner,
    find_rollout,
    prepare_benchmarks,
    prompt_settings,
)

TRAIN = "train"


class TemperatureSweepCallback(pl.Callback):
    """Runs `sweep` after every `every_n_steps` training batches and logs it (`val/...`, `train_eval_gap`).

    Args:
        sweep: benchmarks, temperatures, k, ... (keep it small: it runs inside training).
        every_n_steps: training batches (RL steps) between sweeps.
        train_sample_size: training queries in the fixed sample for the train-vs-eval gap (0 = no gap).
        train_k: samples per training query at each temperature.
        train_sample_seed: seed of the choice of that sample.
    """

    def __init__(
        self,
        sweep: SweepConfig,
        every_n_steps: int = 50,
        train_sample_size: int = 64,
        train_k: int = 4,
        train_sample_seed: int = 0,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1, got {every_n_steps}")
        self.sweep = sweep
        self.every_n_steps = every_n_steps
        self.train_sample_size = train_sample_size
        self.train_k = train_k
        self.train_sample_seed = train_sample_seed
        self.benchmarks: list[PreparedBenchmark] | None = None
        self.metric: SweepMetric | None = None
        self._batches = 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches += 1
        if self._batches % self.every_n_steps == 0:
            pl_module.log_dict(self.evaluate(trainer, pl_module), on_step=True, on_epoch=False, batch_size=1)

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, torch.Tensor]:
        """One sweep of the current policy on every rank's share of the problems; the global metrics."""
        rollout = find_rollout(trainer)
        if self.benchmarks is None:
            self._prepare(trainer, rollout)
        engine = rollout.engine
        engine.wake_up()
        engine.sync_weights(pl_module.policy)  # every rank: a collective under sharding
        self.metric.to(pl_module.device)
        runner = SweepRunner.from_rollout(rollout)
        counters = getattr(rollout.reward, "counters", dict)
        counters()  # what the rollout graded since its last log is not the sweep's
        max_new_tokens = self.sweep.max_new_tokens or rollout.settings.max_new_tokens
        timing = runner.run(self.benchmarks, self.sweep, self.metric, max_new_tokens, trainer.global_rank, trainer.world_size)
        engine.sleep()
        values = self.metric.compute()
        self.metric.reset()
        if self.train_sample_size > 0:
            groups = [temperature_label(t) for t in self.sweep.temperatures] + list(temperature_groups(self.sweep.temperatures))
            for group in groups:
                gap = values[metric_name("val", "avg@k", TRAIN, group)] - values[metric_name("val", "avg@k", MEAN, group)]
                values["train_eval_gap" if group == "all" else f"train_eval_gap/{group}"] = gap
        values["val/problems_per_s"] = torch.tensor(timing.summary()["problems_per_s"])
        values.update({f"val/grader_{key}": torch.tensor(float(value)) for key, value in counters().items()})
        return values

    def _prepare(self, trainer: pl.Trainer, rollout: Any) -> None:
        """Tokenize the benchmarks with the training template and draw the fixed sample of training queries."""
        datamodule = getattr(trainer, "datamodule", None)
        template, tokenizer, max_prompt_length = prompt_settings(datamodule, self.sweep, rollout.tokenizer)
        self.benchmarks = prepare_benchmarks(self.sweep, tokenizer, template, max_prompt_length)
        labels = [b.label for b in self.benchmarks]
        if self.train_sample_size > 0:
            data = getattr(datamodule, "data", None)
            if data is None:
                raise ValueError("train_sample_size > 0 needs a QueryDataModule (its prepared training queries)")
            if TRAIN in labels:
                raise ValueError(f"a benchmark is labelled {TRAIN!r}, the name of the training sample: relabel it")
            generator = torch.Generator().manual_seed(self.train_sample_seed)
            rows = torch.randperm(len(data.queries), generator=generator)[: self.train_sample_size].tolist()
            self.benchmarks.append(
                PreparedBenchmark(TRAIN, self.train_k, self.train_k, [list(data.prompt_ids[i]) for i in rows],
                                  [data.queries[i].answer for i in rows])
            )  # fmt: skip
        self.metric = SweepMetric(
            [b.label for b in self.benchmarks], self.sweep.temperatures, [b.pass_k for b in self.benchmarks], labels
        )

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self._batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._batches = state_dict["batches"]
