"""Sampled completions: what the model wrote, what the grader paid for and what the update made of it, kept from the
run itself.

On the first training step and every `every_n_steps` after it, `SampledCompletions` writes up to `max_rows` of the
step's rollout rows to `<log dir>/completions.jsonl`, one JSON object a row (the fields: `SampledCompletions`):

    {"step": 50, "group_index": 3, "query_index": 812, "prompt": "Compute 7 + 8 - 5.\\n", "response": "10",
     "gold": "10", "reward": 1.0, "advantage": 0.707, "reward_components": {"math_reward": 1.0}, "correct": true,
     "grader_status": "graded", "conventions": ["..."], "temperature": 1.0, "truncated": false, "response_tokens": 3}

With a TensorBoard logger the rows are also a text table (`completions`), with W&B a table. `erpo fit` adds it with
its defaults; list `erpo_lightning.callbacks.SampledCompletions` in `trainer.callbacks` to change them
(`every_n_steps: 0` turns it off, `whole_groups: true` logs every response of a query).
"""

from __future__ import annotations

import inspect
import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from erpo_lightning.callbacks.progress import say
from erpo_lightning.callbacks.rollout import RolloutCallback
from erpo_lightning.modules.distributed import global_advantages
from erpo_lightning.modules.erpo_module import ERPOModule
from erpo_lightning.rollout.batch import QueryBatch, RolloutBatch
from erpo_lightning.rollout.sampler import RolloutSampler

FILE_NAME = "completions.jsonl"
# The tables' columns (TensorBoard, W&B): the file's fields a reader scans, a group's rows told apart by group_index.
COLUMNS = ("step", "group_index", "prompt", "response", "gold", "reward", "advantage", "reward_components", "correct",
           "conventions", "truncated")  # fmt: skip
NO_VERDICT = {"correct": None, "grader_status": None, "conventions": None}  # a row's verdict when none is known


class SampledCompletions(pl.Callback):
    """Writes sampled rollout rows with their grading and advantage to `<log dir>/completions.jsonl`.

    Each row is one response of the step's rollout batch:
        step: the optimizer step (`trainer.global_step` after the step's update).
        group_index: the response's group in the step's batch (0 .. B-1, B the queries it trained on; rank 0's batch
            on several ranks): the rows of a step with one `group_index` are responses to one query, all G of them
            with `whole_groups`.
        query_index: the dataset row of its query.
        prompt, response: the decoded texts (special tokens kept in the prompt, skipped in the response), cut to
            `max_chars`.
        gold: the query's gold answer (None when neither the batch nor the training loader has it).
        reward: the value the advantages saw (after any overlong shaping).
        advantage: the value the update used for the response: the batch's own when it carries them, else
            `ERPOModule`'s estimator (`model.advantage_estimator`, `advantage_eps`) over the rows' rewards, computed
            by the function its update calls (`global_advantages`); None under another module.
        reward_components: component name -> its raw value for the response, before weighting and shaping: a
            `CombinedReward`'s components (each weighted sum is `reward` without overlong shaping), or a single
            reward's value under its `component_name`. Recorded when the rollout graded the response (nothing is
            graded twice); None when the batch does not carry them.
        correct, grader_status, conventions: the reward's verdict on the pair (`MathReward.grade`: the grading
            conventions it relied on), graded again for the logged rows; None for a reward without `grade`, or one
            whose `grade` fails (said once: a log line never stops training).
        temperature: T the responses were sampled at.
        truncated: the response reached `rollout.max_new_tokens`.
        response_tokens: the response's length in tokens.

    Args:
        every_n_steps: write at the first step and every this many optimizer steps (0 = never).
        max_rows: rows per write, at most (with `whole_groups`, at least one whole group).
        max_chars: longest prompt or response text kept (longer ones are cut, ending in "…").
        max_bytes: the file stops growing past this size (one notice says so; a resumed run checks again).
        whole_groups: False: the first response of each query, then the second of each, ...; True: every response
            of the first queries, group after group, as many whole groups as `max_rows` holds (at least one, so a
            group larger than `max_rows` is still written whole): a group's spread of rewards and advantages.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        max_rows: int = 8,
        max_chars: int = 4000,
        max_bytes: int = 2**26,
        whole_groups: bool = False,
    ):
        limits = {"every_n_steps": (every_n_steps, 0), "max_rows": (max_rows, 1), "max_chars": (max_chars, 1)}
        limits["max_bytes"] = (max_bytes, 1)
        for name, (value, minimum) in limits.items():
            if value < minimum:
                raise ValueError(f"SampledCompletions {name} must be >= {minimum}, got {value}")
            setattr(self, name, value)
        self.whole_groups = whole_groups
        self._first_step: int | None = None
        self._full = False
        self._grade_failed = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_step = trainer.global_step + 1  # this process's first step (a resumed run's too)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        due = step == self._first_step or step % max(self.every_n_steps, 1) == 0
        if not self.every_n_steps or not due or not isinstance(batch, QueryBatch) or batch.rollout is None:
            return
        path = Path(trainer.log_dir or trainer.default_root_dir) / FILE_NAME  # log_dir: a collective, every rank asks
        advantages = step_advantages(trainer, pl_module, batch.rollout)  # may be a collective too: every rank
        sampler = rollout_sampler(trainer)
        if not trainer.is_global_zero or self._full or sampler is None or sampler.tokenizer is None:
            return
        rows = self.rows(sampler, trainer, batch, step, advantages)
        if not self._write(path, rows):
            return
        for logger in trainer.loggers:
            log_table(logger, rows, step)

    def rows(
        self,
        sampler: RolloutSampler,
        trainer: pl.Trainer,
        batch: QueryBatch,
        step: int,
        advantages: torch.Tensor | None = None,
    ) -> list[dict[str, Any]]:
        """Up to `max_rows` rows of `batch.rollout` (see the class docstring), decoded with the sampler's tokenizer,
        with their gold answers, the verdicts of the sampler's reward and `advantages` ([N], one per rollout row, or
        None)."""
        rollout: RolloutBatch = batch.rollout
        picked = pick_rows(rollout, self.max_rows, self.whole_groups)
        width = rollout.prompt_length
        prompts, responses = [], []
        for row in picked:
            prompt_ids = rollout.input_ids[row, :width][rollout.attention_mask[row, :width].bool()]
            response_ids = rollout.input_ids[row, width:][rollout.attention_mask[row, width:].bool()]
            prompts.append(sampler.tokenizer.decode(prompt_ids.tolist()))
            responses.append(sampler.tokenizer.decode(response_ids.tolist(), skip_special_tokens=True))
        golds, problems = golds_and_problems(trainer, batch, [int(rollout.query_index[row]) for row in picked])
        verdicts = self._verdicts(sampler.reward, responses, golds, problems)
        advantage = None if advantages is None else advantages.tolist()  # one transfer, not one per row
        carried = rollout.reward_components
        components = None if carried is None else {name: values.tolist() for name, values in carried.items()}
        return [
            {
                "step": step,
                "group_index": row // rollout.group_size,
                "query_index": int(rollout.query_index[row]),
                "prompt": self._cut(prompts[i]),
                "response": self._cut(responses[i]),
                "gold": golds[i],
                "reward": float(rollout.rewards[row]),
                "advantage": None if advantage is None else advantage[row],
                "reward_components": None if components is None else {k: v[row] for k, v in components.items()},
                **verdicts[i],
                "temperature": rollout.temperature,
                "truncated": bool(rollout.truncated[row]),
                "response_tokens": int(rollout.attention_mask[row, width:].sum()),
            }
            for i, row in enumerate(picked)
        ]

    def _verdicts(
        self, reward: Any, responses: list[str], golds: list[str | None], problems: list[str] | None
    ) -> list[dict[str, Any]]:
        """`verdicts_of` the pairs; None values, said once, when the reward's `grade` fails."""
        try:
            return verdicts_of(reward, responses, golds, problems)
        except Exception as error:  # a user's grader: whatever it raises, the run goes on without its verdicts
            if not self._grade_failed:
                say(f"SampledCompletions: the reward's grade() failed ({type(error).__name__}: {error}); the rows of "
                    "completions.jsonl get no verdict (correct, grader_status, conventions: null)")  # fmt: skip
                self._grade_failed = True
            return [dict(NO_VERDICT) for _ in responses]

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


def pick_rows(rollout: RolloutBatch, max_rows: int, whole_groups: bool = False) -> list[int]:
    """Row indices: the first response of each query, then the second of each, ..., `max_rows` in all; with
    `whole_groups`, every response of the first queries in row order, as many whole groups as `max_rows` holds (at
    least one)."""
    groups, size = rollout.num_rows // rollout.group_size, rollout.group_size
    if whole_groups:
        return list(range(min(groups, max(1, max_rows // size)) * size))
    order = [g * size + r for r in range(size) for g in range(groups)]
    return order[:max_rows]


def step_advantages(trainer: pl.Trainer, pl_module: pl.LightningModule, rollout: RolloutBatch) -> torch.Tensor | None:
    """[N] the advantage the update used for each row of `rollout`: the batch's own when it carries them, else an
    `ERPOModule`'s, computed as its update computes them (`global_advantages` over the rows' rewards, with its
    algorithm's estimator and eps: the same numbers); None under another module. For the `reinforce` estimator on
    several ranks this is a collective: every rank calls it."""
    if rollout.advantages is not None:
        return rollout.advantages
    if not isinstance(pl_module, ERPOModule):
        return None
    algorithm = pl_module.algorithm
    estimator, eps = algorithm.advantage_estimator, algorithm.advantage_eps
    return global_advantages(trainer, rollout.rewards, rollout.group_size, estimator, eps)


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
    problems as the training reward is (so an answer that restates its problem is graded as it was paid), inside the
    reward's `uncounted()` when it has one; None values for a reward without `grade`, or a pair without a gold
    answer."""
    grade = getattr(reward, "grade", None)
    if grade is None or any(gold is None for gold in golds):
        return [dict(NO_VERDICT) for _ in responses]
    # The rollout counted these pairs when it paid them: this second look leaves its grader counters alone.
    with getattr(reward, "uncounted", nullcontext)():
        verdicts = grade(responses, golds, **({} if problems is None else takes_problems(grade, problems)))
    return [
        {"correct": bool(v.correct), "grader_status": v.status, "conventions": list(v.conventions)} for v in verdicts
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
