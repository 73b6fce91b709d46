"""Held-out overlap (issue 43 item 10): a sweep benchmark that is the training file, or shares problems with it, is
named before training with the count and the files; it used to run without a word."""

import json
import sys

import lightning.pytorch as pl
from helpers.policies import ParityReward, PolicyModule

from erpo_lightning.callbacks import RolloutCallback
from erpo_lightning.callbacks.temperature_sweep import TemperatureSweepCallback
from erpo_lightning.data import QueryDataModule, load_queries
from erpo_lightning.evaluation import Benchmark, SweepConfig
from erpo_lightning.evaluation.overlap import overlap_warnings
from erpo_lightning.rollout import HFEngine


def write_problems(path, problems: list[str]):
    path.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in problems))
    return path


def test_each_benchmark_sharing_problems_is_counted_with_its_files(tmp_path, benchmarks_dir):
    gsm8k = benchmarks_dir / "gsm8k.jsonl"
    training, _ = load_queries({"path": str(gsm8k), "limit": 20})
    problems = [query.problem for query in training]
    # Two training problems again, one with its spaces changed and an invisible character; two new ones.
    mixed = write_problems(tmp_path / "mixed.jsonl", ["New 1?", "  " + problems[3].replace(" ", "\u200b  "),
                                                      problems[7], "New 2?"])  # fmt: skip
    disjoint = write_problems(tmp_path / "disjoint.jsonl", ["What is 2 + 2?"])
    config = SweepConfig(
        [Benchmark({"path": str(gsm8k), "label": "same_file"}), Benchmark({"path": str(mixed)}),
         Benchmark({"path": str(disjoint)}), Benchmark({"name": "gsm8k", "limit": 5})],
        max_problems=50,
    )  # fmt: skip
    assert overlap_warnings(config, training) == [
        f"sweep benchmark 'same_file' ({gsm8k}) (it is a training file) shares 20 of its 50 problems with the "
        f"training set (20 in {gsm8k}): its accuracy on them is not held-out",
        f"sweep benchmark 'mixed' ({mixed}) shares 2 of its 4 problems with the training set (2 in {gsm8k}): its "
        "accuracy on them is not held-out",
        f"sweep benchmark 'gsm8k' ({gsm8k}) (it is a training file) shares 5 of its 5 problems with the training set "
        f"(5 in {gsm8k}): its accuracy on them is not held-out",
    ]
    unread = SweepConfig([Benchmark({"path": str(tmp_path / "missing.jsonl")})])
    assert overlap_warnings(unread, training) == []  # the sweep names it when it runs


def test_a_fit_warns_of_the_overlap_before_training(tmp_path, tiny_model_path, benchmarks_dir, capsys):
    train_file = benchmarks_dir / "gsm8k.jsonl"
    datamodule = QueryDataModule(
        str(tiny_model_path), [{"path": str(train_file), "limit": 2}], batch_size=2, cache_dir=str(tmp_path / "cache")
    )
    sweep = SweepConfig([Benchmark({"path": str(train_file)}, k=1)], temperatures=[1.0], max_problems=3)
    sweeper = TemperatureSweepCallback(sweep, every_n_steps=100, train_sample_size=0)
    rollout = RolloutCallback(HFEngine(), ParityReward(), group_size=2, max_new_tokens=2, seed=0)
    sweeper.bind(rollout.sampler, datamodule.prompt_format(), datamodule.prepare_queries)

    class FirstStep(pl.Callback):
        def on_train_batch_start(self, *args) -> None:
            print("first step starts", file=sys.stderr, flush=True)

    trainer = pl.Trainer(
        max_steps=1, accelerator="cpu", callbacks=[rollout, sweeper, FirstStep()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(PolicyModule(str(tiny_model_path)), datamodule=datamodule)
    captured = capsys.readouterr()
    warning = (
        f"[erpo] warning: sweep benchmark 'gsm8k' ({train_file}) (it is a training file) shares 2 of its 3 problems "
        f"with the training set (2 in {train_file}): its accuracy on them is not held-out"
    )
    assert captured.err.count(warning) == 1, captured.err[-3000:]
    assert captured.err.index(warning) < captured.err.index("first step starts")
