"""Sampled completions: what the model wrote and what the grader paid for, kept from the run itself.

On the first training step and every `every_n_steps` after it, `SampledCompletions` writes up to `max_rows` of the
step's rollout rows to `<log dir>/completions.jsonl`, one JSON object a row:

    {"step": 50, "query_index": 812, "prompt": "Compute 7 + 8 - 5.\\n", "response": "10", "gold": "10",
     "reward": 1.0, "correct": true, "grader_status": "graded", "conventions": ["..."], "temperature": 1.0,
     "truncated": false, "response_tokens": 3}

`reward` is the value the advantages saw (after any overlong shaping); `correct`, `grader_status` and
`conventions` are the reward's verdict on the pair (`MathReward.grade`: which grading conventions it relied on; None
for a reward without `grade`). The rows are one per query of the step (its first response), as far as `max_rows`
allows. With a TensorBoard logger the rows are also a text table (`completions`), with W&B a table. `erpo fit` adds
it with its defaults; list `erpo_lightning.callbacks.SampledCompletions` in `trainer.callbacks` to change them
(`every_n_steps: 0` turns it off).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from erpo_lightning.callbacks.progress import say
from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch
from erpo_lightning.rollout.sampler import RolloutSampler

FILE_NAME = "completions.jsonl"
COLUMNS = ("step", "prompt", "response", "gold", "reward", "correct", "conventions", "truncated")  # the tables'


class SampledCompletions(pl.Callback):
    """Writes sampled rollout rows with their grading to `<log dir>/completions.jsonl` (see the module docstring).

    Args:
        every_n_steps: write at the first step and every this many optimizer steps (0 = never).
        max_rows: rows per write, at most.
        max_chars: longest prompt or response text kept (longer ones are cut, ending in "…").
        max_bytes: the file stops growing past this size (one notice says so; a resumed run checks again).
    """

    def __init__(self, every_n_steps: int = 50, max_rows: int = 8, max_chars: int = 4000, max_bytes: int = 2**26):
        limits = {"every_n_steps": (every_n_steps, 0), "max_rows": (max_rows, 1), "max_chars": (max_chars, 1)}
        limits["max_bytes"] = (max_bytes, 1)
        for name, (value, minimum) in limits.items():
            if value < minimum:
                raise ValueError(f"SampledCompletions {name} must be >= {minimum}, got {value}")
            setattr(self, name, value)
        self._first_step: int | None = None
        self._full = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_step = trainer.global_step + 1  # this process's first step (a resumed run's too)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        due = step == self._first_step or step % max(self.every_n_steps, 1) == 0
        if not self.every_n_steps or not due or not isinstance(batch, QueryBatch) or batch.rollout is None:
            return
        path = Path(trainer.log_dir or trainer.default_root_dir) / FILE_NAME  # log_dir: a collective, every rank asks
        sampler = rollout_sampler(trainer)
        if not trainer.is_global_zero or self._full or sampler is None or sampler.tokenizer is None:
            return
        rows = self.rows(sampler, trainer, batch, step)
        if not self._write(path, rows):
            return
        for logger in trainer.loggers:
            log_table(logger, rows, step)

    def rows(self, sampler: RolloutSampler, trainer: pl.Trainer, batch: QueryBatch, step: int) -> list[dict[str, Any]]:
        """Up to `max_rows` rows of `batch.rollout`, decoded with the sampler's tokenizer, with their gold answers and
        the verdicts of the sampler's reward."""
        rollout: RolloutBatch = batch.rollout
        picked = pick_rows(rollout, self.max_rows)
        width = rollout.prompt_length
        prompts, responses = [], []
        for row in picked:
            prompt_ids = rollout.input_ids[row, :width][rollout.attention_mask[row, :width].bool()]
            response_ids = rollout.input_ids[row, width:][rollout.attention_mask[row, width:].bool()]
            prompts.append(sampler.tokenizer.decode(prompt_ids.tolist()))
            responses.append(sampler.tokenizer.decode(response_ids.tolist(), skip_special_tokens=True))
        golds, problems = golds_and_problems(trainer, batch, [int(rollout.query_index[row]) for row in picked])
        verdicts = verdicts_of(sampler.reward, responses, golds, problems)
        return [
            {
                "step": step,
                "query_index": int(rollout.query_index[row]),
                "prompt": self._cut(prompts[i]),
                "response": self._cut(responses[i]),
                "gold": golds[i],
                "reward": float(rollout.rewards[row]),
                **verdicts[i],
                "temperature": rollout.temperature,
                "truncated": bool(rollout.truncated[row]),
                "response_tokens": int(rollout.attention_mask[row, width:].sum()),
            }
            for i, row in enumerate(picked)
        ]

    def _cut(self, text: str) -> str:
        return text if len(text) <= self.max_chars else text[: self.max_chars - 1] + "…"

    def _write(self, path: Path, rows: list[dict[str, Any]]) -> bool:
        """Append `rows` to `path` unless that would pass `max_bytes` (then say so, once); whether it wrote."""
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        size = path.stat().st_size if path.exists() else 0
        if size + len(text.encode()) > self.max_bytes:
            self._full = True
            say(f"{path} reached SampledCompletions max_bytes ({self.max_bytes}): no more completions are written")
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as file:
            file.write(text)
        return True


def rollout_sampler(trainer: pl.Trainer) -> RolloutSampler | None:
    """The RolloutCallback's sampler (tokenizer and reward) among the trainer's callbacks; None without one."""
    return next((c.sampler for c in trainer.callbacks if isinstance(c, RolloutCallback)), None)


def pick_rows(rollout: RolloutBatch, max_rows: int) -> list[int]:
    """Row indices: the first response of each query, then the second of each, ..., `max_rows` in all."""
    groups, size = rollout.num_rows // rollout.group_size, rollout.group_size
    order = [g * size + r for r in range(size) for g in range(groups)]
    return order[:max_rows]


def golds_and_problems(
    trainer: pl.Trainer, batch: QueryBatch, query_indices: list[int]
) -> tuple[list[str | None], list[str] | None]:
    """The gold answer of each dataset row in `query_indices`, and its problem text (None when the source gives
    none): from the step's batch, else (a dynamic-sampling refill) from the training loader, as the refill drew it;
    a gold is None when neither has it."""
    problems = batch.problems or [None] * len(batch.answers)
    known = {
        int(index): (answer, problem)
        for index, answer, problem in zip(batch.query_index.tolist(), batch.answers, problems, strict=True)
    }
    loader = trainer.train_dataloader
    for index in set(query_indices) - known.keys():
        try:
            drawn = loader.collate_fn([loader.dataset[index]])
        except (AttributeError, IndexError, TypeError):  # not a QueryDataModule loader
            continue
        known[index] = (drawn.answers[0], drawn.problems[0] if drawn.problems else None)
    golds = [known.get(index, (None, None))[0] for index in query_indices]
    found = [known.get(index, (None, None))[1] for index in query_indices]
    return golds, None if any(problem is None for problem in found) else found


def verdicts_of(
    reward: Any, responses: list[str], golds: list[str | None], problems: list[str] | None = None
) -> list[dict[str, Any]]:
    """`correct`, `grader_status` and `conventions` of each pair from `reward.grade` (MathReward's), given the
    problems as the training reward is (so an answer that restates its problem is graded as it was paid); None values
    for a reward without `grade`, or a pair without a gold answer."""
    empty = {"correct": None, "grader_status": None, "conventions": None}
    grade = getattr(reward, "grade", None)
    if grade is None or any(gold is None for gold in golds):
        return [dict(empty) for _ in responses]
    return [
        {"correct": bool(v.correct), "grader_status": v.status, "conventions": list(v.conventions)}
        for v in grade(responses, golds, **({} if problems is None else takes_problems(grade, problems)))
    ]


def takes_problems(grade: Any, problems: list[str]) -> dict[str, list[str]]:
    """`{"problems": problems}` when `grade` accepts that keyword (MathReward's does; a user's may not)."""
    try:
        accepted = "problems" in inspect.signature(grade).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a readable signature
        accepted = False
    return {"problems": problems} if accepted else {}


def log_table(logger: Any, rows: list[dict[str, Any]], step: int) -> None:
    """`rows` as a table for loggers that show one: TensorBoard (markdown text) and W&B; others are skipped."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    data = [[row[column] for column in COLUMNS] for row in rows]
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_text("completions", markdown_table(data), global_step=step)
    elif isinstance(logger, WandbLogger):
        logger.log_table(key="completions", columns=list(COLUMNS), data=[[str(v) for v in r] for r in data], step=step)


def markdown_table(data: list[list[Any]]) -> str:
    """A markdown table of COLUMNS over `data`, cells escaped for one line each."""

    def cell(value: Any) -> str:
        text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
        return text.replace("|", "\\|").replace("\n", "⏎")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in data]
    return "\n".join(lines)
