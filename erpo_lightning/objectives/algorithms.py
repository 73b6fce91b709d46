"""Algorithm presets: ERPO as the paper writes it, ERPO as its authors released it, and the baselines, as plain data.

An algorithm here is the loss side (advantage estimator, surrogate, aggregation, regularisers, query weights) plus
the optimizer defaults a preset fixes. Rollout-side choices of DAPO (dynamic sampling, overlong shaping) are settings
of the rollout callback: see `configs/`. docs/erpo.md compares `erpo` and `erpo_released` field by field, with sources.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch

from erpo_lightning.objectives import (
    DEFAULT_ADVANTAGE_EPS,
    DEFAULT_KL_CLAMP,
    DEFAULT_QUERY_WEIGHT_CLIP,
    MAX_QUERY_KL_TOLERANCE,
    Estimator,
    LossSettings,
    QueryWeightNorm,
    QueryWeightSource,
    query_weights,
)

AlgorithmName = Literal[
    "erpo",
    "erpo_released",
    "grpo",
    "grpo_kl",
    "dapo",
    "dapo_erpo",
    "rloo",
    "rloo_erpo",
    "dr_grpo",
    "reinforce",
    "gspo",
    "gspo_erpo",
    "cispo",
    "cispo_erpo",
]
# `model.query_weight_clip: none` turns the clip off (null keeps the preset's, like every other override).
NO_CLIP = "none"


@dataclass(frozen=True)
class Algorithm(LossSettings):
    """Every loss-side knob (see `objectives.LossSettings` for the inherited ones), with the paper's ERPO defaults.

    Each field has one entry below, `name: description` (read by `loss_setting_docs`).

    Attributes:
        advantage_estimator: `grpo` (r - group mean) / (group std + eps), `dr_grpo` (r - group mean), `rloo`
            (r - mean of the group's other rewards) or `reinforce` (r - batch mean) (`objectives.group_advantages`).
        advantage_eps: eps of the `grpo` estimator's (r - mean) / (std + eps).
        use_query_weights: multiply each query's policy-gradient terms by w(q) = clip(s̄ / s(q)) (w(q) is logged
            either way when it needs no extra forward).
        query_weight_source: s(q) is the summed prompt NLL of the frozen reference (`reference`, from the cache;
            the paper) or of the current policy, one no-grad forward before each optimizer step (`current`, the
            released code).
        query_weight_norm: s̄ is the mean over the whole training set (`dataset`, the paper; needs `reference`) or
            over the optimizer step's queries on all ranks (`batch`, the released code).
        query_weight_clip: [lo, hi] clip of w(q), or None: unclipped (the released code; write `none` in a config,
            where null keeps the preset's value).
        weight_decay: AdamW weight decay of the default optimizer; with `model.optimizer` set, its `init_args` own
            the decay and this is not applied (`modules/optim.py`).
    """

    advantage_estimator: Estimator = "grpo"
    advantage_eps: float = DEFAULT_ADVANTAGE_EPS
    use_query_weights: bool = True
    query_weight_source: QueryWeightSource = "reference"
    query_weight_norm: QueryWeightNorm = "dataset"
    query_weight_clip: tuple[float, float] | None = DEFAULT_QUERY_WEIGHT_CLIP
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(Algorithm)
        for field in fields(self):
            value, choices = getattr(self, field.name), typing.get_args(hints[field.name])
            if typing.get_origin(hints[field.name]) is Literal and value not in choices:
                raise ValueError(f"model.{field.name}: {value!r} is not one of {', '.join(map(str, choices))}")
        if not self.clip_low >= 0 or (self.clip_high is not None and not self.clip_high >= 0):  # NaN too
            raise ValueError(f"model.clip_low / clip_high must be >= 0, got {self.clip_low} / {self.clip_high}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"model.dual_clip must be > 1 (a multiple of -A), got {self.dual_clip}")
        if self.kl_clamp_mode != "none" and not self.kl_clamp > 0:
            raise ValueError(
                f"model.kl_clamp must be > 0 with kl_clamp_mode {self.kl_clamp_mode!r}, got {self.kl_clamp}"
            )
        if self.query_kl_aggregation == "like_pg" and self.query_kl_estimator != "token_k3":
            raise ValueError(
                "model.query_kl_aggregation 'like_pg' aggregates per-token values like the PG loss: it needs "
                f"model.query_kl_estimator 'token_k3', got {self.query_kl_estimator!r}"
            )
        if not all(value >= 0 for value in (self.query_kl_coef, self.policy_kl_coef, self.weight_decay)):
            raise ValueError("model.query_kl_coef, policy_kl_coef and weight_decay must be >= 0")
        self._check_query_kl_tolerance()
        self._check_rollout_correction()
        self._check_loss_menu()
        if not self.advantage_eps >= 0:
            raise ValueError(f"model.advantage_eps must be >= 0, got {self.advantage_eps}")
        if self.query_weight_source == "current" and self.query_weight_norm == "dataset":
            raise ValueError(
                "model.query_weight_source 'current' with query_weight_norm 'dataset' would divide the current "
                "policy's NLL by the reference's training-set mean, a mix neither the paper nor the released code "
                "uses: set model.query_weight_norm 'batch' (the released code) or query_weight_source 'reference'"
            )
        clip = self.query_weight_clip
        if clip is not None:
            if len(clip) != 2 or not 0 <= clip[0] <= clip[1]:
                raise ValueError(f"model.query_weight_clip must be [lo, hi] with 0 <= lo <= hi, or none, got {clip}")
            object.__setattr__(self, "query_weight_clip", (float(clip[0]), float(clip[1])))

    def _check_query_kl_tolerance(self) -> None:
        """ValueError unless `query_kl_tolerance` is null or in [0, MAX_QUERY_KL_TOLERANCE] nats per query token:
        beyond the bound the band swallows real drift, and a huge one switches the Query-KL loss off."""
        tolerance = self.query_kl_tolerance
        if tolerance is None or 0 <= tolerance <= MAX_QUERY_KL_TOLERANCE:
            return
        if not tolerance > MAX_QUERY_KL_TOLERANCE:  # negative or NaN
            raise ValueError(f"model.query_kl_tolerance must be >= 0 nats (or null), got {tolerance}")
        raise ValueError(
            f"model.query_kl_tolerance must be at most {MAX_QUERY_KL_TOLERANCE:g} nat per query token, got "
            f"{tolerance:g}: the band is for rounding noise (at most 0.62 nats, bfloat16), and one this wide takes "
            "real drift for noise (1e9 would switch the Query-KL loss off); leave it null for the compute dtype's "
            "default, or set model.query_kl_coef 0 to train without Query-KL"
        )

    def _check_rollout_correction(self) -> None:
        """ValueError unless the band [rollout_correction_floor, rollout_correction_cap] holds ρ = 1, the ratio of a
        token on which engine and trainer agree: cap >= 1 (inf allowed), floor null or 0 <= floor <= 1, below cap.

        A band without 1 would clip (`tis`) or zero (`mis`) every token of a run whose engine matches its trainer,
        leaving a `mis` run to train on Query-KL alone. verl writes the same upper bound as `rollout_is_threshold`
        (and `rollout_rs_threshold`) and derives its lower one (`rollout_rs_threshold_lower`) as 1/threshold.
        """
        cap, floor = self.rollout_correction_cap, self.rollout_correction_floor
        if not cap >= 1:  # NaN too
            raise ValueError(
                f"model.rollout_correction_cap must be >= 1 (.inf: no upper end), got {cap:g}: it is the upper bound "
                "on the engine/trainer probability ratio ρ = π_old / μ of each sampled token, which is 1 where the two "
                "agree, so a cap below 1 would clip (tis) or mask (mis) every token; verl's rollout_is_threshold is "
                "this upper bound (2 in both), and verl's lower bound (rollout_rs_threshold_lower, 1/threshold when "
                "unset) is model.rollout_correction_floor (null here: no lower end)"
            )
        if floor is not None and not (0 <= floor <= 1 and floor < cap):
            raise ValueError(
                f"model.rollout_correction_floor must be >= 0 and below rollout_correction_cap ({cap:g}), at most 1 "
                f"(ρ = 1, engine and trainer agreeing, must lie in the band), or null, got {floor}"
            )

    @property
    def static_query_weights(self) -> bool:
        """Whether w(q) is a constant of each query (s(q) from the frozen reference, s̄ the training-set mean: the
        paper's rule), made once from the reference cache (`query_weight_table`) and carried by the query stream;
        otherwise the trainer makes it per optimizer step."""
        return self.query_weight_source == "reference" and self.query_weight_norm == "dataset"

    def query_weight_table(
        self, reference_nll: torch.Tensor, training_nll: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """[Q] w(q) of every query under a dataset-static rule (`static_query_weights`), else None.

        Args:
            reference_nll: [Q] s(q), the frozen reference's summed NLL of each query (nats; the cache's `nll`).
            training_nll: the s(q) that s̄ averages, those of the training queries (None = all of `reference_nll`).
        Returns:
            `objectives.query_weights(reference_nll, mean(training_nll), query_weight_clip)`, or None when w(q)
            depends on the optimizer step (the current policy's s(q), or s̄ over the step's queries).
        """
        if not self.static_query_weights:
            return None
        mean_nll = (reference_nll if training_nll is None else training_nll).mean()
        return query_weights(reference_nll, mean_nll, self.query_weight_clip)


# The paper (arXiv 2608.23311): GRPO + Query-KL on summed query log-likelihoods (sequence k3) with α = 0.01, and
# dataset-static weights from the frozen reference clipped to [0, 2], token-level aggregation.
_ERPO = Algorithm()
# The authors' release (AlibabaResearch/ERPO, examples/erpo/erpo_base_qwen25_7b.yaml + actor_worker.py on ROLL).
_ERPO_RELEASED = Algorithm(
    loss_aggregation="seq_mean_token_mean",
    dual_clip=1.0 + 2 * 0.2,  # ROLL: 1 + 2 * pg_clip, pg_clip = 0.2
    query_kl_estimator="token_k3",
    query_kl_aggregation="like_pg",
    kl_clamp_mode="value",
    kl_clamp=DEFAULT_KL_CLAMP,
    query_weight_source="current",
    query_weight_norm="batch",
    query_weight_clip=None,
    weight_decay=0.01,
)
_NO_REGULARISER = replace(_ERPO, query_kl_coef=0.0, use_query_weights=False)

ALGORITHMS: dict[str, Algorithm] = {
    "erpo": _ERPO,
    "erpo_released": _ERPO_RELEASED,
    "grpo": _NO_REGULARISER,
    # β = 0.001 with the low-variance k3 estimator, the common GRPO-with-KL setting (verl's default kl_loss_coef).
    "grpo_kl": replace(_NO_REGULARISER, policy_kl_coef=0.001),
    "dapo": replace(_NO_REGULARISER, clip_high=0.28),
    "dapo_erpo": replace(_ERPO, clip_high=0.28),  # extends `erpo` (the paper's form)
    "rloo": replace(_NO_REGULARISER, advantage_estimator="rloo"),
    "rloo_erpo": replace(_ERPO, advantage_estimator="rloo"),  # extends `erpo` (the paper's form)
    "dr_grpo": replace(_NO_REGULARISER, advantage_estimator="dr_grpo", loss_aggregation="seq_sum_constant"),
    "reinforce": replace(_NO_REGULARISER, advantage_estimator="reinforce"),
    # GSPO (arXiv 2507.18071): the length-normalised sequence ratio, clipped at 3e-4 / 4e-4, averaged per response.
    "gspo": replace(_NO_REGULARISER, ratio_level="sequence", loss_aggregation="seq_mean_token_mean"),
    "gspo_erpo": replace(_ERPO, ratio_level="sequence", loss_aggregation="seq_mean_token_mean"),  # extends `erpo`
    # CISPO (MiniMax-M1, arXiv 2506.13585): the truncated stop-gradient weight on -A·log π, a token mean.
    "cispo": replace(_NO_REGULARISER, policy_loss="cispo"),
    "cispo_erpo": replace(_ERPO, policy_loss="cispo"),  # extends `erpo` (the paper's form)
}
assert set(ALGORITHMS) == set(typing.get_args(AlgorithmName)), "AlgorithmName must list every preset"


def resolve_algorithm(name: str, **overrides: Any) -> Algorithm:
    """The preset `name` with every non-None override applied (e.g. `query_kl_coef=0.05` for an ablation);
    `query_weight_clip=NO_CLIP` ("none") sets that field to None."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown model.algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)}")
    known = {f.name for f in fields(Algorithm)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown algorithm fields {sorted(unknown)}; known: {sorted(known)}")
    changes = {key: value for key, value in overrides.items() if value is not None}
    if changes.get("query_weight_clip") == NO_CLIP:
        changes["query_weight_clip"] = None
    return replace(ALGORITHMS[name], **changes)


# ----------------------------------------------------------------------------- the fields' documentation, written once
REFERENCE_COMMAND = "python -m erpo_lightning.objectives.algorithms > docs/loss_settings.md"
_ENTRY = re.compile(r"^    (\w+): (.*)$")  # an `Attributes:` / `Args:` entry of a docstring after `inspect.cleandoc`


def attribute_docs(cls: type, section: Literal["Attributes", "Args"] = "Attributes") -> list[tuple[str, str]]:
    """(name, description) of each entry of the `section` section of `cls`'s own docstring (Google style: a dataclass's
    fields are its `Attributes:`, a constructor's parameters its `Args:`), in order, with the description's lines
    joined by single spaces. The section ends at its first line that is neither an entry nor an entry's
    continuation (a blank line, or `a, b:` naming two parameters at once, which no reader splits)."""
    lines = inspect.cleandoc(cls.__doc__ or "").partition(f"{section}:\n")[2].splitlines()
    entries: list[tuple[str, str]] = []
    for line in lines:
        entry = _ENTRY.match(line)
        if entry:
            entries.append((entry[1], entry[2]))
        elif line.startswith("        ") and entries:
            entries[-1] = (entries[-1][0], f"{entries[-1][1]} {line.strip()}")
        else:
            break
    return entries


def loss_setting_docs() -> dict[str, str]:
    """{field: description} of every field of `Algorithm` that its docstring or `LossSettings`'s documents, in field
    order: the one text behind the module's CLI help and docs/loss_settings.md."""
    documented = dict(attribute_docs(LossSettings) + attribute_docs(Algorithm))
    return {f.name: documented[f.name] for f in fields(Algorithm) if f.name in documented}


def loss_setting_args_doc(indent: str = "        ") -> str:
    """`Args:` docstring entries (Google style, 120 columns) of a class taking every `Algorithm` field as a keyword
    override whose None keeps the preset's value, such as `ERPOModule`."""
    wrapper = textwrap.TextWrapper(
        width=120, initial_indent=indent, subsequent_indent=indent + "    ", break_long_words=False,
        break_on_hyphens=False,
    )  # fmt: skip
    return "\n".join(
        wrapper.fill(f"{name}: {doc} Unset (null): the preset's value.") for name, doc in loss_setting_docs().items()
    )


def type_text(hint: Any) -> str:
    """`hint` as a config author writes it: choices `a` | `b`, [float, float], [str, ...], null."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(type_text(member) for member in typing.get_args(hint))
    if typing.get_origin(hint) is Literal:
        return " | ".join(f"`{choice}`" for choice in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"[{', '.join(type_text(member) for member in typing.get_args(hint))}]"
    if typing.get_origin(hint) is list:
        return f"[{type_text(typing.get_args(hint)[0])}, ...]"
    return "null" if hint is type(None) else f"`{hint.__name__}`"


def value_text(value: Any) -> str:
    """`value` as a config author writes it, in backticks: a string as is, else JSON (null, true, 1e-06, [0.5, 2.0])."""
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def loss_settings_markdown() -> str:
    """docs/loss_settings.md: every `Algorithm` field with its type, its value in `erpo` and in the presets that set
    it otherwise, and its docstring description (write it with REFERENCE_COMMAND)."""
    hints = typing.get_type_hints(Algorithm)
    out = [
        "# Loss settings",
        "",
        "<!-- Generated from the docstrings of `objectives.LossSettings` and `algorithms.Algorithm`; regenerate with",
        f"     {REFERENCE_COMMAND}",
        "     (tests/objectives/test_algorithms.py fails when this file differs). Edit the docstrings, not this",
        "     file. -->",
        "",
        "Every field is a setting of the `model:` group (`--model.<field>`; a keyword argument of `ERPOModule` and",
        "of the TRL `ERPOTrainer`). `model.algorithm` picks a preset (`algorithms.ALGORITHMS`); a field left unset",
        "(null) keeps the preset's value. Each entry gives the field's type, its value in `erpo` (the paper's form)",
        "and in the presets that set it otherwise; None in a description is null in a config.",
    ]
    for name, doc in loss_setting_docs().items():
        default = getattr(ALGORITHMS["erpo"], name)
        others: dict[str, list[str]] = {}
        for preset, algorithm in ALGORITHMS.items():
            if getattr(algorithm, name) != default:
                others.setdefault(value_text(getattr(algorithm, name)), []).append(f"`{preset}`")
        values = "; ".join(f"{', '.join(presets)}: {value}" for value, presets in others.items())
        out += [
            "",
            f"## `{name}`",
            "",
            f"{type_text(hints[name])}. `erpo`: {value_text(default)}" + (f"; {values}." if values else "."),
            "",
            *textwrap.wrap(doc, 120, break_long_words=False, break_on_hyphens=False),
        ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(loss_settings_markdown())
