"""Sweeps that keep their graded responses (Sweep keep_completions, TemperatureSweepCallback save_completions) and the
study engine's trajectory reader (studies/engine/trajectory.py): the schedule the callback logs sweeps at, a run's
sweeps read back by optimizer step, a file whose sweep rows do not follow it refused, and one tiny real fit."""

import csv
import gzip
import json

import lightning.pytorch as pl
import pandas as pd
import pytest
import torch
import yaml

from erpo_lightning.callbacks.temperature_sweep import COMPLETIONS_FILE, write_completions
from erpo_lightning.data import PromptFormat, resolve_template
from erpo_lightning.evaluation import Benchmark, Sweep, SweepConfig
from erpo_lightning.rollout import Sample
from erpo_lightning.rollout.sampler import RolloutSampler
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer
from studies.engine.report import DamagedRunFile, RunRecord, check_metrics_reach
from studies.engine.trajectory import schedule, sweeps, wrong_steps


class EchoEngine:
    """Answers every prompt with the worked solution `answers[prompt]` on even samples and `\\boxed{no}` on odd."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers = tokenizer, answers

    def sync_weights(self, policy):
        pass

    def wake_up(self):
        pass

    def sleep(self):
        pass

    def generate(self, prompt_ids, settings):
        groups = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids)
            solution = next(text for problem, text in self.answers.items() if problem in prompt)
            texts = [solution if g % 2 == 0 else "\\boxed{no}" for g in range(settings.n)]
            groups.append([Sample(self.tokenizer.encode(t), [0.0] * len(self.tokenizer.encode(t)), "stop")
                           for t in texts])  # fmt: skip
        return groups


def boxed_reward(responses, golds):
    return [float(r.endswith(f"\\boxed{{{g}}}")) for r, g in zip(responses, golds, strict=True)]


def test_a_sweep_keeps_every_graded_response_only_when_asked(tmp_path):
    path = tmp_path / "toy.jsonl"
    rows = [{"problem": "Compute 6 + 2 + 0.", "answer": "8"}, {"problem": "Compute 1 + 1 - 1.", "answer": "1"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = build_byte_tokenizer()
    prompts = PromptFormat(resolve_template("plain"), 64)
    solutions = {"Compute 6 + 2 + 0.": "6 + 2 = 6. 6 + 0 = 8. \\boxed{8}",
                 "Compute 1 + 1 - 1.": "1 + 1 = 2. 2 - 1 = 1. \\boxed{1}"}  # fmt: skip
    config = SweepConfig([Benchmark({"path": str(path), "label": "toy"}, k=2)], temperatures=[1.0, 1.5],
                         max_new_tokens=48, seed=0, progress=False)  # fmt: skip
    sampler = RolloutSampler(EchoEngine(tokenizer, solutions), boxed_reward, tokenizer=tokenizer)
    kept = Sweep(config, sampler, prompts, keep_completions=True).run(torch.nn.Linear(1, 1))
    assert Sweep(config, sampler, prompts).run(torch.nn.Linear(1, 1)).completions == []  # off by default
    assert [(row["benchmark"], row["index"], row["temperature"]) for row in kept.completions] == [
        ("toy", 0, 1.0), ("toy", 1, 1.0), ("toy", 0, 1.5), ("toy", 1, 1.5)]  # fmt: skip
    first = kept.completions[0]
    assert first["problem"] == "Compute 6 + 2 + 0." and first["correct"] == [True, False]
    assert first["responses"] == [solutions["Compute 6 + 2 + 0."], "\\boxed{no}"]
    assert kept.values["val/avg@k/toy/T=1"].item() == pytest.approx(0.5)  # the metric is as without keeping


def test_completions_append_one_gzip_member_per_sweep_and_read_back_as_one_stream(tmp_path):
    path = tmp_path / "log" / COMPLETIONS_FILE
    row = {
        "benchmark": "train",
        "index": 3,
        "problem": "Compute 6 + 2 + 0.",
        "temperature": 1.0,
        "responses": ["6 + 2 = 6. 6 + 0 = 8. \\boxed{8}", "6 + 2 = 8. 8 + 0 = 8. \\boxed{8}"],
        "correct": [True, True],
    }
    write_completions(path, 10, [row])
    write_completions(path, 20, [row, {**row, "temperature": 1.5, "correct": [False, True]}])
    with gzip.open(path, "rt") as file:
        lines = [json.loads(line) for line in file]
    assert [(line["step"], line["temperature"]) for line in lines] == [(10, 1.0), (20, 1.0), (20, 1.5)]
    assert list(lines[0])[0] == "step"


def test_the_schedule_logs_a_sweep_during_training_at_the_batch_it_followed():
    # every 2 of 4 steps, with a start sweep: after 0, 2, 4 steps, logged at 0, 1, 3 (the final one ran mid-training)
    assert schedule(2, 4, True) == [(0, 0), (2, 1), (4, 3)]
    assert schedule(10, 25, False) == [(10, 9), (20, 19), (25, 25)]  # the final sweep at train end, at its step
    assert schedule(151, 150, True) == [(0, 0), (150, 150)]  # the first studies: start and end only


def synthetic_run(root, every=2, steps=4, at_start=True, logged=None):
    """A run folder as the engine leaves it: callbacks.yaml, sweep_summary.json, metrics.csv with training rows and
    sweep rows (held-out accuracy 0.1 × the optimizer steps before the sweep), and kept completions."""
    log_dir = root / "erpo" / "version_0"
    log_dir.mkdir(parents=True)
    init_args = {"every_n_steps": every, "run_at_start": at_start, "run_at_end": True, "save_completions": True}
    (root / "callbacks.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": [{"init_args": init_args}]}}))
    planned = schedule(every, steps, at_start)
    at = logged or [row for _, row in planned]
    fields = ["step", "train/query_kl", "rollout/reward_mean", "val/avg@k/toy/T=1", "val/avg@k/train/T=1"]
    rows = [{"step": s, "train/query_kl": 0.0, "rollout/reward_mean": 0.5} for s in range(steps)]
    rows += [
        {"step": a, "val/avg@k/toy/T=1": 0.1 * u, "val/avg@k/train/T=1": 0.2}
        for (u, _), a in zip(planned, at, strict=True)
    ]
    with open(log_dir / "metrics.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: r["step"]))
    summary = {"first_step": planned[0][0], "last_step": steps, "before": {}, "after": {}}
    (log_dir / "sweep_summary.json").write_text(json.dumps(summary))
    kept = {"benchmark": "train", "index": 0, "problem": "Compute 6 + 2 + 0.", "temperature": 1.0,
            "responses": ["6 + 2 = 6. 6 + 0 = 8. \\boxed{8}", "6 + 2 = 8. 8 + 0 = 8. \\boxed{8}", "no"],
            "correct": [True, True, False]}  # fmt: skip
    for u, _ in planned:
        write_completions(log_dir / COMPLETIONS_FILE, u, [kept])
    return RunRecord("grpo", 0, log_dir, 1.0)


def test_a_runs_sweeps_read_back_by_the_optimizer_steps_before_them(tmp_path):
    record = synthetic_run(tmp_path)
    frame = sweeps(record)
    assert list(frame.index) == [0, 2, 4]
    assert frame["val/avg@k/toy/T=1"].tolist() == pytest.approx([0.0, 0.2, 0.4])
    check_metrics_reach(record.logged, 4, record.log_dir / "metrics.csv")  # the final sweep's row is at step 3
    counts = wrong_steps(record)
    assert counts["step"].tolist() == [0, 2, 4] and counts["correct"].tolist() == [2, 2, 2]
    assert counts["share"].tolist() == pytest.approx([0.5, 0.5, 0.5])  # "6 + 2 = 6" reached 8 through a wrong step


def test_sweep_rows_that_do_not_follow_the_schedule_are_refused(tmp_path):
    record = synthetic_run(tmp_path, logged=[0, 2, 3])  # the second sweep logged at the wrong step
    with pytest.raises(DamagedRunFile, match=r"sweep rows at steps \[0, 2, 3\], the schedule logs them at \[0, 1, 3\]"):
        sweeps(record)
    frame = pd.DataFrame({"step": [0, 1, 2], "train/query_kl": [0.0, 0.0, 0.0]})
    with pytest.raises(DamagedRunFile, match="cut short"):  # no sweep row at the last step, nor the one before
        check_metrics_reach(frame, 4, tmp_path / "metrics.csv")


@pytest.mark.slow
def test_a_real_fit_logs_its_sweeps_where_the_schedule_says(tiny_model_path, benchmarks_dir, tmp_path):
    from erpo_lightning.callbacks import RolloutCallback, TemperatureSweepCallback
    from erpo_lightning.cli.command import ERPOLightningTrainer
    from erpo_lightning.data import QueryDataModule
    from erpo_lightning.modules.erpo_module import ERPOModule
    from erpo_lightning.rollout import HFEngine

    pl.seed_everything(0)
    sweep = SweepConfig([Benchmark({"path": str(benchmarks_dir / "amc23.jsonl")}, k=1)], temperatures=[1.0],
                        max_new_tokens=4, max_problems=2, progress=False)  # fmt: skip
    sweeper = TemperatureSweepCallback(sweep, every_n_steps=2, train_sample_size=2, train_k=1, run_at_start=True,
                                       run_at_end=True, save_completions=True)  # fmt: skip
    data = QueryDataModule(str(tiny_model_path), [{"path": str(benchmarks_dir / "gsm8k.jsonl"), "limit": 4}],
                           template="plain", batch_size=2, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    rollout = RolloutCallback(HFEngine(), boxed_reward, group_size=2, max_new_tokens=4, seed=0)
    sweeper.bind(rollout.sampler, data.prompt_format(), data.prepare_queries)
    trainer = ERPOLightningTrainer(max_steps=4, accelerator="cpu", logger=pl.loggers.CSVLogger(tmp_path),
                                   log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
                                   enable_checkpointing=False, callbacks=[rollout, sweeper])  # fmt: skip
    trainer.fit(ERPOModule(str(tiny_model_path), learning_rate=1e-3), datamodule=data)
    log_dir = next(tmp_path.rglob("metrics.csv")).parent
    (log_dir.parents[1] / "callbacks.yaml").write_text(yaml.safe_dump(
        {"trainer": {"callbacks": [{"init_args": {"every_n_steps": 2, "run_at_start": True}}]}}))  # fmt: skip
    record = RunRecord("grpo", 0, log_dir, 1.0)
    assert list(sweeps(record).index) == [0, 2, 4] and record.sweep()["last_step"] == 4
    check_metrics_reach(record.logged, 4, log_dir / "metrics.csv")
    with gzip.open(log_dir / COMPLETIONS_FILE, "rt") as file:
        steps = [json.loads(line)["step"] for line in file]
    assert sorted(set(steps)) == [0, 2, 4] and len(steps) == 3 * (2 + 2)  # 2 held-out + 2 training problems a sweep
