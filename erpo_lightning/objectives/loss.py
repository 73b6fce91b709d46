"""The whole RL loss of a batch of [prompt; response] rows: weighted PG + α · Query-KL (+ β · Policy-KL)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from erpo_lightning.objectives.entropy import entropy_bonus_term, high_entropy_mask
from erpo_lightning.objectives.kl import (
    DEFAULT_KL_CLAMP,
    KLClampMode,
    KLKind,
    QueryKLAggregation,
    QueryKLEstimator,
    kl_penalty,
    per_query_kl,
    query_kl_tokens,
    query_kl_tolerance_for,
)
from erpo_lightning.objectives.policy import (
    AggregationMode,
    PolicyLoss,
    RatioLevel,
    aggregate,
    cispo_loss,
    policy_gradient_loss,
)
from erpo_lightning.objectives.rollout_correction import (
    DEFAULT_ROLLOUT_CORRECTION_CAP,
    RolloutCorrection,
    RolloutCorrectionLevel,
    rollout_correction_weights,
)


@dataclass(frozen=True)
class QueryDrift:
    """How far a step's unique queries moved from θ0, one value per query ([Q] each, no gradient, no tolerance).

    Attributes:
        query_kl: the run's Query-KL estimator.
        query_kl_token_k3: token_k3 with the released ±10 value clamp, the same for every run (a common yardstick).
        query_loglik_change: ℓθ(q) − ℓθ0(q), nats: positive when the query became more likely.
    """

    query_kl: torch.Tensor
    query_kl_token_k3: torch.Tensor
    query_loglik_change: torch.Tensor

    @staticmethod
    def cat(drifts: list[QueryDrift], device: torch.device | str) -> QueryDrift:
        """The queries of several drifts, in order (no query at all: empty tensors on `device`)."""
        return QueryDrift(*(torch.cat([getattr(d, f.name) for d in drifts] or [torch.zeros(0, device=device)])
                            for f in fields(QueryDrift)))  # fmt: skip


@dataclass(frozen=True)
class LossStats:
    """What `rl_loss` reports besides the loss, no gradient.

    Attributes:
        pg_loss: scalar, the policy-gradient term.
        pg_stats: the surrogate's statistics (`policy_gradient_loss`'s or `cispo_loss`'s: clip or truncation
            fractions, ratio mean, approximate KL, the sequence ratio's spread) and the entropy controls' (with the
            high-entropy mask `entropy_kept_frac`, the share of response tokens kept; with a bonus or a target
            `entropy_coef`, the coefficient applied, `bonus_entropy`, H̄ of the kept tokens (nats), `entropy_bonus`,
            coef · H̄, and `entropy_target`), scalar token means of this batch, by name.
        query_drift: the queries' drift, when this forward scored them (None when a forward of their own did).
        policy_kl: [N, R] per-token Policy-KL, 0 on padding (None without reference log-probs).
        entropy: [N, R] the policy's per-token entropy (nats) on the responses; logprob_abs_diff: [N, R]
            |trainer − sampler| log-prob of each sampled token, from an on-policy forward. Both are added by the
            trainer that ran the forward (None from `rl_loss`).
        rollout_is_ratio: [N, R] the engine–trainer ratio ρ of each response token (its response's under
            `rollout_correction_level: sequence`), 1 on padding; rollout_is_outside: [N, R] bool, the tokens whose ρ
            left the band (clipped or zeroed). Both None unless `rollout_correction` is on and sampling log-probs
            were given (`objectives.rollout_correction_weights`).
    """

    pg_loss: torch.Tensor
    pg_stats: dict[str, torch.Tensor]
    query_drift: QueryDrift | None = None
    policy_kl: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    logprob_abs_diff: torch.Tensor | None = None
    rollout_is_ratio: torch.Tensor | None = None
    rollout_is_outside: torch.Tensor | None = None


def query_token_mask(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """[N, P] 1 on the scored query tokens of left-padded prompts: real prompt tokens except each row's first."""
    prompt_mask = attention_mask[:, :prompt_length]
    return prompt_mask * (prompt_mask.cumsum(-1) > 1).to(prompt_mask.dtype)


def split_prompt_response(
    token_logprobs: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split per-token log-probs of `[prompt; response]` rows into query and response parts.

    Args:
        token_logprobs: [N, P + R], column t = log p(token t | tokens < t) (as `scoring` returns them).
        attention_mask: [N, P + R], prompts left-padded to width P, responses right-padded.
        prompt_length: P.
    Returns:
        query_logprobs [N, P], query_mask [N, P] (real prompt tokens except each row's first, which is unscored),
        response_logprobs [N, R], response_mask [N, R].
    """
    return (
        token_logprobs[:, :prompt_length],
        query_token_mask(attention_mask, prompt_length),
        token_logprobs[:, prompt_length:],
        attention_mask[:, prompt_length:],
    )


@dataclass(frozen=True)
class LossSettings:
    """The knobs of `rl_loss` (the loss side of an algorithm; `algorithms.Algorithm` extends it with presets).

    Each field has one entry below, `name: description`: `algorithms.loss_setting_docs` reads them for the CLI help
    and docs/loss_settings.md.

    Attributes:
        loss_aggregation: how the per-token policy-gradient terms become one scalar (`objectives.aggregate`):
            `token_mean` (each response token of the batch weighs the same; DAPO, the paper), `seq_mean_token_mean`
            (mean over responses of each response's token mean; the original GRPO, the released code),
            `seq_mean_token_sum` (mean over responses of their token sums) or `seq_sum_constant` (token sums divided
            by a constant, Dr. GRPO; the module's `loss_constant`).
        clip_low: PPO clip ε_low: the ratio of a token with a negative advantage is clipped at 1 - ε_low.
        clip_high: PPO clip ε_high: the ratio of a token with a positive advantage is clipped at 1 + ε_high (DAPO's
            clip-higher: 0.28); None = clip_low.
        dual_clip: Dual-clip PPO's c > 1: a token with a negative advantage A loses at most -c·A; None = off.
        query_kl_coef: α, the weight of Query-KL in the loss (0 = not optimised; it is logged either way).
        query_kl_estimator: `sequence_k3`: k3 of each query's summed log-likelihood change (the paper);
            `token_k3`: mean over the query's tokens of per-token k3 (the released code) (`per_query_kl`).
        query_kl_aggregation: `per_query`: mean of `per_query_kl` over unique queries (the paper: each query once);
            `like_pg`: per-token k3 on every row's prompt tokens aggregated like the PG loss, with its normaliser
            (the released code; needs `token_k3`).
        query_kl_tolerance: per-token log-ratio (nats) that the Query-KL *loss* takes as numerical noise: within it
            a query token counts as unmoved, value and gradient 0 (`within_tolerance_as_zero`), so n·τ nats of each
            n-token query's drift go unpenalised. Needed only where the step's query scores are not the cache's to
            the bit (ERPOModule's `query_kl_scoring: shared_forward`, the TRL trainer): there the rounding gap gives
            Adam a gradient to normalise into full learning-rate steps in a noise direction (docs/erpo.md, "Query-KL
            at θ0"). None = 0 under exact scoring, else `query_kl_tolerance_for(policy compute dtype)`, resolved by
            whoever runs the model (`rl_loss` alone reads None as the float32 value); 0 = none; at most
            `MAX_QUERY_KL_TOLERANCE` (1 nat: a wider band takes real drift for noise, and 1e9 would switch the loss
            off), refused above it. The logged Query-KL values are the raw ones.
        kl_clamp_mode: how Query-KL and Policy-KL are bounded (`kl_penalty`, `sequence_k3`): `value` clamps the k3
            value at `kl_clamp` (the released code), `log_ratio` clamps the log-ratio at ±`kl_clamp`, `none` is
            plain k3.
        kl_clamp: the bound of `kl_clamp_mode` (> 0 unless the mode is `none`).
        policy_kl_coef: β, the weight of Policy-KL to the frozen reference model (0 = off; > 0 loads that model).
        policy_kl_kind: the per-token estimator of Policy-KL, `k1` | `k2` | `k3`, aggregated like the PG loss.
        rollout_correction: importance weights for the rollout engine–trainer mismatch, on the ratio ρ = π_old / μ
            of the sampled tokens (π_old: the trainer's log-probs before any update on the batch; μ: the engine's,
            `RolloutBatch.sampling_logprobs`): `tis` multiplies each response token's policy-gradient term by
            min(max(ρ, floor), cap) (truncated IS), `mis` by ρ inside [floor, cap] and 0 outside it (masked IS),
            `none` by 1 (off; the gap is still logged as `logprob_abs_diff`). The weights carry no gradient and
            touch only the policy-gradient terms: Query-KL and Policy-KL are unchanged, and a zeroed token still
            counts in the aggregation's denominator (`objectives.rollout_correction_weights`, docs/erpo.md).
        rollout_correction_level: `token`: ρ of each token; `sequence`: one ρ per response, the product of its
            tokens' ratios (exp of the summed log-prob gap), on all its tokens, so `mis` drops whole responses.
        rollout_correction_cap: the band's upper end C >= 1 for `rollout_correction` (inf: no upper end): an upper
            bound on ρ, which is 1 where engine and trainer agree, so a cap below 1 is refused. verl's
            `rollout_is_threshold` (default 2) is this bound, TRL's default is 3; sequence ratios spread wider than
            token ones.
        rollout_correction_floor: the band's lower end, 0 <= floor <= 1 and below the cap (`mis` drops tokens whose
            ρ is below it, `tis` raises their weight to it), or None: no lower end (TRL's default; 1/cap gives a band
            symmetric in log ρ, verl's `rollout_rs_threshold_lower` when unset).
        ratio_level: where the importance ratio π / π_old of the surrogate lives (`objectives.importance_log_ratio`):
            `token` (each token's own, PPO / GRPO) or `sequence` (GSPO: one per response, s = exp(mean over its tokens
            of log π − log π_old), on all its tokens, clipped to [1 − sequence_clip_low, 1 + sequence_clip_high]).
            On-policy s = 1 and the gradient is the token-level one of the same aggregation; they differ once ratios
            move (num_iterations > 1, update_batch_size below the batch, an engine–trainer mismatch).
        sequence_clip_low: GSPO's clip ε_low of the sequence ratio (`ratio_level: sequence`; 3e-4 in the GSPO paper:
            a mean log-ratio moves far less than a token's).
        sequence_clip_high: GSPO's clip ε_high of the sequence ratio (4e-4 in the GSPO paper); None =
            sequence_clip_low.
        policy_loss: the surrogate: `ppo_clip` (-min(r·A, clip(r)·A), `objectives.policy_gradient_loss`) or `cispo`
            (MiniMax-M1's -sg(min(r, cispo_weight_cap))·A·log π: a truncated stop-gradient weight on the REINFORCE
            term, so no token's gradient is dropped; `objectives.cispo_loss`). The clip fields apply to `ppo_clip`
            only; `cispo` refuses `dual_clip`. Its loss value is -w·A·log π, not -r·A.
        cispo_weight_cap: CISPO's ε_max >= 1, the upper bound on its importance weight (an absolute ratio, TRL's
            `epsilon_high` under `loss_type='cispo'`, 5.0 as TRL recommends for ScaleRL); >= 1 so that an on-policy
            weight stays 1.
        entropy_coef: c >= 0 of the entropy bonus: the loss gets -c·H̄, H̄ the mean per-token entropy (nats, at the
            sampling temperature) of the policy over the response tokens the loss trains on (the high-entropy ones
            under `entropy_top_fraction` < 1), whatever the aggregation (as TRL's `entropy_coef`); 0 = off. Its
            gradient is -c∇H̄: the forward then scores the entropy with gradient (one more logits buffer in
            backward). With `entropy_target`, the initial coefficient of the adaptive control.
        entropy_target: adaptive entropy control (Skywork-OR1, TRL's `use_adaptive_entropy` with its
            `entropy_target`): after each optimizer step the coefficient moves by `entropy_coef_delta`, up when that
            step's H̄ is at or below this target (nats per token), down otherwise, within `entropy_coef_range`, and a
            step applies it only while the last step's H̄ was at or below the target (`objectives.EntropyControl`);
            None = a constant `entropy_coef`.
        entropy_coef_delta: the adaptive control's step δ >= 0 of the coefficient per optimizer step.
        entropy_coef_range: [c_min, c_max] of the adaptive coefficient, 0 <= c_min <= c_max.
        entropy_top_fraction: ρ in [0, 1] of the high-entropy token mask ("Beyond the 80/20 rule", TRL's
            `top_entropy_quantile`): only response tokens whose entropy is at least the (1 − ρ)-quantile of the
            micro-batch's keep their policy-gradient term (0.2 in the paper; 1 = every token, off); the others
            still count in the aggregation's denominator. The quantile is over each micro-batch on its rank (TRL:
            over each micro-batch on all ranks), so micro-batching can move the threshold. verl's Clip-Cov and
            KL-Cov (tokens chosen by the covariance of log π and A) are not implemented.
    """

    loss_aggregation: AggregationMode = "token_mean"
    clip_low: float = 0.2
    clip_high: float | None = None
    dual_clip: float | None = None
    query_kl_coef: float = 0.01
    query_kl_estimator: QueryKLEstimator = "sequence_k3"
    query_kl_aggregation: QueryKLAggregation = "per_query"
    query_kl_tolerance: float | None = None
    kl_clamp_mode: KLClampMode = "value"
    kl_clamp: float = DEFAULT_KL_CLAMP
    policy_kl_coef: float = 0.0
    policy_kl_kind: KLKind = "k3"
    rollout_correction: RolloutCorrection = "none"
    rollout_correction_level: RolloutCorrectionLevel = "token"
    rollout_correction_cap: float = DEFAULT_ROLLOUT_CORRECTION_CAP
    rollout_correction_floor: float | None = None
    ratio_level: RatioLevel = "token"
    sequence_clip_low: float = 3e-4
    sequence_clip_high: float | None = 4e-4
    policy_loss: PolicyLoss = "ppo_clip"
    cispo_weight_cap: float = 5.0
    entropy_coef: float = 0.0
    entropy_target: float | None = None
    entropy_coef_delta: float = 0.005
    entropy_coef_range: tuple[float, float] = (0.0, 1.0)
    entropy_top_fraction: float = 1.0

    def _check_loss_menu(self) -> None:
        """ValueError naming the first of the surrogate and entropy fields (`ratio_level` to `entropy_top_fraction`)
        out of its range; `entropy_coef_range` becomes a tuple of floats. Choices are checked with every `Literal`."""
        if not self.sequence_clip_low >= 0 or not (self.sequence_clip_high is None or self.sequence_clip_high >= 0):
            raise ValueError(
                f"model.sequence_clip_low / sequence_clip_high must be >= 0, got {self.sequence_clip_low} / "
                f"{self.sequence_clip_high}"
            )
        if not self.cispo_weight_cap >= 1:
            raise ValueError(
                f"model.cispo_weight_cap must be >= 1 (an absolute bound on CISPO's importance weight, so that an "
                f"on-policy weight stays 1; TRL recommends 5.0), got {self.cispo_weight_cap}"
            )
        if self.policy_loss == "cispo" and self.dual_clip is not None:
            raise ValueError(
                "model.dual_clip bounds PPO's clipped loss; model.policy_loss 'cispo' has no clip to bound: leave "
                "dual_clip null"
            )
        if not (self.entropy_coef >= 0 and self.entropy_coef_delta >= 0 and math.isfinite(self.entropy_coef)):
            raise ValueError(
                f"model.entropy_coef and entropy_coef_delta must be finite and >= 0, got {self.entropy_coef} / "
                f"{self.entropy_coef_delta}"
            )
        if self.entropy_target is not None and not self.entropy_target >= 0:
            raise ValueError(f"model.entropy_target must be >= 0 nats (or null: no adaptive control), got "
                             f"{self.entropy_target}")  # fmt: skip
        bounds = self.entropy_coef_range
        if len(bounds) != 2 or not 0 <= bounds[0] <= bounds[1]:
            raise ValueError(f"model.entropy_coef_range must be [c_min, c_max] with 0 <= c_min <= c_max, got {bounds}")
        object.__setattr__(self, "entropy_coef_range", (float(bounds[0]), float(bounds[1])))
        if not 0 <= self.entropy_top_fraction <= 1:
            raise ValueError(
                f"model.entropy_top_fraction must be in [0, 1] (the share of tokens, by entropy, that keep their "
                f"policy-gradient term; 1 = all), got {self.entropy_top_fraction}"
            )

    @property
    def entropy_gradient(self) -> bool:
        """Whether the loss needs the entropy with its gradient: an entropy bonus applied now (`entropy_coef` > 0)."""
        return self.entropy_coef > 0

    @property
    def reads_entropy(self) -> bool:
        """Whether `rl_loss` needs the per-token entropy at all: a bonus, an adaptive target or the entropy mask."""
        return self.entropy_gradient or self.entropy_target is not None or self.entropy_top_fraction < 1


def loss_normalizers(
    response_mask: torch.Tensor, query_mask: torch.Tensor, is_leader: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The local counts `rl_loss` divides by; sum them over micro-batches and ranks for the global ones.

    `tokens`: response tokens; `sequences`: rows with at least one response token; `queries`: group leaders (one
    row per query); `query_tokens`: scored prompt tokens over all rows.
    """
    return {
        "tokens": response_mask.sum().float(),
        "sequences": response_mask.bool().any(-1).sum().float(),
        "queries": is_leader.sum().float(),
        "query_tokens": query_mask.sum().float(),
    }


def rl_loss(
    settings: LossSettings,
    response_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    query_logprobs: torch.Tensor | None,
    ref_query_logprobs: torch.Tensor | None,
    query_mask: torch.Tensor,
    is_leader: torch.Tensor,
    seq_weights: torch.Tensor | None = None,
    constant: float | None = None,
    normalizers: dict[str, torch.Tensor] | None = None,
    ref_response_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The whole loss of [prompt; response] rows: weighted PG + α · Query-KL (+ β · Policy-KL) (− c · H̄).

    With `query_logprobs` None the Query-KL term is left out, for a caller that scores the queries in a forward of
    their own (`query_kl_loss` on it), and no query drift is reported.

    Args:
        response_logprobs, old_logprobs, response_mask: [N, R] (see `policy_gradient_loss`); advantages: [N].
        query_logprobs, ref_query_logprobs, query_mask: [N, P] for every row (G rows share a prompt).
        is_leader: [N] bool, one True per query (its first row).
        seq_weights: [N] w(q) of each row's query, or None.
        constant: Dr. GRPO's normaliser for `seq_sum_constant`.
        normalizers: global counts as `loss_normalizers` names them; None = this batch's own.
        ref_response_logprobs: [N, R] reference-model log-probs of the responses for Policy-KL, or None.
        sampling_logprobs: [N, R] the rollout engine's log-probs of the sampled tokens; with `rollout_correction`
            on, each per-token PG term is multiplied by its weight against `old_logprobs` (π_old), and a missing
            one is refused (ValueError). Unused when the correction is off.
        entropy: [N, R] the policy's per-token entropy (nats) on the responses, with its gradient when
            `entropy_coef` > 0 (the coefficient applied now: a runner of `EntropyControl` passes its `applied` one);
            needed when `settings.reads_entropy` (ValueError otherwise), unused else.
    Returns:
        loss (scalar) and its `LossStats` (the queries' drift over the Q group leaders).
    """
    s = settings
    if normalizers is None:
        normalizers = loss_normalizers(response_mask, query_mask, is_leader)
    token_mode = s.loss_aggregation == "token_mean"
    if s.policy_loss == "cispo":
        per_token, stats = cispo_loss(
            response_logprobs, old_logprobs, advantages, response_mask, s.cispo_weight_cap, s.ratio_level
        )
    else:
        low, high = (
            (s.clip_low, s.clip_high) if s.ratio_level == "token" else (s.sequence_clip_low, s.sequence_clip_high)
        )
        per_token, stats = policy_gradient_loss(
            response_logprobs, old_logprobs, advantages, response_mask, low, high, s.dual_clip, s.ratio_level
        )
    kept = response_mask.bool()
    if s.reads_entropy:
        if entropy is None:
            raise ValueError("the entropy bonus, its target and the entropy mask need the policy's per-token entropy")
        if s.entropy_top_fraction < 1:
            kept = high_entropy_mask(entropy, response_mask, s.entropy_top_fraction)
            per_token = per_token * kept.to(per_token.dtype)
            stats["entropy_kept_frac"] = (kept.sum() / response_mask.bool().sum().clamp(min=1)).float()
    is_ratio = is_outside = None
    if s.rollout_correction != "none":
        if sampling_logprobs is None:
            raise ValueError(f"rollout_correction {s.rollout_correction!r} needs the engine's sampling log-probs")
        weights, is_ratio, is_outside = rollout_correction_weights(
            old_logprobs, sampling_logprobs, response_mask, s.rollout_correction, s.rollout_correction_level,
            s.rollout_correction_cap, s.rollout_correction_floor,
        )  # fmt: skip
        per_token = per_token * weights.to(per_token.dtype)
    sequences = normalizers["sequences"]
    pg_loss = aggregate(
        per_token,
        response_mask,
        s.loss_aggregation,
        seq_weights,
        constant,
        normalizers["tokens"] if token_mode else sequences,
    )
    loss, drift, policy_kl_tokens = pg_loss, None, None
    if s.entropy_gradient or s.entropy_target is not None:
        if s.entropy_gradient and response_logprobs.requires_grad and not entropy.requires_grad:
            raise ValueError("entropy_coef > 0 needs the entropy with its gradient (objectives.token_entropy)")
        bonus = entropy_bonus_term(entropy, kept, response_mask, normalizers["tokens"])
        if s.entropy_gradient:
            loss = loss - s.entropy_coef * bonus
        with torch.no_grad():
            kept_mean = torch.where(kept, entropy, 0.0).sum() / kept.sum().clamp(min=1)
            stats["entropy_coef"] = kept_mean.new_tensor(float(s.entropy_coef))
            stats["bonus_entropy"] = kept_mean.detach().float()
            stats["entropy_bonus"] = (s.entropy_coef * kept_mean).detach().float()
            if s.entropy_target is not None:
                stats["entropy_target"] = kept_mean.new_tensor(float(s.entropy_target))
    if query_logprobs is not None:
        leaders = (query_logprobs[is_leader], ref_query_logprobs[is_leader], query_mask[is_leader])
        if s.query_kl_aggregation == "per_query":
            query_kl_term = query_kl_loss(s, *leaders, normalizers, constant)
        else:  # like the PG loss: every row's prompt tokens, one row each
            query_kl_term = query_kl_loss(s, query_logprobs, ref_query_logprobs, query_mask, normalizers, constant)
        loss = loss + s.query_kl_coef * query_kl_term
        drift = query_kl_parts(s, *leaders)
    if ref_response_logprobs is not None:
        real = response_mask.bool()
        current = torch.where(real, response_logprobs, ref_response_logprobs)  # δ = 0 on padding: no inf there
        per_token_kl = kl_penalty(current, ref_response_logprobs, s.policy_kl_kind, s.kl_clamp_mode, s.kl_clamp)
        if s.policy_kl_coef:
            normalizer = normalizers["tokens"] if token_mode else sequences
            policy_kl = aggregate(per_token_kl, response_mask, s.loss_aggregation, None, constant, normalizer)
            loss = loss + s.policy_kl_coef * policy_kl
        policy_kl_tokens = torch.where(real, per_token_kl.detach(), 0.0)
    return loss, LossStats(
        pg_loss.detach(), stats, drift, policy_kl_tokens, rollout_is_ratio=is_ratio, rollout_is_outside=is_outside
    )


def query_kl_loss(
    settings: LossSettings,
    query_logprobs: torch.Tensor,
    ref_query_logprobs: torch.Tensor,
    query_mask: torch.Tensor,
    normalizers: dict[str, torch.Tensor],
    constant: float | None = None,
    rows_per_query: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Query-KL term of the loss (before α), divided by the step's global counts.

    Args:
        query_logprobs, ref_query_logprobs, query_mask: [Q, L] per-token log-probs of the queries now and under θ0,
            and 1 on their scored tokens. One row per unique query for `per_query`; for `like_pg`, one row per
            [prompt; response] row, or one per query with `rows_per_query`.
        normalizers: global counts as `loss_normalizers` names them (`queries`; `query_tokens` or `sequences`).
        constant: Dr. GRPO's normaliser, when the PG loss uses `seq_sum_constant`.
        rows_per_query: [Q] for `like_pg` over unique queries: how many rows of the step share each query (the
            query's group size), so that each query counts as often as the PG loss sees its prompt.
    """
    s = settings
    tolerance = query_kl_tolerance_for(torch.float32) if s.query_kl_tolerance is None else s.query_kl_tolerance
    if s.query_kl_aggregation == "per_query":
        per_query = per_query_kl(
            query_logprobs, ref_query_logprobs, query_mask, s.query_kl_estimator, s.kl_clamp_mode, s.kl_clamp,
            tolerance,
        )  # fmt: skip
        return per_query.sum() / normalizers["queries"]
    if s.query_kl_estimator != "token_k3":
        raise ValueError("query_kl_aggregation 'like_pg' aggregates per-token values: it needs estimator token_k3")
    tokens = query_kl_tokens(query_logprobs, ref_query_logprobs, query_mask, s.kl_clamp_mode, s.kl_clamp, tolerance)
    if rows_per_query is not None:
        tokens = tokens * rows_per_query.to(tokens.dtype).unsqueeze(-1)
    token_mode = s.loss_aggregation == "token_mean"
    normalizer = normalizers["query_tokens"] if token_mode else normalizers["sequences"]
    return aggregate(tokens, query_mask, s.loss_aggregation, None, constant, normalizer)


@torch.no_grad()
def query_kl_parts(
    settings: LossSettings, query_logprobs: torch.Tensor, ref_query_logprobs: torch.Tensor, query_mask: torch.Tensor
) -> QueryDrift:
    """The drift of a step's unique queries from their [Q, L] log-probs now and under θ0 and their scored tokens."""
    s, leaders = settings, (query_logprobs, ref_query_logprobs, query_mask)
    return QueryDrift(
        query_kl=per_query_kl(*leaders, s.query_kl_estimator, s.kl_clamp_mode, s.kl_clamp),
        query_kl_token_k3=per_query_kl(*leaders, "token_k3", "value", DEFAULT_KL_CLAMP),
        query_loglik_change=torch.where(
            query_mask.bool(), query_logprobs - ref_query_logprobs.to(query_logprobs), 0.0
        ).sum(-1),
    )
