"""The shared prompt (`query_kl_scoring: shared_prompt`): each of a step's queries is forwarded once, in the
reference cache's layout, and that one forward both scores it for Query-KL and carries its G responses.

The exact pass (`query_pass.exact_query_kl`) already forwards every unique query alone, in the blocks the cache was
built in, so its Query-KL is exactly 0 at θ0. Here that forward also keeps each query's keys and values and the
logits at its last token, and every micro-batch's responses run on top of them (`PromptPass.forward`): a response
row forwards R tokens instead of P + R. A step then costs Q·W prompt tokens plus N·R response tokens, against the
plain step's N·(P + R) plus the exact pass's Q·W.

The responses' gradient reaches the prompt forward in one backward at the end of the step: each micro-batch's
backward stops at detached copies of the keys, values and last logits (leaves, whose gradients accumulate), and
`PromptPass.closing_loss` sends what they gathered, with the Query-KL term, through the prompt forward once. The
loss and gradients equal the plain forward's up to float rounding (tests/update/test_shared_prompt.py).

Gradient checkpointing (`model.gradient_checkpointing`) keeps working, for both forwards. Hugging Face's
checkpointed layers would drop `past_key_values` (they cannot know whether a recomputation in backward writes the
cache twice), and a `DynamicCache`'s `update` appends in place, so a layer recomputed in backward would see its
keys twice. Both forwards therefore run on a `PrefixCache`, whose `update` returns prefix ⊕ new states from a
throwaway copy of the layer and never changes what it holds: a recomputation sees exactly what the first forward
saw, so each layer may be told it only reads the cache (`_can_checkpoint_with_cache`, set for the forward's
duration). The prompt forward's cache holds no prefix: it records the keys and values each layer's first call
returned, the tensors the responses read, and backward from them recomputes their layer like any checkpointed
activation (non-reentrant checkpointing, which `ERPOModule` uses; reentrant checkpointing runs its forward without
a graph, so it is refused here). The prompt forward thus stays checkpointed too: what it keeps until the step's
last backward is the keys, values and logits the responses read, not every layer's activations. A cache a model
did not read raises (`PrefixCache.check_read`), so no transformers version can drop it silently. Under checkpointing
the loss and gradients equal the exact step's within rounding (tests/update/test_shared_prompt_checkpointing.py).

Under DDP and FSDP2 (gloo, 2 processes) a run equals one process's (tests/end_to_end/test_distributed.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

try:
    from transformers.modeling_layers import GradientCheckpointingLayer
except ImportError:  # transformers before the per-layer checkpointing class
    GradientCheckpointingLayer = None

from erpo_lightning import objectives as obj
from erpo_lightning.scoring.output_layer import output_layer_bypassed
from erpo_lightning.scoring.queries import QueryScoringLayout, forward_block
from erpo_lightning.update.forward import LossRows, StepInputs, window_logprobs_and_entropy
from erpo_lightning.update.query_pass import exact_query_kl


class PrefixCache(DynamicCache):
    """A key/value cache that a recomputing forward cannot corrupt: `update` returns the held prefix ⊕ the new
    states ([B, H, prefix + T, D]) as `DynamicCache.update` would, from a throwaway copy of the layer, so the cache
    never changes and a layer recomputed in backward sees exactly what its first call saw.

    Args:
        prefix: per layer, the ([B, H, W, D] keys, values) every call is given before its own tokens; None: no
            prefix (the prompt forward, which reads back what its layers computed through `seen`).
        config: the model's config, for its layer types (sliding windows), as `DynamicCache` takes it.
    Attributes:
        seen: layer index -> the (keys, values) that layer's first `update` returned; later calls (the
            recomputations of checkpointed layers) leave it alone.
    """

    def __init__(self, prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None, config: Any = None) -> None:
        super().__init__(ddp_cache_data=prefix, config=config)
        self.seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        while self.layer_class_to_replicate is not None and len(self.layers) <= layer_idx:
            self.layers.append(self.layer_class_to_replicate())
        # A layer's `update` rebinds its tensors and counters rather than writing into them, so updating a shallow
        # copy leaves this cache's layer exactly as it was.
        keys, values = copy.copy(self.layers[layer_idx]).update(key_states, value_states, *args, **kwargs)
        self.seen.setdefault(layer_idx, (keys, values))
        return keys, values

    def check_read(self, layers: int) -> None:
        """RuntimeError unless each of the model's `layers` attention layers read this cache in the forward."""
        if sorted(self.seen) != list(range(layers)):
            raise RuntimeError(
                f"query_kl_scoring 'shared_prompt': the model read its key/value cache in {len(self.seen)} of "
                f"{layers} layers (this transformers version drops it, e.g. under gradient checkpointing); use "
                "query_kl_scoring 'exact'"
            )


def _checkpointed_layers(policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The policy's layers that Hugging Face's gradient checkpointing wraps in a forward now (training mode)."""
    if GradientCheckpointingLayer is None:  # transformers without it: `PrefixCache.check_read` still guards
        return []
    return [
        module
        for module in policy.modules()
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing and module.training
    ]


@contextmanager
def _cache_kept_under_checkpointing(policy: torch.nn.Module) -> Iterator[None]:
    """For one forward on a `PrefixCache`: its checkpointed layers keep `past_key_values` instead of dropping it
    (the cache is read only, so their recomputation in backward is idempotent)."""
    layers = _checkpointed_layers(policy)
    for module in layers:
        # Reentrant checkpointing (torch's default when not named) runs the forward without a graph, so the prompt's
        # keys and values, read from inside the layer, would carry none and the responses' gradient would stop there.
        options = getattr(module._gradient_checkpointing_func, "keywords", None)
        if options is not None and options.get("use_reentrant", True) is not False:
            raise RuntimeError(
                "query_kl_scoring 'shared_prompt' needs non-reentrant gradient checkpointing: enable it with "
                "gradient_checkpointing_kwargs={'use_reentrant': False} (as ERPOModule does), or use "
                "query_kl_scoring 'exact'"
            )
    for module in layers:
        module._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for module in layers:
            del module._can_checkpoint_with_cache  # back to the class's value


class _OnCache:
    """`policy` as `scoring.queries.forward_block` calls it, with every call made on `cache`: the prompt forward
    then runs in the scoring layout's exact shape (`use_cache` off, so no cache of the model's own is made)."""

    def __init__(self, policy: torch.nn.Module, cache: PrefixCache) -> None:
        self.policy, self.cache = policy, cache

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.policy.parameters()

    def __call__(self, **inputs: Any) -> Any:
        with _cache_kept_under_checkpointing(self.policy):
            return self.policy(**{**inputs, "use_cache": False, "past_key_values": self.cache})


@dataclass
class _Block:
    """One scoring block's forward: its queries' lengths (none for a filler block), keys and values per layer
    ([rows, H, W, D] each) and logits [rows, W, V], with their graph."""

    lengths: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor


@dataclass
class PromptPass:
    """A step's unique queries forwarded once each (`prompt_pass`), and what their responses read.

    Attributes:
        term: α · Query-KL of the queries (0-dim, with its graph when α > 0), as `exact_query_kl` returns it.
        drift: the queries' drift from θ0 (`objectives.QueryDrift`).
        row_of: a query's cache row -> its row in `keys`, `values`, `last_logits` and `lengths`.
        lengths: [Q] long, each query's tokens.
        keys, values: per layer, [Q, H, W, D] leaves (detached, requiring grad): each query's keys and values,
            right-padded to the step's widest query W. Micro-batches read these; their gradients accumulate here.
        last_logits: [Q, V] leaf, the logits at each query's last token (they predict its responses' first token).
        graph: the forward's own tensors behind each leaf, in the order (keys..., values..., last_logits), for
            `closing_loss`. They hold the prompt forward's graph, its logits included, until the step's last backward.
        fillers: the logits of filler blocks (a rank with fewer queries runs as many blocks as the others).
        fused_output: the response forward's output layer runs inside the log-prob code (`output_layer.py`).
        entropy_gradient: the entropies carry their gradient (the loss has an entropy bonus).
    """

    term: torch.Tensor
    drift: obj.QueryDrift
    row_of: dict[int, int]
    lengths: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    last_logits: torch.Tensor
    graph: list[torch.Tensor] = field(default_factory=list)
    fillers: list[torch.Tensor] = field(default_factory=list)
    fused_output: bool = False
    entropy_gradient: bool = False

    def forward(self, policy: torch.nn.Module, rows: LossRows) -> tuple[torch.Tensor, torch.Tensor]:
        """The `forward.Forward` of a micro-batch under the shared prompt: its responses on their queries' keys and
        values. Column P (the first response token) is scored from the query's last logits, columns P + 1.. from the
        response forward, all at the rows' temperature; the prompt columns are 0.

        Args:
            rows: the micro-batch (`forward.LossRows`), of queries this pass holds.
        Returns:
            ([N, P + R] log-probs, [N, P + R] entropies, with gradient only under `entropy_gradient`).
        """
        prompt_length, temperature = rows.prompt_length, rows.temperature
        device = rows.input_ids.device
        places = torch.tensor([self.row_of[int(q)] for q in rows.query_index.tolist()], device=device)
        lengths = self.lengths[places]
        width = int(lengths.max())
        cache = PrefixCache(
            [
                (keys.index_select(0, places)[:, :, :width], values.index_select(0, places)[:, :, :width])
                for keys, values in zip(self.keys, self.values, strict=True)
            ],
            config=getattr(policy, "config", None),
        )
        response_ids, response_mask = rows.input_ids[:, prompt_length:], rows.attention_mask[:, prompt_length:]
        prompt_mask = (torch.arange(width, device=device) < lengths[:, None]).to(response_mask.dtype)
        positions = lengths[:, None] + torch.arange(response_ids.shape[1], device=device)
        inputs = {
            "input_ids": response_ids,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "position_ids": positions,
            "past_key_values": cache,
            "use_cache": False,  # the cache is an input here: nothing is appended to it
        }
        with output_layer_bypassed(policy, self.fused_output) as head, _cache_kept_under_checkpointing(policy):
            window = policy(**inputs).logits
        cache.check_read(len(self.keys))
        weight = None if head is None else head.weight
        # Position j of the response forward predicts response token j + 1; column 0 is scored below.
        rest, rest_entropy = window_logprobs_and_entropy(
            window, response_ids, 1, temperature, weight, self.entropy_gradient
        )
        first = self.last_logits.index_select(0, places).float() / temperature
        first_log_p = torch.log_softmax(first, dim=-1)
        first_logprob = first_log_p.gather(-1, response_ids[:, :1])
        first_entropy = -(first_log_p.exp() * first_log_p).sum(-1, keepdim=True)
        if not self.entropy_gradient:
            first_entropy = first_entropy.detach()
        before = (prompt_length, 0)
        return (
            torch.nn.functional.pad(torch.cat([first_logprob, rest[:, 1:]], dim=1), before),
            torch.nn.functional.pad(torch.cat([first_entropy, rest_entropy[:, 1:]], dim=1), before),
        )

    def closing_loss(self, loss_scale: float = 1.0) -> torch.Tensor:
        """The loss whose backward finishes the step's gradient through the prompt forward: `loss_scale` · the
        Query-KL term plus Σ ⟨forward tensor, its leaf's gradient⟩, whose gradient in each forward tensor is
        exactly what the micro-batches' backwards (already scaled) left in its leaf."""
        total = self.term * loss_scale
        for tensor, leaf in zip(self.graph, (*self.keys, *self.values, self.last_logits), strict=True):
            if leaf.grad is not None:
                total = total + (tensor * leaf.grad).sum()
        for logits in self.fillers:  # weight 0: their backward runs the same collectives as a real block's
            total = total + 0.0 * logits.float().sum()
        return total


def _leaf(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().requires_grad_(tensor.requires_grad)


def prompt_pass(
    policy: torch.nn.Module, prompts: list[list[int]], query_index: torch.Tensor, step: StepInputs,
    constant: float | None = None,
) -> PromptPass:  # fmt: skip
    """Forward the step's unique queries once, in the cache's layout (`query_pass.exact_query_kl`, whose arguments
    these are, with no backward), keeping their keys, values and last logits for `PromptPass.forward`, whose
    response forward fuses its output layer with the log-probs if `step.fused_output`."""
    blocks: list[_Block] = []
    with_grad = torch.is_grad_enabled()

    config = getattr(policy, "config", None)

    def score(model: torch.nn.Module, queries: list[list[int]], layout: QueryScoringLayout) -> list[torch.Tensor]:
        cache = PrefixCache(config=config)
        with torch.set_grad_enabled(with_grad):  # the responses need the prompt's graph even when α = 0
            output, scores = forward_block(_OnCache(model, cache), queries, layout, keep_cache=True)
        layers = len(cache.seen) if config is None else len(cache.layers)
        cache.check_read(max(layers, 1))
        seen = [cache.seen[layer] for layer in range(layers)]
        lengths = [len(ids) for ids in queries]
        blocks.append(_Block(lengths, [keys for keys, _ in seen], [values for _, values in seen], output.logits))
        return scores

    term, drift = exact_query_kl(policy, prompts, query_index, step, None, constant, score=score)
    layout_blocks = step.cache.layout.blocks([len(ids) for ids in prompts])
    real = len(layout_blocks)
    order = [position for block in layout_blocks for position in block]
    width = max(len(ids) for ids in prompts)

    def stacked(per_block: list[torch.Tensor]) -> torch.Tensor:  # real rows, right-padded to `width` tokens
        return torch.cat(
            [
                torch.nn.functional.pad(
                    tensor[: len(block.lengths), :, :width], (0, 0, 0, width - min(width, tensor.shape[2]))
                )
                for tensor, block in zip(per_block, blocks[:real], strict=True)
            ]
        )

    layers = range(len(blocks[0].keys))
    keys = [stacked([block.keys[layer] for block in blocks[:real]]) for layer in layers]
    values = [stacked([block.values[layer] for block in blocks[:real]]) for layer in layers]
    last_logits = torch.cat(
        [block.logits[range(len(block.lengths)), [length - 1 for length in block.lengths]] for block in blocks[:real]]
    )
    lengths = torch.tensor([len(prompts[position]) for position in order], device=last_logits.device)
    return PromptPass(
        term=term,
        drift=drift,
        row_of={int(query_index[position]): row for row, position in enumerate(order)},
        lengths=lengths,
        keys=[_leaf(tensor) for tensor in keys],
        values=[_leaf(tensor) for tensor in values],
        last_logits=_leaf(last_logits),
        graph=[*keys, *values, last_logits],
        fillers=[block.logits for block in blocks[real:]],
        fused_output=step.fused_output,
        entropy_gradient=step.algorithm.entropy_gradient,
    )
