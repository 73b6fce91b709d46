"""The policy's optimizer and learning-rate schedule (AdamW with linear warm-up, or any pair a config names), and the
guard that decides whether an optimizer step with non-finite values is taken.

Who owns each setting (one owner each):

- `model.optimizer` unset (the default): AdamW with `lr = model.learning_rate` (default 1e-6) and `weight_decay =
  model.weight_decay`, which when unset is the algorithm preset's (0.01 for `erpo_released`, else 0).
- `model.optimizer` set (e.g. `class_path: torch.optim.SGD`): its `init_args` own the learning rate and the weight
  decay; `model.learning_rate` and `model.weight_decay` must then stay unset, and the preset's weight decay is not
  applied.
- `model.lr_scheduler` unset: `LinearWarmup(model.warmup_steps)`; set: it owns the schedule and
  `model.warmup_steps` must stay 0.

The module uses manual optimization and steps the scheduler once per optimizer step (several per rollout batch), so a
schedule counts optimizer steps; `ReduceLROnPlateau`, which needs a monitored metric, is refused.

With `model.offload_optimizer` the optimizer is built over host (CPU) copies of the trainable weights
(`OptimizerOffload`), so its state never occupies the accelerator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

DEFAULT_LEARNING_RATE = 1e-6


class LinearWarmup(LambdaLR):
    """Learning rate × min(1, (step + 1) / (warmup_steps + 1)): a linear ramp over `warmup_steps` optimizer steps,
    then constant (warmup_steps 0 = constant from the first step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int = 0, last_epoch: int = -1) -> None:
        self.check_steps(warmup_steps)
        self.warmup_steps = warmup_steps

        def factor(step: int) -> float:
            return min(1.0, (step + 1) / (warmup_steps + 1))

        super().__init__(optimizer, factor, last_epoch)

    @staticmethod
    def check_steps(warmup_steps: int, field: str = "warmup_steps") -> None:
        """ValueError naming `field` when the ramp length is negative."""
        if warmup_steps < 0:
            raise ValueError(f"{field} must be >= 0, got {warmup_steps}")


def check_optimizer_settings(
    optimizer: OptimizerCallable | None,
    lr_scheduler: LRSchedulerCallable | None,
    learning_rate: float | None,
    weight_decay: float | None,
    warmup_steps: int,
) -> None:
    """ValueError when a setting has two owners (see the module docstring) or is out of range."""
    if optimizer is not None:
        for name, value in (("learning_rate", learning_rate), ("weight_decay", weight_decay)):
            if value is not None:
                raise ValueError(
                    f"model.{name} is set together with model.optimizer, whose init_args own it: set it there "
                    f"(e.g. model.optimizer.init_args.{'lr' if name == 'learning_rate' else name}) and remove "
                    f"model.{name}"
                )
    if lr_scheduler is not None and warmup_steps != 0:
        raise ValueError(
            "model.warmup_steps is set together with model.lr_scheduler, which owns the schedule: remove "
            "model.warmup_steps (a warm-up from the config: class_path erpo_lightning.modules.optim.LinearWarmup, "
            "init_args.warmup_steps)"
        )
    LinearWarmup.check_steps(warmup_steps, "model.warmup_steps")
    for name, value in (("learning_rate", learning_rate), ("weight_decay", weight_decay)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"model.{name} must be >= 0 (or null), got {value!r}")


def build_optimizer(
    parameters: Iterable[torch.nn.Parameter],
    optimizer: OptimizerCallable | None,
    lr_scheduler: LRSchedulerCallable | None,
    learning_rate: float | None,
    weight_decay: float,
    warmup_steps: int,
) -> tuple[torch.optim.Optimizer, LRScheduler]:
    """The optimizer over `parameters` and its per-optimizer-step schedule.

    Args:
        optimizer, lr_scheduler: callables from the config (None = AdamW / LinearWarmup, see the module docstring).
        learning_rate: AdamW's learning rate (None = DEFAULT_LEARNING_RATE); unused with `optimizer`.
        weight_decay: AdamW's weight decay (the module resolves model.weight_decay or the preset's); unused with
            `optimizer`.
        warmup_steps: LinearWarmup's ramp length in optimizer steps; unused with `lr_scheduler`.
    """
    parameters = list(parameters)
    if optimizer is None:
        lr = DEFAULT_LEARNING_RATE if learning_rate is None else learning_rate
        built = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    else:
        built = optimizer(parameters)
    schedule = LinearWarmup(built, warmup_steps) if lr_scheduler is None else lr_scheduler(built)
    if isinstance(schedule, ReduceLROnPlateau):
        raise ValueError(
            "model.lr_scheduler: ReduceLROnPlateau needs a monitored metric, but the schedule is stepped once per "
            "optimizer step without one; choose a step-based schedule (e.g. torch.optim.lr_scheduler.CosineAnnealingLR)"
        )
    return built, schedule


class OptimizerOffload:
    """Copies of the trainable weights in host (CPU) memory, which the optimizer is built over and steps, so
    that its state (AdamW's two moments, 2 × the weights' bytes) stays in host memory (`model.offload_optimizer`).

    Each optimizer step copies every gradient device → host, runs the optimizer on the CPU, and copies every updated
    weight host → device: the same update as the optimizer on the device, in the CPU's kernels (bit for bit on a CPU
    device, where both run the same kernels). The host copies are taken from the weights when the optimizer is built,
    which Lightning does after a resume has loaded them. Host memory: weights, gradients and state, 16 bytes per
    float32 trainable parameter with AdamW (pinned on a CUDA device, for faster copies).

    Args:
        parameters: the policy's trainable parameters, on their device.
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        self.device_parameters = parameters = list(parameters)
        self.host_parameters = [torch.nn.Parameter(self._host_like(p).copy_(p.detach())) for p in parameters]
        self._host_grads = [self._host_like(p) for p in self.device_parameters]  # reused by every step

    @staticmethod
    def _host_like(parameter: torch.Tensor) -> torch.Tensor:
        """An uninitialised host tensor of `parameter`'s shape and dtype (its own storage, also on a CPU device)."""
        return torch.empty(parameter.shape, dtype=parameter.dtype, device="cpu", pin_memory=parameter.is_cuda)

    def step(self, optimizer: torch.optim.Optimizer, take_step: Callable[[], object]) -> None:
        """One optimizer step of `optimizer` (built over `host_parameters`): the device gradients are copied to the
        host, `take_step()` steps it (Lightning's wrapper of it, which counts the step), and the updated weights are
        copied back into the device parameters.

        Lightning moves a resumed optimizer's state to the device (`load_optimizer_state_dict`); it is moved back to
        the host here first, so the CPU step finds its state beside its weights.
        """
        with torch.no_grad():
            pairs = zip(self.device_parameters, self.host_parameters, self._host_grads, strict=True)
            for device_parameter, host, grad in pairs:
                host.grad = None if device_parameter.grad is None else grad.copy_(device_parameter.grad)
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    state[key] = value.cpu()
        take_step()
        with torch.no_grad():
            for device_parameter, host in zip(self.device_parameters, self.host_parameters, strict=True):
                if host.grad is not None:  # a weight without a gradient was not stepped
                    device_parameter.copy_(host)


def weight_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of `parameters` (over all ranks' shards under FSDP2), computed in their dtype's range.

    It is inf when any weight is non-finite, and also when the weights are finite but so large that their squares
    overflow (e.g. after a step with learning rate 1e30): the model's own normalisation layers would overflow too.
    """
    total = torch.nn.utils.get_total_norm([p.detach() for p in parameters], norm_type=2.0)
    return total.full_tensor() if hasattr(total, "full_tensor") else total  # a DTensor's partial norm: reduced


class NonFiniteLossError(RuntimeError):
    """A loss or gradient was NaN/inf (raised before the optimizer step), or the weights after a step were."""


@dataclass
class NonFiniteGuard:
    """`nan_policy` applied to each optimizer step: `stop` raises on a non-finite value, `skip` drops the step and
    counts it, up to `max_consecutive_skips` in a row. The counts are saved in checkpoints."""

    nan_policy: Literal["stop", "skip"] = "stop"
    max_consecutive_skips: int = 10
    skipped_steps: int = 0
    consecutive_skips: int = 0

    def __post_init__(self) -> None:
        if self.nan_policy not in ("stop", "skip"):
            raise ValueError(f"model.nan_policy must be 'stop' or 'skip', got {self.nan_policy!r}")
        if self.max_consecutive_skips < 1:
            raise ValueError(f"model.max_consecutive_skips must be >= 1, got {self.max_consecutive_skips}")

    def finite(self, name: str, value: torch.Tensor, where: str) -> bool:
        """True when `value` is finite; else raise (`stop`) or False (`skip`). `where` locates the step."""
        if torch.isfinite(value).all():
            return True
        if self.nan_policy == "stop":
            raise NonFiniteLossError(
                f"non-finite {name} at {where}; set model.nan_policy=skip to drop such steps instead"
            )
        return False

    def check_weights(
        self, norm: torch.Tensor, where: str, remedy: str = "lower the learning rate or enable model.gradient_clip_norm"
    ) -> None:
        """Raise NonFiniteLossError when the weights' global norm after the optimizer step at `where` is not finite.

        Under either policy: the step is taken, it cannot be dropped, and training on would only fail later (in
        sampling) or save a broken checkpoint. `remedy` names the settings of the caller's own interface.
        """
        if not torch.isfinite(norm).all():
            raise NonFiniteLossError(
                f"the policy weights are not finite after the optimizer step at {where} (global norm {float(norm)}): "
                f"the update diverged; {remedy}"
            )

    def record(self, stepped: bool) -> None:
        """Count a taken or a skipped step; raise after `max_consecutive_skips` skipped steps in a row."""
        if stepped:
            self.consecutive_skips = 0
            return
        self.skipped_steps += 1
        self.consecutive_skips += 1
        if self.consecutive_skips >= self.max_consecutive_skips:
            raise NonFiniteLossError(
                f"{self.consecutive_skips} optimizer steps in a row had non-finite values; stopping "
                "(lower the learning rate, check rewards for NaN, or raise model.max_consecutive_skips)"
            )
