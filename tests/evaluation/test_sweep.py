"""Sweep maths (Pass@k, Avg@k, aggregates, distributed reduction), the runner's batching, benchmark errors, reports."""

import io
import json
import math
import os
import re
import socket
import sys
from itertools import combinations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from erpo_lightning.data import DataError, PromptFormat, resolve_template
from erpo_lightning.evaluation import (
    Benchmark,
    PreparedBenchmark,
    Sweep,
    SweepConfig,
    SweepMetric,
    SweepRun,
    pass_at_k,
    plot_accuracy,
    prepare_benchmarks,
    result_rows,
    write_results,
)
from erpo_lightning.rollout import HFEngine, Sample, SamplingSettings, VLLMEngine
from erpo_lightning.rollout.sampler import RolloutSampler
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_matches_enumeration_of_k_subsets(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(outcomes, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def _random_cell(generator, problems, n):
    correct = torch.rand(problems, n, generator=generator) < torch.rand(problems, 1, generator=generator)
    lengths = torch.randint(1, 50, (problems, n), generator=generator).double()
    truncated = torch.rand(problems, n, generator=generator) < 0.3
    return correct, lengths, truncated


def test_metric_stats_and_aggregates():
    generator = torch.Generator().manual_seed(0)
    temperatures = [0.5, 1.0, 1.2]
    metric = SweepMetric(["a", "b"], temperatures, pass_ks=[2, 3])
    cells = {(b, t): _random_cell(generator, 5 + b, n=4 if b == 0 else 3) for b in range(2) for t in range(3)}
    for (b, t), (correct, lengths, truncated) in cells.items():
        metric.update(b, t, correct[:2], lengths[:2], truncated[:2])  # two updates accumulate into one cell
        metric.update(b, t, correct[2:], lengths[2:], truncated[2:])
    values = {name: value.item() for name, value in metric.compute().items()}

    correct, lengths, truncated = cells[(1, 2)]
    assert values["val/avg@k/b/T=1.2"] == pytest.approx(correct.float().mean().item())  # the mean accuracy
    assert values["val/pass@1/b/T=1.2"] == pytest.approx(correct.float().mean().item())
    expected = sum(pass_at_k(3, int(c), 3) for c in correct.sum(1)) / len(correct)
    assert values["val/pass@k/b/T=1.2"] == pytest.approx(expected)
    assert values["val/length/b/T=1.2"] == pytest.approx(lengths.mean().item())
    assert values["val/truncated/b/T=1.2"] == pytest.approx(truncated.float().mean().item())

    def acc(b, t):
        return cells[(b, t)][0].float().mean().item()

    assert values["val/avg@k/a/T<=1.0"] == pytest.approx((acc(0, 0) + acc(0, 1)) / 2)
    assert values["val/avg@k/a/T>1.0"] == pytest.approx(acc(0, 2))
    assert values["val/avg@k/a"] == pytest.approx(sum(acc(0, t) for t in range(3)) / 3)
    assert values["val/avg@k/mean/T=0.5"] == pytest.approx((acc(0, 0) + acc(1, 0)) / 2)
    assert values["val/avg@k/mean"] == pytest.approx(sum(acc(b, t) for b in range(2) for t in range(3)) / 6)


def test_metric_mean_over_and_empty_cells():
    metric = SweepMetric(["eval", "train"], [0.7, 1.3], pass_ks=[1, 1], mean_over=["eval"])
    metric.update(0, 0, torch.tensor([[True, False]]), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.bool))
    metric.update(1, 0, torch.tensor([[True, True]]), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.bool))
    values = metric.compute()
    assert values["val/avg@k/mean/T=0.7"].item() == pytest.approx(0.5)  # train left out of the mean
    assert math.isnan(values["val/avg@k/eval/T=1.3"].item())  # never evaluated: NaN, not 0
    assert "val/avg@k/eval/T<=1.0" in values and "val/avg@k/eval/T>1.0" in values
    with pytest.raises(ValueError, match="needs at least 3 samples"):
        SweepMetric(["x"], [1.0], pass_ks=[3]).update(
            0, 0, torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2), torch.zeros(2, 2)
        )


def _distributed_worker(rank, port, cells, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    metric = SweepMetric(["a", "b"], [0.5, 1.5], pass_ks=[2, 2])
    for (b, t), (correct, lengths, truncated) in cells.items():
        rows = slice(rank, None, 2)  # each rank holds every other problem, as a Sweep deals them
        metric.update(b, t, correct[rows], lengths[rows], truncated[rows])
    results[rank] = {name: value.item() for name, value in metric.compute().items()}
    dist.destroy_process_group()


@pytest.mark.distributed
def test_metric_reduces_across_ranks_to_the_single_process_numbers():
    generator = torch.Generator().manual_seed(1)
    cells = {(b, t): _random_cell(generator, 7, n=3) for b in range(2) for t in range(2)}
    single = SweepMetric(["a", "b"], [0.5, 1.5], pass_ks=[2, 2])
    for (b, t), cell in cells.items():
        single.update(b, t, *cell)
    expected = {name: value.item() for name, value in single.compute().items()}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_distributed_worker, args=(port, cells, results), nprocs=2)
    for rank in range(2):
        assert results[rank] == pytest.approx(expected, nan_ok=True)


class ScriptedEngine:
    """Answers every prompt with `\\boxed{<gold>}` on even sample indices and `\\boxed{none}` on odd ones."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.answers_by_prompt = {}
        self.calls = []
        self.events = []

    def sync_weights(self, policy):
        self.events.append("sync")

    def wake_up(self):
        self.events.append("wake_up")

    def sleep(self):
        self.events.append("sleep")

    def generate(self, prompt_ids, settings):
        self.calls.append((len(prompt_ids), settings))
        groups = []
        for ids in prompt_ids:
            gold = self.answers_by_prompt[tuple(ids)]
            texts = [f"\\boxed{{{gold if g % 2 == 0 else 'none'}}}" for g in range(settings.n)]
            groups.append(
                [Sample(self.tokenizer.encode(t), [0.0] * len(self.tokenizer.encode(t)), "stop") for t in texts]
            )
        return groups


def exact_reward(responses, golds):
    return [float(r == f"\\boxed{{{g}}}") for r, g in zip(responses, golds, strict=True)]


def _benchmark_file(tmp_path, name, problems, answers):
    path = tmp_path / f"{name}.jsonl"
    rows = [{"problem": problem, "answer": answer} for problem, answer in zip(problems, answers, strict=True)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"path": str(path)}


def test_sweep_batches_by_temperature_and_k_and_grades(tmp_path):
    tokenizer = build_byte_tokenizer()
    config = SweepConfig(
        [
            Benchmark(_benchmark_file(tmp_path, "four", [f"q{i}" for i in range(5)], [str(i) for i in range(5)]), 4, 2),
            Benchmark(_benchmark_file(tmp_path, "three", ["p0", "p1", "p2"], ["x", "y", "z"]), 3),
            Benchmark(_benchmark_file(tmp_path, "also4", ["r0"], ["7"]), 4),
        ],
        temperatures=[0.2, 1.4], max_new_tokens=16, batch_size=4, seed=3, progress=False,
    )  # fmt: skip
    engine = ScriptedEngine(tokenizer)
    sampler = RolloutSampler(engine, exact_reward, tokenizer=tokenizer)
    sweep = Sweep(config, sampler, PromptFormat(resolve_template("plain"), 64))
    benchmarks = sweep.prepare()
    engine.answers_by_prompt = {
        tuple(ids): gold for b in benchmarks for ids, gold in zip(b.prompt_ids, b.answers, strict=True)
    }
    result = sweep.run(torch.nn.Linear(1, 1))

    assert engine.events == ["wake_up", "sync", "sleep"]  # the policy's weights reach the engine first
    # Per temperature: the 6 k=4 problems of two benchmarks share calls (chunks of 4 + 2), k=3 gets one call.
    assert [(size, s.n, s.temperature) for size, s in engine.calls] == [
        (4, 4, 0.2), (2, 4, 0.2), (3, 3, 0.2), (4, 4, 1.4), (2, 4, 1.4), (3, 3, 1.4)
    ]  # fmt: skip
    assert all(s.max_new_tokens == 16 and s.top_p == 1.0 for _, s in engine.calls)
    assert len({s.seed for _, s in engine.calls}) == len(engine.calls)
    timing, values = result.timing, result.values
    assert timing.problems == 2 * 9 and timing.samples == 2 * (6 * 4 + 3 * 3)
    assert values["val/avg@k/four/T=0.2"].item() == pytest.approx(0.5)  # 2 of 4 samples right
    assert values["val/avg@k/three/T=1.4"].item() == pytest.approx(2 / 3)
    assert values["val/pass@k/four/T=0.2"].item() == pytest.approx(pass_at_k(4, 2, 2))
    assert values["val/pass@k/three"].item() == pytest.approx(1.0)
    assert sweep.metric.problems.sum().item() == 0  # reset for the next run
    again = sweep.run(torch.nn.Linear(1, 1))  # a second run gives the same numbers, not twice the counts
    assert again.timing.problems == timing.problems
    assert {k: v.item() for k, v in again.values.items()} == pytest.approx(
        {k: v.item() for k, v in values.items()}, nan_ok=True
    )


class Terminal(io.StringIO):
    """Text written to a terminal: what tqdm draws its bar on."""

    def isatty(self) -> bool:
        return True


def swept_stderr(tmp_path, monkeypatch, stderr) -> None:
    """Run a 2-temperature sweep of 3 problems with `stderr` as sys.stderr, progress on."""
    tokenizer = build_byte_tokenizer()
    problems = _benchmark_file(tmp_path, "three", ["p0", "p1", "p2"], ["x", "y", "z"])
    config = SweepConfig([Benchmark(problems, 2)], temperatures=[0.5, 1.0], batch_size=1, max_new_tokens=8)
    engine = ScriptedEngine(tokenizer)
    sweep = Sweep(config, RolloutSampler(engine, exact_reward, tokenizer=tokenizer))
    (benchmark,) = sweep.prepare()
    engine.answers_by_prompt = dict(zip(map(tuple, benchmark.prompt_ids), benchmark.answers, strict=True))
    monkeypatch.setattr(sys, "stderr", stderr)
    sweep.run(torch.nn.Linear(1, 1))


def test_sweep_progress_into_a_pipe_is_plain_lines_without_carriage_returns(tmp_path, monkeypatch):
    """A log (SLURM, nohup: stderr a file or a pipe) gets one `[erpo]` line per temperature, no bar redrawn with
    carriage returns; a terminal still gets the bar."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe:
        swept_stderr(tmp_path, monkeypatch, pipe)
    with os.fdopen(read_end, "rb") as pipe:  # bytes: a text read would turn "\r" into "\n"
        logged = pipe.read().decode()
    assert "\r" not in logged
    lines = logged.splitlines()
    assert len(lines) == 2, logged
    for line, (t, done) in zip(lines, (("0.5", 3), ("1", 6)), strict=True):
        assert re.fullmatch(rf"\[erpo\] temperature sweep: T={t} done, {done}/6 problems in \d+ s", line), line
    terminal = Terminal()
    swept_stderr(tmp_path, monkeypatch, terminal)
    assert "\r" in terminal.getvalue() and "temperature sweep" in terminal.getvalue()
    assert "[erpo]" not in terminal.getvalue()


def test_sweep_keeps_unaveraged_benchmarks_out_of_the_mean(tmp_path):
    tokenizer = build_byte_tokenizer()
    config = SweepConfig(
        [Benchmark(_benchmark_file(tmp_path, "held_out", ["a0"], ["1"]), 2)], temperatures=[1.0], progress=False
    )
    sweep = Sweep(config, RolloutSampler(ScriptedEngine(tokenizer), exact_reward, tokenizer=tokenizer))
    train = PreparedBenchmark("train", 2, 2, [tokenizer.encode("t0")], ["5"])
    assert [b.label for b in sweep.prepare([train])] == ["held_out", "train"]
    assert sweep.metric.mean_over == [0]
    clash = PreparedBenchmark("held_out", 2, 2, [tokenizer.encode("t0")], ["5"])
    with pytest.raises(DataError, match="a benchmark is labelled 'held_out', the name of another evaluated set"):
        sweep.prepare([clash])


def test_sweep_context_is_the_prompt_limit_plus_the_response_cap():
    engine = VLLMEngine()
    sampler = RolloutSampler(engine, exact_reward, SamplingSettings(max_new_tokens=30))
    Sweep(SweepConfig(max_prompt_length=100, max_new_tokens=7), sampler).declare_context()
    assert engine.required_context == 107  # no prompt format: the sweep's own prompt limit and cap
    Sweep(SweepConfig(max_new_tokens=7), sampler, PromptFormat(resolve_template("plain"), 90)).declare_context()
    assert engine.required_context == 107  # the training data's limit wins; the longest declaration is kept
    Sweep(SweepConfig(max_prompt_length=95), sampler).declare_context()
    assert engine.required_context == 125  # no sweep cap: the rollout's 30
    Sweep(SweepConfig(), RolloutSampler(HFEngine(), exact_reward)).declare_context()  # no fixed context: a no-op


def test_missing_or_malformed_benchmark_is_named(tmp_path, benchmarks_dir):
    tokenizer = build_byte_tokenizer()
    template = resolve_template("plain")
    good = Benchmark({"path": str(benchmarks_dir / "gsm8k.jsonl")}, k=2)
    missing = Benchmark({"path": str(tmp_path / "nowhere.jsonl"), "label": "aime_local"}, k=2)
    with pytest.raises(DataError, match="benchmark 'aime_local'.*no such file"):
        prepare_benchmarks(SweepConfig([good, missing], max_problems=2), tokenizer, template, 4096)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n')
    with pytest.raises(DataError, match=r"(?s)benchmark .broken.*row 2, field .answer."):
        prepare_benchmarks(SweepConfig([Benchmark({"path": str(broken)})]), tokenizer, template, 4096)
    with pytest.raises(DataError, match="pass_k=3 must be between 1 and k=2"):
        prepare_benchmarks(
            SweepConfig([Benchmark({"path": str(broken), "limit": 1}, k=2, pass_k=3)]), tokenizer, template, 4096
        )
    prepared = prepare_benchmarks(SweepConfig([good], max_problems=3), tokenizer, template, 4096)
    assert prepared[0].label == "gsm8k" and len(prepared[0].prompt_ids) == 3 and prepared[0].answers[0] == "18"


def test_reports_hold_every_row_and_a_line_per_benchmark(tmp_path):
    temperatures = [0.3, 1.3]
    benchmarks = [PreparedBenchmark(name, 2, 2, [[1], [2]], ["1", "2"]) for name in ("a", "b")]
    runs = []
    for label, right in (("base", 0), ("step100", 1)):
        metric = SweepMetric(["a", "b"], temperatures, [2, 2])
        for b in range(2):
            for t in range(2):
                correct = torch.tensor([[right, 0], [1, 1]], dtype=torch.bool)
                metric.update(b, t, correct, torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.bool))
        runs.append(SweepRun(label, "model", None, {k: v.item() for k, v in metric.compute().items()}))
    rows = [row for run in runs for row in result_rows(run, benchmarks, temperatures)]
    assert len(rows) == 2 * 3 * 5  # runs × (a, b, mean) × (2 temperatures, T<=1.0, T>1.0, all)
    config = SweepConfig([Benchmark({"name": "math500"}, k=2)], temperatures=temperatures)
    paths = write_results(tmp_path, config, runs, rows)
    document = json.loads(paths["json"].read_text())
    assert [r["label"] for r in document["runs"]] == ["base", "step100"]
    assert document["runs"][1]["values"]["val/avg@k/a/T=0.3"] == pytest.approx(0.75)
    assert paths["csv"].read_text().splitlines()[0].startswith("run,benchmark,temperature,k,pass_k,problems,avg@k")
    figure_path = plot_accuracy(tmp_path / "plot.png", rows)
    assert figure_path.stat().st_size > 10_000


def test_evaluation_reaches_the_sampler_through_rollout_never_through_callbacks():
    import ast
    from pathlib import Path

    import erpo_lightning.evaluation as evaluation

    for path in Path(evaluation.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(name.startswith("erpo_lightning.callbacks") for name in names), path.name
