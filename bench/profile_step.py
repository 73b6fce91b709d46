"""What our training step costs beyond the model: ERPOModule's step (through Lightning) against a plain PyTorch loop
over the same model, rollout batch and optimizer; prints JSON (with the share of one of our steps' CPU time spent in
`optimizer.step`, the most any optimizer choice can change) and that step's torch.profiler table on stderr.

The plain loop is the least a GRPO step must do: one forward, response log-softmax, the token-mean policy-gradient
loss, backward, gradient clipping at 1.0, AdamW. `ours` is `ERPOModule(algorithm=...)` fed a replayed batch (as
bench_step.py does), `*_fused` the same with torch's fused AdamW (TRL's default optimizer, `adamw_torch_fused`).
The four sides are interleaved in one process over `--rounds`; medians over `--steps` timed steps each (after one
warm-up step).

    .venv/bin/python bench/profile_step.py [--size 20m] [--queries 4] [--group-size 4] [--rounds 2] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from bench_step import SIZES, attach_reference_cache, build_model, fit_replayed, rollout_batch
from interleave import alternating
from transformers import AutoModelForCausalLM

from erpo_lightning.modules.erpo_module import ERPOModule

SIDES = ("ours", "ours_fused", "plain", "plain_fused")


def our_module(model_path: Path, batch, algorithm: str, fused: bool) -> ERPOModule:
    settings = {"algorithm": algorithm, "gradient_clip_norm": 1.0}
    if fused:
        settings["optimizer"] = lambda params: torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, fused=True)
    else:
        settings.update(learning_rate=1e-6, weight_decay=0.0)
    module = ERPOModule(str(model_path), **settings)
    module.configure_model()
    attach_reference_cache(module, batch)
    return module


def plain_steps(model_path: Path, batch, steps: int, fused: bool) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, fused=fused)
    rollout, width = batch.rollout, batch.rollout.prompt_length
    advantages = torch.randn(rollout.num_rows, 1, generator=torch.Generator().manual_seed(0))
    mask = rollout.response_mask.float()
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        logits = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits[:, width - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, rollout.input_ids[:, width:, None]).squeeze(-1)
        ratio = torch.exp(logprobs - logprobs.detach())
        loss = -(ratio * advantages * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times[1:]


class ProfileSecondStep(L.Callback):
    """torch.profiler over the second training step (the first is the warm-up); its table goes to stderr."""

    def __init__(self) -> None:
        self.step = 0

    def on_train_batch_start(self, *_):
        self.step += 1
        if self.step == 2:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.__enter__()

    def on_train_batch_end(self, *_):
        if self.step == 2:
            self.profiler.__exit__(None, None, None)
            events = self.profiler.key_averages()
            print(events.table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)
            total = sum(event.self_cpu_time_total for event in events)
            optimizer = sum(event.cpu_time_total for event in events if event.key.startswith("Optimizer.step"))
            self.optimizer_share = optimizer / total  # all of optimizer.step, the part fused AdamW could change


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="20m")
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_path = Path(tempfile.mkdtemp()) / "model"
    build_model(args.size, model_path)
    batch = rollout_batch(args, SIZES[args.size]["vocab_size"])
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for _, side in alternating(SIDES, args.rounds):
        fused = side.endswith("_fused")
        if side.startswith("ours"):
            times[side] += fit_replayed(our_module(model_path, batch, args.algorithm, fused), batch, args.steps)[0]
        else:
            times[side] += plain_steps(model_path, batch, args.steps, fused)
    profiled = ProfileSecondStep()
    fit_replayed(our_module(model_path, batch, args.algorithm, False), batch, 2, callbacks=[profiled])
    medians = {side: round(statistics.median(values), 4) for side, values in times.items()}
    report = {
        "config": vars(args),
        "step_s_median": medians,
        # The spread says which ratios are noise: steps of one side differ by several percent on a quiet machine.
        "step_s_min_max": {side: [round(min(values), 4), round(max(values), 4)] for side, values in times.items()},
        "ours_over_plain": round(medians["ours"] / medians["plain"], 3),
        "optimizer_share_of_our_step_cpu": round(profiled.optimizer_share, 4),
        "fused_over_default": {
            "ours": round(medians["ours_fused"] / medians["ours"], 3),
            "plain": round(medians["plain_fused"] / medians["plain"], 3),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
