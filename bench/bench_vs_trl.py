"""erpo_lightning against TRL's `GRPOTrainer`: the same model, prompts and settings, rollouts included; prints JSON.

One step = generate G responses for each of `--queries` prompts (Hugging Face `generate`, or vLLM), grade them, one
optimizer step. Both sides use the same model checkpoint (fp32), prompts, group size, response cap, learning rate,
AdamW without weight decay, gradient clipping at 1.0, no gradient checkpointing, token-mean loss (TRL `dapo`) and
the same reward function. Each configuration runs in its own subprocess (so its peak RSS is its own), all of them
interleaved over `--rounds` (the order reversed every other round, against drift), each doing one untimed warm-up
step and `--steps` timed steps. Ratios are of medians measured in the same run:

    ours `grpo`    vs TRL beta = 0
    ours `grpo_kl` vs TRL beta = 0.001 (both load a frozen reference model; k3 estimator; TRL's KL bias correction
                      off, so the two losses are the same, see docs/trl.md)
    ours `erpo`    vs TRL beta = 0.001 (Query-KL from the cached reference scores: no reference model)
    ours `grpo` and `erpo` with the shared prompt, each with `model.fused_output_layer` (`*_fused`) vs TRL beta = 0:
                      TRL 1.16 always computes its log-probs with a fused, chunked LM head (`add_fused_lm_head`:
                      the full logits never exist), so these pairs compare like with like
    TRL `ERPOTrainer` (erpo_lightning.integrations.trl, preset `erpo`) vs TRL beta = 0 and vs TRL beta = 0.001:
                      the same TRL loop, its loss replaced by ERPO's (Query-KL from the same forward, θ0 scores
                      computed in its constructor, before the timed steps, as ours are before `fit`)

Per step: generation (our rollout callback: sampling, grading, packing; TRL's `_generate_and_score_completions`:
the same, plus its reference-model forward when beta > 0), training (the rest of the step: forward, backward,
clipping, optimizer; our reference-model forward is here), total, and the process's peak RSS.

    .venv/bin/python bench/bench_vs_trl.py                    # CPU, the 17M-parameter Qwen2 (see --help)
    .venv/bin/python bench/bench_vs_trl.py --steps 2 --rounds 1 --max-new-tokens 32    # a quick check
    .venv/bin/python bench/bench_vs_trl.py --model "$(.venv/bin/python -m erpo_lightning.real_model)"  # SmolLM2
    .venv/bin/python bench/bench_vs_trl.py --engine vllm     # rollouts from in-process vLLM on both sides

With `--engine vllm` ours samples with `VLLMEngine(dtype="float32", enforce_eager=True)` and TRL with its colocated
vLLM (`use_vllm`, `vllm_mode="colocate"`), built with the same settings (see `trl_vllm_settings`); TRL's
importance-sampling correction is off, as ours has none.

Needs TRL (`pip install -e '.[trl]'`), a bench-only extra; erpo_lightning never imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from interleave import run_workers

# name -> (side, our algorithm or TRL's beta)
CONFIGS = {
    "ours_grpo": ("ours", "grpo"),
    "trl_beta0": ("trl", 0.0),
    "ours_grpo_kl": ("ours", "grpo_kl"),
    "trl_beta_kl": ("trl", 0.001),  # = our grpo_kl preset's β
    "ours_erpo": ("ours", "erpo"),
    "ours_erpo_shared_prompt": ("ours", "erpo+shared_prompt"),  # model.query_kl_scoring shared_prompt
    # model.fused_output_layer: the log-probs from a chunked output layer, as TRL 1.16 computes them by default
    "ours_grpo_fused": ("ours", "grpo+fused"),
    "ours_erpo_shared_prompt_fused": ("ours", "erpo+shared_prompt+fused"),
    "trl_erpo": ("trl_erpo", "erpo"),  # ERPOTrainer: GRPOTrainer with ERPO's loss (erpo_lightning.integrations.trl)
}
PAIRS = {"grpo_over_trl_beta0": ("ours_grpo", "trl_beta0"),
         "grpo_kl_over_trl_beta_kl": ("ours_grpo_kl", "trl_beta_kl"),
         "erpo_over_trl_beta_kl": ("ours_erpo", "trl_beta_kl"),
         "erpo_over_trl_beta0": ("ours_erpo", "trl_beta0"),
         "erpo_shared_prompt_over_trl_beta0": ("ours_erpo_shared_prompt", "trl_beta0"),
         "grpo_fused_over_trl_beta0": ("ours_grpo_fused", "trl_beta0"),
         "erpo_shared_prompt_fused_over_trl_beta0": ("ours_erpo_shared_prompt_fused", "trl_beta0"),
         "trl_erpo_over_trl_beta0": ("trl_erpo", "trl_beta0"),  # goal <= 1.05: Query-KL nearly free
         "trl_erpo_over_trl_beta_kl": ("trl_erpo", "trl_beta_kl")}  # goal <= 0.9  # fmt: skip
# The shapes of bench_step.py's 20m model with the byte tokenizer's vocabulary: rollouts need a real tokenizer.
SIZES = {
    "17m": dict(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=2, intermediate_size=1408),
    "tiny": dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256),
}


def build_model(size: str, path: Path) -> None:
    from erpo_lightning.toy.tiny_qwen2 import save_tiny_model

    save_tiny_model(path, seed=0, max_positions=4096, **SIZES[size])


def model_dir(args) -> Path:
    """`--model`, or the model `build_model` wrote into the run's work directory."""
    return Path(args.model) if args.model else Path(args.workdir) / "model"


MAX_PROMPT_TOKENS = 64  # the prompts below are at most ~45 tokens (byte tokenizer); TRL's vLLM context is this + cap


def make_prompts(count: int) -> tuple[list[str], list[str]]:
    """`count` distinct arithmetic prompts and their answers (the same text on both sides, no chat template)."""
    prompts, answers = [], []
    for index in range(count):
        a, b = 3 + index % 7, 2 + (index * 5) % 9
        prompts.append(f"Compute {a} + {b}. Put the answer in \\boxed{{}}.")
        answers.append(str(a + b))
    return prompts, answers


def contains_answer(responses: list[str], golds: list[str]) -> list[float]:
    """The reward of both sides: 1 when the gold answer appears in the response (cheap, and varies within groups)."""
    return [float(gold in response) for response, gold in zip(responses, golds, strict=True)]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_ours(args, setting: str) -> dict:
    """Our side's steps; `setting` is a preset, or `<preset>+<query_kl_scoring>`."""
    import lightning as L
    from transformers import AutoTokenizer

    from erpo_lightning.callbacks.rollout import RolloutCallback
    from erpo_lightning.data.cache import ReferenceLogprobCache
    from erpo_lightning.data.reference_logprobs import batch_query_logprobs
    from erpo_lightning.modules.erpo_module import ERPOModule
    from erpo_lightning.rollout import HFEngine, VLLMEngine
    from erpo_lightning.rollout.batch import QueryBatch
    from erpo_lightning.scoring.queries import QueryScoringLayout

    model_path = model_dir(args)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts, answers = make_prompts(args.queries * (args.steps + 1))
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    algorithm, *extras = setting.split("+")
    module = ERPOModule(
        str(model_path), algorithm=algorithm, learning_rate=args.lr, weight_decay=0.0,
        gradient_clip_norm=1.0, query_kl_scoring="shared_prompt" if "shared_prompt" in extras else "exact",
        fused_output_layer="fused" in extras,
    )  # fmt: skip
    module.configure_model()
    # What `erpo cache` does once before training, with the same function: the initial model's query scores.
    layout = QueryScoringLayout()  # the cache's layout, which the step's exact Query-KL scores in
    module.reference_cache = ReferenceLogprobCache.from_rows(batch_query_logprobs(module.policy, prompt_ids), layout)
    nll = module.reference_cache.nll
    weights = module.algorithm.query_weight_table(nll)  # w(q) when static, made once as QueryDataModule does
    batches = []  # what QueryDataModule yields; the RolloutCallback attaches each step's rollout
    for start in range(0, len(prompts), args.queries):
        rows = torch.arange(start, start + args.queries)
        batches.append(
            QueryBatch(
                rows,
                prompt_ids[start : start + args.queries],
                answers[start : start + args.queries],
                reference_nll=nll[rows],
                query_weights=None if weights is None else weights[rows],
            )  # fmt: skip
        )
    marks: list[tuple[float, float, float]] = []

    class StepStart(L.Callback):
        def on_train_batch_start(self, *_):
            self.start = time.perf_counter()

    class GenerationEnd(L.Callback):
        def on_train_batch_start(self, *_):
            self.end = time.perf_counter()

        def on_train_batch_end(self, *_):
            marks.append((step_start.start, self.end, time.perf_counter()))

    step_start = StepStart()
    if args.engine == "hf":
        engine = HFEngine()
    else:  # `erpo fit` declares the context from the data module; here it is the one TRL's vLLM gets
        engine = VLLMEngine(dtype="float32", enforce_eager=True, max_model_len=vllm_context(args))
    rollout = RolloutCallback(
        engine, contains_answer, group_size=args.group_size, temperature=1.0, max_new_tokens=args.max_new_tokens
    )
    trainer = L.Trainer(
        max_steps=args.steps + 1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[step_start, rollout, GenerationEnd()],
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda batch: batch)
    trainer.fit(module, train_dataloaders=loader)
    return summarize(marks[1:])


def run_trl(args, beta: float, algorithm: str | None = None) -> dict:
    """TRL's GRPOTrainer with `beta`, or with `algorithm` our ERPOTrainer (which has no beta)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_path = model_dir(args)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts, answers = make_prompts(args.queries * (args.steps + 1))

    def reward(prompts, completions, answer, **_):
        return contains_answer(completions, answer)

    config = GRPOConfig(
        output_dir=str(Path(args.workdir) / f"trl_{algorithm or beta}"), use_cpu=True, report_to="none",
        save_strategy="no", bf16=False, gradient_checkpointing=False, model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=args.queries * args.group_size, num_generations=args.group_size,
        max_completion_length=args.max_new_tokens, temperature=1.0, learning_rate=args.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=beta, loss_type="dapo",
        use_bias_correction_kl=False, max_steps=args.steps + 1, logging_steps=10**6, shuffle_dataset=False,
        disable_tqdm=True, seed=0, **trl_vllm_settings(args),
    )  # fmt: skip
    trainer_class, extra = GRPOTrainer, {}
    if algorithm is not None:
        from erpo_lightning.integrations.trl import ERPOTrainer

        trainer_class, extra = ERPOTrainer, {"algorithm": algorithm}
    trainer = trainer_class(
        model=str(model_path), reward_funcs=reward, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": prompts, "answer": answers}), **extra,
    )  # fmt: skip
    marks: list[tuple[float, float, float]] = []
    generation = trainer._generate_and_score_completions
    current: dict[str, float] = {}

    def timed_generation(inputs):
        result = generation(inputs)
        current["generation_end"] = time.perf_counter()
        return result

    trainer._generate_and_score_completions = timed_generation

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            current["start"] = time.perf_counter()

        def on_step_end(self, *_, **__):
            marks.append((current["start"], current["generation_end"], time.perf_counter()))

    trainer.add_callback(StepTimer())
    trainer.train()
    return summarize(marks[1:])


def vllm_context(args) -> int:
    """Both sides' vLLM `max_model_len`: the longest prompt and the response cap."""
    return MAX_PROMPT_TOKENS + args.max_new_tokens


def trl_vllm_settings(args) -> dict:
    """TRL's colocated vLLM, built with what our `VLLMEngine(enforce_eager=True)` gets on CPU.

    TRL 1.16 passes no `enforce_eager`, KV-cache size or step token budget to `vllm.LLM`, and leaves torch on the one
    thread vLLM sets when built in-process: its `LLM` is wrapped to add our engine's CPU settings and restore the
    threads. Its weight sync goes through vLLM 0.32's reload call (below). Importance-sampling correction is off
    (ours logs the mismatch and does not correct it).
    """
    if args.engine == "hf":
        return {}
    import trl.generation.vllm_generation as trl_vllm

    from erpo_lightning.rollout.vllm_engine import CPU_KV_CACHE_BYTES, CPU_MAX_BATCHED_TOKENS

    build = trl_vllm.LLM

    def llm_as_ours(**kwargs):
        threads = torch.get_num_threads()
        kwargs.update(enforce_eager=True, dtype="float32")
        if not torch.cuda.is_available():
            kwargs.update(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, max_num_batched_tokens=CPU_MAX_BATCHED_TOKENS)
        llm = build(**kwargs)
        torch.set_num_threads(threads)
        return llm

    def sync_weights_vllm_032(self):
        # TRL's colocated sync calls the model's `load_weights` one tensor at a time, which vLLM 0.32's CPU build
        # refuses (TRL 1.16 supports vLLM <= 0.31); the same tensors, named by TRL, go through vLLM 0.32's in-place
        # reload instead, the call our engine makes.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._iter_named_params()})
        self.llm.reset_prefix_cache()

    trl_vllm.LLM = llm_as_ours
    trl_vllm.VLLMGeneration.sync_weights = sync_weights_vllm_032
    return dict(
        use_vllm=True, vllm_mode="colocate", vllm_importance_sampling_correction=False,
        vllm_max_model_length=vllm_context(args),
    )  # fmt: skip


def summarize(marks: list[tuple[float, float, float]]) -> dict:
    return {
        "generation_s": [end_gen - start for start, end_gen, _ in marks],
        "training_s": [end - end_gen for _, end_gen, end in marks],
        "total_s": [end - start for start, _, end in marks],
        "peak_rss_mib": peak_rss_mib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="17m", help="the Qwen2 built here when --model is not set")
    parser.add_argument("--model", help="a Hugging Face model directory with its tokenizer, used by both sides")
    parser.add_argument("--queries", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="response cap")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="rollouts with Hugging Face generate or in-process vLLM"
    )
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run, after one warm-up step")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS),
                        help="run only these (ratios need both sides of a pair)")  # fmt: skip
    parser.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:
        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        side, setting = CONFIGS[args.config]
        if side == "ours":
            result = run_ours(args, setting)
        else:
            result = run_trl(args, 0.0, setting) if side == "trl_erpo" else run_trl(args, setting)
        print(json.dumps(result))
        return
    if importlib.util.find_spec("trl") is None:
        sys.exit("TRL is not installed: pip install -e '.[trl]' (bench-only extra)")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        if args.model is None:
            build_model(args.size, Path(workdir) / "model")
        elif not (Path(args.model) / "config.json").is_file():
            sys.exit(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
        results = run_workers(
            __file__, {name: ["--config", name, "--workdir", workdir] for name in args.configs}, args.rounds
        )
    summary = {
        name: {
            **{
                f"{part}_median": statistics.median(t for run in runs for t in run[part])
                for part in ("generation_s", "training_s", "total_s")
            },
            "peak_rss_mib": max(run["peak_rss_mib"] for run in runs),
        }
        for name, runs in results.items()
    }
    pairs = {pair: sides for pair, sides in PAIRS.items() if set(sides) <= set(summary)}
    ratios = {
        f"{pair}/{part}": summary[ours][f"{part}_median"] / summary[trl][f"{part}_median"]
        for pair, (ours, trl) in pairs.items()
        for part in ("total_s", "generation_s", "training_s")
    }
    ratios.update(
        {f"{pair}/peak_rss": summary[ours]["peak_rss_mib"] / summary[trl]["peak_rss_mib"] for pair, (ours, trl) in
         pairs.items()}
    )  # fmt: skip
    from importlib.metadata import version

    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("config", "workdir")},
        "versions": {name: version(name) for name in ("torch", "transformers", "trl")},
        "results": summary,
        "ratios": ratios,
        "wall_s": time.perf_counter() - started,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
