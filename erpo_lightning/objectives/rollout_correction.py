"""Engine–trainer mismatch correction: truncated (TIS) or masked (MIS) importance weights on the sampled tokens.

The rollout engine (vLLM in bf16, another kernel, another temperature path) samples from μ, while the trainer
scores the same tokens under its own π_old (the policy before any update on the batch, as the trainer computes it).
The PPO surrogate treats the samples as π_old's; the weight ρ = π_old / μ of each sampled token (or of each whole
response) makes their policy-gradient terms an importance-sampled estimate under π_old again, and the cap bounds its
variance. The weights are constants (no gradient) and multiply only the per-token policy-gradient terms.
"""

from __future__ import annotations

from typing import Literal

import torch

from erpo_lightning.objectives.policy import RATIO_LOG_CLAMP

RolloutCorrection = Literal["none", "tis", "mis"]
RolloutCorrectionLevel = Literal["token", "sequence"]

# verl's default threshold for its rollout importance weights; TRL's `vllm_importance_sampling_clip_max` is 3.
DEFAULT_ROLLOUT_CORRECTION_CAP = 2.0


def rollout_log_ratios(
    trainer_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    level: RolloutCorrectionLevel = "token",
) -> torch.Tensor:
    """[N, R] log ρ: log π_old − log μ of each sampled token (nats), or of its whole response, on every token of it.

    token:    log ρ_it = clamp(l_it − s_it, ±RATIO_LOG_CLAMP) on real tokens, 0 on padding.
    sequence: log ρ_i = clamp(Σ_t m_it (l_it − s_it), ±RATIO_LOG_CLAMP), the log of the product of the response's
              token ratios, broadcast over the row's real tokens (0 on padding).

    Args:
        trainer_logprobs: [N, R] l, the trainer's log-probs (nats) of the sampled tokens before any update on the
            batch; detached here.
        sampling_logprobs: [N, R] s, the engine's log-probs (nats) of the same tokens
            (`RolloutBatch.sampling_logprobs`).
        mask: [N, R] m, 1 on response tokens.
        level: `token` or `sequence`.
    The clamp only keeps exp finite (e^20 ≈ 4.9e8): it leaves every weight within caps in [e^-20, e^20] unchanged.
    """
    real = mask.bool()
    per_token = torch.where(real, trainer_logprobs.detach().float() - sampling_logprobs.detach().float(), 0.0)
    if level == "sequence":
        per_token = per_token.sum(-1, keepdim=True).expand_as(per_token)
    elif level != "token":
        raise ValueError(f"unknown rollout correction level {level!r}; expected token or sequence")
    return torch.where(real, per_token.clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP), 0.0)


@torch.no_grad()
def rollout_correction_weights(
    trainer_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: RolloutCorrection,
    level: RolloutCorrectionLevel = "token",
    cap: float = DEFAULT_ROLLOUT_CORRECTION_CAP,
    floor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Importance weights of the sampled tokens for the engine–trainer mismatch, no gradient.

    With ρ = exp(`rollout_log_ratios`) (per token, or the response's product on each of its tokens) and the band
    [floor, cap] (floor None = 0):
        tis: w = min(max(ρ, floor), cap)       (truncated: ρ clipped into the band)
        mis: w = ρ · 1[floor ≤ ρ ≤ cap]         (masked: ρ kept inside the band, 0 outside it)
        none: w = 1
    Padding gets w = 1 (its loss is masked anyway).

    Args:
        trainer_logprobs, sampling_logprobs, mask, level: as `rollout_log_ratios`.
        mode: `none`, `tis` or `mis`.
        cap: the band's upper end (> 0; inf = none); floor: its lower end (< cap), or None.
    Returns:
        weights [N, R] (dimensionless, float32), ratio ρ [N, R] (1 on padding), and outside [N, R] bool: the real
        tokens whose ρ left the band (clipped under tis, zeroed under mis; False everywhere under none).
    """
    real = mask.bool()
    ratio = torch.exp(rollout_log_ratios(trainer_logprobs, sampling_logprobs, mask, level))
    low = 0.0 if floor is None else floor
    outside = real & ((ratio > cap) | (ratio < low))
    if mode == "none":
        return torch.ones_like(ratio), ratio, torch.zeros_like(real)
    if mode == "tis":
        weights = ratio.clamp(min=low, max=cap)
    elif mode == "mis":
        weights = torch.where(outside, 0.0, ratio)
    else:
        raise ValueError(f"unknown rollout correction {mode!r}; expected none, tis or mis")
    return torch.where(real, weights, 1.0), ratio, outside
