"""FSDP2 sharding of a Hugging Face causal LM, and global gradient norms over its shards.

`ERPOModule.configure_model` calls `shard_causal_lm` under Lightning's `ModelParallelStrategy`: one `fully_shard`
unit per decoder layer (its parameters are all-gathered just before the layer runs and freed after) plus the root
(embeddings, final norm, LM head). The checkpoints that strategy writes are `torch.distributed.checkpoint`
directories (one shard per rank), which `checkpoints.policy_weights` reads and `erpo export` exports.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from erpo_lightning.scoring.layers import decoder_layers


def mixed_precision_policy(param_dtype: str | None) -> MixedPrecisionPolicy:
    """Compute in `param_dtype` (e.g. "bfloat16"; None = the weights' dtype), reduce gradients in float32."""
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype), reduce_dtype=torch.float32)


def shard_causal_lm(model: torch.nn.Module, mesh: DeviceMesh, param_dtype: str | None = None) -> torch.nn.Module:
    """Apply FSDP2 in place: `fully_shard` on every decoder layer, then on the root; returns `model`.

    Args:
        mesh: the 1-D data-parallel mesh the parameters are sharded over (`device_mesh["data_parallel"]`).
        param_dtype: mixed-precision compute dtype (see `mixed_precision_policy`); the sharded fp32 weights and the
            optimizer state stay in the model's own dtype.
    """
    policy = mixed_precision_policy(param_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    # The root keeps its parameters gathered after forward: the LM head runs last, backward needs it first, and the
    # fused output layer (`output_layer.py`) reads the head's weight after the model's forward has returned.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def data_parallel_mesh(device_mesh: DeviceMesh) -> DeviceMesh:
    """The data-parallel dimension of `ModelParallelStrategy`'s mesh; tensor parallelism is not implemented."""
    if device_mesh["tensor_parallel"].size() != 1:
        raise ValueError(
            "ERPOModule shards with FSDP2 only: use ModelParallelStrategy(data_parallel_size=<number of GPUs>, "
            "tensor_parallel_size=1)"
        )
    return device_mesh["data_parallel"]


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip gradients to a global L2 norm of `max_norm` (None: measure only); returns the norm before clipping (a
    plain scalar tensor).

    Under FSDP2 the gradients are DTensor shards: the norm of each is a partial result, reduced across ranks by
    `full_tensor()`, so every rank clips with the same, global norm. Under DDP the gradients are already averaged.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total
