"""Training-step cost of `erpo` (exact Query-KL scoring, the default; `shared_forward`; `shared_prompt`, each prompt
forwarded once with its responses on its keys and values) vs `grpo` (β = 0, exact or shared prompt) vs `grpo_kl`, on
the same replayed rollout batch; prints JSON.

ERPO's claims: Query-KL is cheap (against cached reference scores: with `shared_forward` it reuses the forward that
scores the responses; exact scoring adds one forward and backward over the step's unique queries), and it needs no
reference model in memory, unlike Policy-KL. Each arm (ARMS) runs in its own subprocess (so peak memory is its own),
all interleaved over `--rounds`, each doing `--steps` timed optimizer steps after one warm-up step on the
identical rollout batch. Ratios are of medians measured in the same run; each arm's steps (per round) and their
spread, and each step ratio taken round by round (`ratio_rounds`), come with them.

    .venv/bin/python bench/bench_step.py                         # CPU, ~20M-parameter Qwen2, fp32
    .venv/bin/python bench/bench_step.py --model-path erpo_lightning/toy/shipped --queries 16 --group-size 8 \
        --prompt-len 16 --response-len 48 --micro-batch-tokens 8192   # the quickstart's model and shapes
    python bench/bench_step.py --device cuda --size 0.5b --dtype bfloat16 --queries 16 \
        --prompt-len 256 --response-len 1024
    python bench/bench_step.py --device cuda --size 1.5b --dtype bfloat16 --strategy model_parallel  # FSDP2

`--strategy model_parallel` fits under Lightning's `ModelParallelStrategy` on one device (a 1-rank mesh, gloo on
CPU, NCCL on CUDA): `ERPOModule.configure_model` then shards the policy with FSDP2, as multi-GPU runs do.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Literal, get_args

import torch
from interleave import import_first, round_ratios, run_workers, spread
from memory_probe import status_bytes
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

from erpo_lightning.rollout.batch import QueryBatch, assemble_batch
from erpo_lightning.rollout.engine import Sample

# arm -> (model.algorithm, model.query_kl_scoring, model.fused_output_layer, query-scoring layout: (data.
# query_score_rows, data.query_score_width_multiple), None = the flags' (or the default))
ALONE = (1, 8)  # each query alone, padded to a multiple of 8 tokens: no filler rows, little padding
ARMS = {
    "erpo": ("erpo", "exact", False, None),
    "erpo_shared_forward": ("erpo", "shared_forward", False, None),
    "grpo": ("grpo", "exact", False, None),
    "grpo_kl": ("grpo_kl", "exact", False, None),
    "erpo_shared_prompt": ("erpo", "shared_prompt", False, None),
    "grpo_shared_prompt": ("grpo", "shared_prompt", False, None),
    "erpo_fused": ("erpo", "exact", True, None),
    "grpo_fused": ("grpo", "exact", True, None),
    "erpo_shared_prompt_fused": ("erpo", "shared_prompt", True, None),
    "erpo_alone": ("erpo", "exact", False, ALONE),
    "grpo_alone": ("grpo", "exact", False, ALONE),
    "erpo_shared_prompt_alone": ("erpo", "shared_prompt", False, ALONE),
    # the loss menu (issue 70): GSPO's sequence ratio, CISPO, and grpo with the entropy bonus (ARM_SETTINGS), whose
    # forward scores the entropy with gradient
    "gspo": ("gspo", "exact", False, None),
    "gspo_erpo": ("gspo_erpo", "exact", False, None),
    "cispo": ("cispo", "exact", False, None),
    "cispo_erpo": ("cispo_erpo", "exact", False, None),
    "grpo_entropy_bonus": ("grpo", "exact", False, None),
    # the decoder layers under torch.compile (model.compile, issue 71): the warm-up step pays the compilation
    "erpo_compiled": ("erpo", "exact", False, None),
    "grpo_compiled": ("grpo", "exact", False, None),
}
# arm -> extra ERPOModule settings of that arm
ARM_SETTINGS = {
    "grpo_entropy_bonus": {"entropy_coef": 0.01},
    "erpo_compiled": {"compile": True},
    "grpo_compiled": {"compile": True},
}
Strategy = Literal["auto", "model_parallel"]
# Qwen2 shapes: hidden, intermediate, layers, attention heads, key-value heads, vocabulary.
# "0.5b" is Qwen2.5-0.5B's, "1.5b" Qwen2-1.5B's (both with the 151,936-token vocabulary).
SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
SIZES = {
    "tiny": dict(zip(SHAPE_FIELDS, (128, 256, 2, 2, 1, 320), strict=True)),
    "20m": dict(zip(SHAPE_FIELDS, (512, 1408, 6, 8, 2, 8192), strict=True)),
    "0.5b": dict(zip(SHAPE_FIELDS, (896, 4864, 24, 14, 2, 151936), strict=True)),
    "1.5b": dict(zip(SHAPE_FIELDS, (1536, 8960, 28, 12, 2, 151936), strict=True)),
    # Qwen2.5's vocabulary on a 1-layer body: the [N, L, V] logits dominate the step's memory, as in real training.
    "wide-vocab": dict(zip(SHAPE_FIELDS, (64, 128, 1, 2, 1, 151936), strict=True)),
}  # fmt: skip


def build_model(size: str, path: Path) -> None:
    config = Qwen2Config(**SIZES[size], max_position_embeddings=4096, tie_word_embeddings=True, torch_dtype="float32")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)


def rollout_batch(args, vocab_size: int) -> QueryBatch:
    """B queries with G responses each, random tokens of varied lengths, packed by the package's `assemble_batch`
    (prompts left-padded, responses right-padded) and attached to their `QueryBatch` as the RolloutCallback does."""
    generator = torch.Generator().manual_seed(0)

    def tokens(low: int, high: int) -> list[int]:
        length = int(torch.randint(low, high + 1, (), generator=generator))
        return torch.randint(1, vocab_size, (length,), generator=generator).tolist()

    prompts = [tokens(args.prompt_len // 2, args.prompt_len) for _ in range(args.queries)]
    samples = []
    for _ in prompts:
        responses = [tokens(args.response_len // 4, args.response_len) for _ in range(args.group_size)]
        samples.append(
            [Sample(ids, (-torch.rand(len(ids), generator=generator)).tolist(), "stop") for ids in responses]
        )
    rewards = torch.randint(0, 2, (args.queries * args.group_size,), generator=generator).float()
    query_index = torch.arange(args.queries)
    rollout = assemble_batch(prompts, samples, rewards, query_index, pad_token_id=0, temperature=1.0)
    return QueryBatch(query_index, prompts, [""] * args.queries, rollout=rollout)


def attach_reference_cache(module, batch: QueryBatch, initial: torch.nn.Module | None = None, layout=None) -> None:
    """What `erpo cache` computes once before training (with the same function): the initial policy's log-probs of
    the batch's queries, set as `module.reference_cache`; and the query scores QueryDataModule's stream carries
    from it (s(q), and w(q) when the algorithm makes it static), on the batch's rollout. `initial`: a model holding
    the initial weights (None = the module's policy, loaded and not yet trained). `layout`: the query-scoring layout
    (None = the default, `data.query_score_rows` 8 and `query_score_width_multiple` 64)."""
    from dataclasses import replace

    from erpo_lightning.data.cache import ReferenceLogprobCache
    from erpo_lightning.data.reference_logprobs import batch_query_logprobs

    QueryScoringLayout = scoring_layout_class()
    scorer = module.policy if initial is None else initial
    layout = layout or QueryScoringLayout()  # the cache's layout, which the step's exact Query-KL scores in
    cache = ReferenceLogprobCache.from_rows(batch_query_logprobs(scorer, batch.prompt_ids, layout), layout)
    module.reference_cache = cache
    rows, table = batch.rollout.query_index, module.algorithm.query_weight_table(cache.nll)
    batch.rollout = replace(
        batch.rollout, reference_nll=cache.nll[rows], query_weights=None if table is None else table[rows]
    )


def scoring_layout_class() -> type:
    """QueryScoringLayout, from where this tree keeps it or where a --baseline-source tree before 3c7f7e0 did."""
    return import_first(
        "erpo_lightning.scoring.queries.QueryScoringLayout", "erpo_lightning.data.query_scoring.QueryScoringLayout"
    )


def scoring_layout(args):
    """The query-scoring layout of the arm (ARMS), else of `--query-score-rows` and `--query-score-width-multiple`
    (None: the default)."""
    QueryScoringLayout = scoring_layout_class()
    if args.arm is not None and ARMS[args.arm][3] is not None:
        return QueryScoringLayout(*ARMS[args.arm][3])
    if args.query_score_rows is None and args.query_score_width_multiple is None:
        return None
    default = QueryScoringLayout()
    return QueryScoringLayout(
        args.query_score_rows or default.rows, args.query_score_width_multiple or default.width_multiple
    )


def trainer_strategy(name: Strategy):
    """Lightning's strategy for `--strategy`: `model_parallel` is FSDP2 over a 1-rank data-parallel mesh."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1) if name == "model_parallel" else name


CPU = torch.device("cpu")


def fit_replayed(
    module, batch: QueryBatch, steps: int, device: torch.device = CPU, callbacks=(), strategy: Strategy = "auto"
) -> tuple:
    """Fit `module` on `batch` replayed `steps` + 1 times under `strategy` (see `trainer_strategy`). Returns the
    seconds of each step after the warm-up one (Lightning's batch start to batch end, CUDA synchronized) and the
    trainer (for its logged metrics)."""
    import lightning as L

    times: list[float] = []
    above_rest: list[float] = []  # MiB

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    class StepTimer(L.Callback):
        def on_train_batch_start(self, *_):
            synchronize()
            self.resting = resting_bytes(device)
            self.start = time.perf_counter()

        def on_train_batch_end(self, *_):
            synchronize()
            times.append(time.perf_counter() - self.start)
            above_rest.append((peak_bytes(device) - self.resting) / 2**20)

    trainer = L.Trainer(
        max_steps=steps + 1, accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
        strategy=trainer_strategy(strategy), logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StepTimer(), *callbacks],
    )  # fmt: skip
    loader = torch.utils.data.DataLoader([batch] * (steps + 1), batch_size=None, collate_fn=lambda b: b)
    trainer.fit(module, train_dataloaders=loader)
    return times[1:], trainer, above_rest[1:]


def resting_bytes(device: torch.device) -> int:
    """Memory in use before a step (weights, gradients, optimizer state, the replayed batch), with the step's peak
    counter reset: CUDA's allocated bytes, or on CPU the resident set (VmHWM reset through /proc/self/clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


def peak_bytes(device: torch.device) -> int:
    """The peak since `resting_bytes`: CUDA's max allocated, or the resident set's high-water mark on CPU."""
    return torch.cuda.max_memory_allocated() if device.type == "cuda" else status_bytes("VmHWM")


def policy_path(args) -> Path:
    """`--model-path` (an existing Hugging Face folder), else the `--size` model main() built in the work folder."""
    return Path(args.model_path) if args.model_path else Path(args.workdir) / "model"


def worker(args) -> dict:
    """One arm: warm-up step, then `--steps` timed steps; returns times, peak memory, the last Query-KL and
    whether the policy was sharded (its weights FSDP2's DTensors)."""
    from torch.distributed.tensor import DTensor

    from erpo_lightning.modules.erpo_module import ERPOModule

    # where this tree keeps it, or a --baseline-source tree before 81cc15a
    load_reference_model = import_first(
        "erpo_lightning.data.cache_build.load_reference_model", "erpo_lightning.data.datamodule.load_reference_model"
    )

    torch.set_num_threads(args.threads)
    model_path = policy_path(args)
    batch = rollout_batch(args, AutoConfig.from_pretrained(model_path).vocab_size)
    algorithm, scoring, fused, _ = ARMS[args.arm]
    module = ERPOModule(
        str(model_path), algorithm=algorithm, dtype=args.dtype, micro_batch_tokens=args.micro_batch_tokens,
        query_kl_scoring=scoring, **({"fused_output_layer": True} if fused else {}),  # a baseline tree may lack it
        **ARM_SETTINGS.get(args.arm, {}),
    )  # fmt: skip
    device = torch.device(args.device)
    if args.strategy == "auto":
        module.configure_model()
        module.policy.to(device)
        attach_reference_cache(module, batch, layout=scoring_layout(args))
    else:  # the strategy calls configure_model inside fit, with its mesh set, to shard; score with a copy till then
        initial = load_reference_model(str(model_path), args.dtype, device)
        attach_reference_cache(module, batch, initial, scoring_layout(args))
        del initial

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times, trainer, above_rest = fit_replayed(module, batch, args.steps, device, strategy=args.strategy)
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    return {
        "step_s": times,
        "peak_mib": peak,
        "above_rest_mib": above_rest,
        "query_kl": float(trainer.callback_metrics["train/query_kl"]),
        "sharded": any(isinstance(p, DTensor) for p in module.policy.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="20m", help="the built model's shape (no --model-path)")
    parser.add_argument("--model-path", help="an existing Hugging Face model folder instead of a built --size model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--strategy", choices=get_args(Strategy), default="auto", help="model_parallel = FSDP2")
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=128)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to run (default all)")
    parser.add_argument(
        "--baseline-source",
        help="a source tree (e.g. a git worktree of an earlier commit): each arm runs a second time with its code, "
        "interleaved with this tree's, named <arm>@baseline",
    )
    parser.add_argument(
        "--query-score-rows",
        type=int,
        help="queries per query-scoring forward (data.query_score_rows; default 8); an older --baseline-source may "
        "not know it",
    )
    parser.add_argument("--query-score-width-multiple", type=int, help="data.query_score_width_multiple (default 64)")
    parser.add_argument(
        "--baseline-arms", nargs="+", help="the arms run from --baseline-source (default: --arms; an arm that tree "
        "does not have fails)",
    )  # fmt: skip
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(worker(args)))
        return

    with tempfile.TemporaryDirectory() as workdir:
        if not args.model_path:
            build_model(args.size, Path(workdir) / "model")
        workers = {name: ["--arm", name, "--workdir", workdir] for name in args.arms}
        sources = {}
        if args.baseline_source:
            baseline = str(Path(args.baseline_source).resolve())
            for name in args.baseline_arms or args.arms:
                workers[f"{name}@baseline"] = ["--arm", name, "--workdir", workdir]
                sources[f"{name}@baseline"] = baseline
        results = run_workers(__file__, workers, args.rounds, sources)
    summary = {
        name: {
            **spread([run["step_s"] for run in runs]),
            "peak_mib": max(run["peak_mib"] for run in runs),
            "above_rest_mib_median": statistics.median(m for run in runs for m in run["above_rest_mib"]),
            "query_kl_last": runs[-1]["query_kl"],
            "sharded": runs[-1]["sharded"],
        }
        for name, runs in results.items()
    }
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("arm", "workdir")},
        "torch": torch.__version__,
        "results": summary,
        "ratios": ratios(summary),
        "ratio_rounds": ratio_rounds(summary),
    }
    print(json.dumps(report, indent=2))


RATIOS = {  # name -> (numerator, denominator, quantity)
    "step_erpo_over_grpo": ("erpo", "grpo", "step_s_median"),
    "step_erpo_shared_forward_over_grpo": ("erpo_shared_forward", "grpo", "step_s_median"),
    "peak_erpo_over_grpo": ("erpo", "grpo", "peak_mib"),
    "step_erpo_over_grpo_kl": ("erpo", "grpo_kl", "step_s_median"),
    "step_grpo_kl_over_grpo": ("grpo_kl", "grpo", "step_s_median"),
    "peak_erpo_over_grpo_kl": ("erpo", "grpo_kl", "peak_mib"),
    "step_erpo_shared_prompt_over_grpo": ("erpo_shared_prompt", "grpo", "step_s_median"),
    "step_erpo_shared_prompt_over_grpo_shared_prompt": ("erpo_shared_prompt", "grpo_shared_prompt", "step_s_median"),
    "step_erpo_shared_prompt_over_erpo": ("erpo_shared_prompt", "erpo", "step_s_median"),
    "step_erpo_fused_over_grpo_fused": ("erpo_fused", "grpo_fused", "step_s_median"),
    "step_erpo_fused_over_erpo": ("erpo_fused", "erpo", "step_s_median"),
    "step_erpo_alone_over_grpo_alone": ("erpo_alone", "grpo_alone", "step_s_median"),
    "step_erpo_alone_over_erpo": ("erpo_alone", "erpo", "step_s_median"),
    "above_rest_erpo_alone_over_erpo": ("erpo_alone", "erpo", "above_rest_mib_median"),
    "step_gspo_over_grpo": ("gspo", "grpo", "step_s_median"),
    "step_gspo_erpo_over_erpo": ("gspo_erpo", "erpo", "step_s_median"),
    "step_cispo_over_grpo": ("cispo", "grpo", "step_s_median"),
    "step_cispo_erpo_over_erpo": ("cispo_erpo", "erpo", "step_s_median"),
    "step_grpo_entropy_bonus_over_grpo": ("grpo_entropy_bonus", "grpo", "step_s_median"),
    "peak_grpo_entropy_bonus_over_grpo": ("grpo_entropy_bonus", "grpo", "peak_mib"),
    "step_erpo_compiled_over_erpo": ("erpo_compiled", "erpo", "step_s_median"),
    "step_grpo_compiled_over_grpo": ("grpo_compiled", "grpo", "step_s_median"),
    "peak_erpo_compiled_over_erpo": ("erpo_compiled", "erpo", "peak_mib"),
}


def ratios(summary: dict[str, dict]) -> dict[str, float]:
    """The RATIOS whose arms ran; for each arm run against a baseline source, this tree's step time and peak over
    the baseline's (`step_<arm>_over_baseline`, `peak_<arm>_over_baseline`, `above_rest_<arm>_over_baseline`); and
    with the baseline's erpo, every other arm's step time and memory above rest over it
    (`step_<arm>_over_erpo@baseline`, `above_rest_<arm>_over_erpo@baseline`)."""
    found = {
        name: summary[top][quantity] / summary[bottom][quantity]
        for name, (top, bottom, quantity) in RATIOS.items()
        if top in summary and bottom in summary
    }
    for name in summary:
        if f"{name}@baseline" in summary:
            baseline = summary[f"{name}@baseline"]
            found[f"step_{name}_over_baseline"] = summary[name]["step_s_median"] / baseline["step_s_median"]
            found[f"peak_{name}_over_baseline"] = summary[name]["peak_mib"] / baseline["peak_mib"]
            found[f"above_rest_{name}_over_baseline"] = (
                summary[name]["above_rest_mib_median"] / baseline["above_rest_mib_median"]
            )
    before = summary.get("erpo@baseline")
    for name in summary:
        if before is not None and name != "erpo" and not name.endswith("@baseline"):
            found[f"step_{name}_over_erpo@baseline"] = summary[name]["step_s_median"] / before["step_s_median"]
            found[f"above_rest_{name}_over_erpo@baseline"] = (
                summary[name]["above_rest_mib_median"] / before["above_rest_mib_median"]
            )
    return found


def ratio_rounds(summary: dict[str, dict]) -> dict[str, list[float]]:
    """Each step-time ratio of `ratios` (a RATIOS entry or `step_<arm>_over_baseline`) taken within each round
    alone (`interleave.round_ratios`): how much it moves with the machine's load."""
    pairs = {name: (top, bottom) for name, (top, bottom, quantity) in RATIOS.items() if quantity == "step_s_median"}
    pairs.update({f"step_{name}_over_baseline": (name, f"{name}@baseline") for name in summary})
    return round_ratios(summary, pairs)


if __name__ == "__main__":
    main()
