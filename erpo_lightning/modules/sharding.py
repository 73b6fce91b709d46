"""FSDP2 sharding of a Hugging Face causal LM, global gradient norms, and export of sharded checkpoints.

`ERPOModule.configure_model` calls `shard_causal_lm` under Lightning's `ModelParallelStrategy`: one `fully_shard`
unit per decoder layer (its parameters are all-gathered just before the layer runs and freed after) plus the root
(embeddings, final norm, LM head). The checkpoints that strategy writes are `torch.distributed.checkpoint`
directories (one shard per rank); `load_sharded_policy` reads the policy of one into an unsharded model (what
`erpo validate` does) and `export_hf_checkpoint` writes it as a Hugging Face model directory.

    python -m erpo_lightning.modules.sharding CHECKPOINT_DIR MODEL_PATH OUTPUT_DIR
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

# Where the policy lives inside the LightningModule's state dict (`ERPOModule.policy`).
POLICY_PREFIX = "policy."


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: modules whose class the model declares unsplittable (`_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} declares no decoder-layer class in `_no_split_modules`; cannot shard it per layer"
        )
    return layers


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


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a `torch.distributed.checkpoint` directory (what ModelParallelStrategy saves)."""
    return (Path(path) / ".metadata").is_file()


def load_sharded_policy(policy: torch.nn.Module, checkpoint_dir: str | Path) -> None:
    """Read the policy weights of a sharded Lightning checkpoint into `policy`, in place.

    Runs in one process without a process group; `policy` is an unsharded model of the run's architecture. Every
    policy weight must be in the checkpoint (a missing one raises); its other entries (optimizer state) are not read.
    """
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.api import CheckpointException

    state = {POLICY_PREFIX + name: tensor for name, tensor in policy.state_dict().items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            load({"state_dict": state}, checkpoint_id=str(checkpoint_dir), no_dist=True)
        except CheckpointException as error:  # its message is a per-rank traceback dump; keep the cause
            failure = next(iter(error.failures.values()), error)
            cause = failure[0] if isinstance(failure, tuple) else failure
            raise ValueError(
                f"{checkpoint_dir}: cannot load it into this {type(policy).__name__}: {cause} Is `model.model_path` "
                "the initial model of the run that wrote this checkpoint?"
            ) from error


def export_hf_checkpoint(checkpoint_dir: str | Path, model_path: str, output_dir: str | Path) -> Path:
    """Write the policy of a distributed (sharded) Lightning checkpoint as a Hugging Face model directory.

    Runs in one process without a process group. The model is built from `model_path` (the run's initial policy:
    architecture, dtype, tokenizer), then its weights are read in place from the shards, so the host holds one copy.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path)
    load_sharded_policy(model, checkpoint_dir)
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(output_dir)
    return output_dir


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export the policy of a sharded checkpoint as a Hugging Face model.")
    parser.add_argument("checkpoint_dir", help="a checkpoint directory written under ModelParallelStrategy")
    parser.add_argument("model_path", help="the run's model.model_path (architecture and tokenizer)")
    parser.add_argument("output_dir")
    parsed = parser.parse_args(args)
    print(export_hf_checkpoint(parsed.checkpoint_dir, parsed.model_path, parsed.output_dir))


if __name__ == "__main__":
    main()
