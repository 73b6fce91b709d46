"""Entropy controls of the policy-gradient loss: the entropy bonus, its adaptive coefficient, and the high-entropy
token mask.

- bonus: loss −= c · H̄, H̄ the mean per-token entropy (nats) of the policy over the response tokens the loss trains
  on; its gradient is −c ∇H̄, so it needs an entropy with gradient (`token_entropy`).
- adaptive coefficient (Skywork-OR1, TRL's `use_adaptive_entropy`): `EntropyControl` moves c by a fixed step each
  optimizer step, up while the last step's H̄ is at or below a target, down otherwise, and applies it only while
  H̄ is at or below the target.
- high-entropy mask ("Beyond the 80/20 rule", TRL's `top_entropy_quantile`): only the top-ρ share of tokens by
  entropy keep their policy-gradient term (`high_entropy_mask`).

verl's Clip-Cov / KL-Cov (which clip or KL-penalise the tokens of highest covariance between log π and A) are not
implemented: they need the batch's covariance ranking inside the surrogate, not a token mask or an added term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Elements of one chunk's float32 temporaries in `token_entropy` (64 MiB), as the log-prob code uses.
ENTROPY_CHUNK_ELEMENTS = 1 << 24


def _chunks(rows: int, length: int, positions: int):
    for row in range(rows):
        for start in range(0, length, positions):
            yield row, slice(start, start + positions)


def _chunk_logits(x: torch.Tensor, weight: torch.Tensor | None, row: int, pos: slice) -> torch.Tensor:
    return x[row, pos] if weight is None else torch.nn.functional.linear(x[row, pos], weight)


class _ChunkedEntropy(torch.autograd.Function):
    """H_t = −Σ_j p_tj log p_tj of softmax(scale_t · z_t) at each position, chunk by chunk, with its gradient
    dH/dz_j = −scale · p_j (log p_j + H). z = x (logits [N, L, V]) or x @ weight.T (hidden states [N, L, H] with the
    output layer's weight [V, H]). Autograd keeps x, the [N, L] logsumexps and entropies; no float32 copy of the
    whole logits."""

    @staticmethod
    def forward(ctx, x, weight, scale, positions):
        compute = torch.promote_types(x.dtype, torch.float32)
        rows, length, _ = x.shape
        entropy = torch.empty(rows, length, dtype=compute, device=x.device)
        lse = torch.empty_like(entropy)
        for row, pos in _chunks(rows, length, positions):
            scaled = _chunk_logits(x, weight, row, pos).to(compute) * scale[pos, None]
            chunk_lse = torch.logsumexp(scaled, dim=-1)
            log_p = scaled - chunk_lse[..., None]
            lse[row, pos], entropy[row, pos] = chunk_lse, -(log_p.exp() * log_p).sum(-1)
        ctx.save_for_backward(x, weight, scale, lse, entropy)
        ctx.positions = positions
        return entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_entropy):
        x, weight, scale, lse, entropy = ctx.saved_tensors
        grad = torch.empty_like(x)
        grad_weight = None if weight is None else torch.zeros_like(weight, dtype=lse.dtype)
        for row, pos in _chunks(*x.shape[:2], ctx.positions):
            log_p = _chunk_logits(x, weight, row, pos).to(lse.dtype) * scale[pos, None] - lse[row, pos, None]
            g = (grad_entropy[row, pos] * scale[pos])[..., None]
            chunk = -g * log_p.exp() * (log_p + entropy[row, pos, None])
            if weight is None:
                grad[row, pos] = chunk.to(x.dtype)
            else:
                chunk = chunk.to(weight.dtype)
                grad[row, pos] = chunk @ weight
                grad_weight += (chunk.T @ x[row, pos]).to(grad_weight.dtype)
        return grad, None if weight is None else grad_weight.to(weight.dtype), None, None


def token_entropy(
    logits: torch.Tensor,
    inverse_temperature: torch.Tensor | float = 1.0,
    output_weight: torch.Tensor | None = None,
    chunk_elements: int = ENTROPY_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """[N, L] entropy (nats) of softmax(logits[:, t] · inverse_temperature[t]) at every position, differentiable.

    Args:
        logits: [N, L, V] in any float dtype; or, with `output_weight` [V, H], the last hidden states [N, L, H]
            whose logits are `logits @ output_weight.T`, made a chunk at a time (they never exist whole).
        inverse_temperature: [L] (or a scalar) 1 / T of each position.
    Returns:
        [N, L] float32 (float64 for float64 logits); entry t is the entropy of the distribution at position t
        (which predicts token t + 1).
    """
    length = logits.shape[1]
    scale = torch.as_tensor(inverse_temperature, dtype=torch.float32, device=logits.device).expand(length)
    vocab = logits.shape[-1] if output_weight is None else output_weight.shape[0]
    return _ChunkedEntropy.apply(logits, output_weight, scale.contiguous(), max(1, chunk_elements // vocab))


@torch.no_grad()
def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """[N, T] bool: the response tokens whose entropy is at least the (1 − ρ)-quantile of the batch's response-token
    entropies (ρ = `top_fraction`; linear interpolation between order statistics, as `torch.quantile`), so about the
    top-ρ share of tokens. ρ = 1 keeps every real token; ρ = 0 keeps only those at the highest entropy.

    Args:
        entropy: [N, T] per-token entropy (nats), any values on padding.
        mask: [N, T] 1 on response tokens.
    """
    real = mask.bool()
    if top_fraction >= 1.0:
        return real
    values = entropy.detach()[real].float()
    if values.numel() == 0:
        return real
    threshold = torch.quantile(values, 1.0 - top_fraction)
    return real & (entropy.detach() >= threshold.to(entropy.dtype))


def entropy_bonus_term(
    entropy: torch.Tensor, kept: torch.Tensor, response_mask: torch.Tensor, tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """H̄, the quantity the bonus maximises (0-dim, nats, with the entropy's gradient): the mean entropy over the
    `kept` tokens of this batch, times this batch's share of the step's response tokens (`tokens`, the step's
    global count; None = this batch's own, share 1).

    Summed over the micro-batches of a step it is the token-weighted mean of their kept-token means: with every token
    kept, the step's mean per-token entropy exactly; with one micro-batch, the kept tokens' mean (TRL's bonus).

    Args:
        entropy: [N, T] per-token entropy (nats).
        kept: [N, T] bool, the tokens the bonus acts on (the response tokens, or the high-entropy ones).
        response_mask: [N, T] 1 on response tokens.
    """
    kept_f = kept.to(entropy.dtype)
    mean = (torch.where(kept, entropy, 0.0)).sum() / kept_f.sum().clamp(min=1)
    local = response_mask.sum().to(entropy.dtype)
    share = 1.0 if tokens is None else local / torch.as_tensor(tokens, dtype=entropy.dtype).clamp(min=1)
    return mean * share


@dataclass
class EntropyControl:
    """The adaptive entropy coefficient (Skywork-OR1's controller, as TRL's `use_adaptive_entropy`): after each
    optimizer step, c ← min(c + δ, c_max) if that step's mean entropy H̄ ≤ target, else max(c − δ, c_min); a step
    applies c only while the previous step's H̄ was ≤ target (none before the first step is measured).

    Without a target the coefficient is constant (the plain bonus). The runner of the steps owns one, reads
    `applied` before a step, calls `update` after it, and checkpoints `state_dict`.

    Attributes:
        coef: c, the current coefficient (starts at `entropy_coef`).
        target: the target entropy (nats per token), or None (constant coefficient).
        delta, low, high: δ, c_min, c_max.
        last_entropy: H̄ of the last optimizer step (nats; inf before the first).
    """

    coef: float
    target: float | None = None
    delta: float = 0.0
    low: float = 0.0
    high: float = math.inf
    last_entropy: float = math.inf

    @staticmethod
    def of(settings) -> EntropyControl:
        """The controller of `LossSettings`-like settings (`entropy_coef`, `entropy_target`, `entropy_coef_delta`,
        `entropy_coef_range`)."""
        low, high = settings.entropy_coef_range
        return EntropyControl(settings.entropy_coef, settings.entropy_target, settings.entropy_coef_delta, low, high)

    @property
    def applied(self) -> float:
        """The coefficient the next step applies: c, or 0 while the last step's entropy is above the target."""
        if self.target is None:
            return self.coef
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy: float) -> None:
        """Take one optimizer step's mean entropy H̄ (nats per token, over the tokens the bonus acts on)."""
        if self.target is None:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = float(entropy)

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
