"""`erpo`: the command line (a LightningCLI), with the subcommands fit, validate and cache.

    erpo fit --config configs/quickstart.yaml
    erpo cache --config configs/erpo_qwen2.5_math_7b.yaml      # compute the reference score cache only
    erpo fit --print_config                                   # every field, with its default

The config has the usual LightningCLI groups (`trainer`, `model`, `data`) plus `rollout` (the RolloutCallback:
engine, reward, group size, sampling). `model.model_path` also sets `data.model_path`, and `rollout.temperature`
sets `model.temperature`, so the three always agree.
"""

from __future__ import annotations

import os

# Colocated vLLM must run in this process (weights are pushed into its worker in place); set before vLLM loads.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402

from erpo_lightning.callbacks.rollout import RolloutCallback  # noqa: E402
from erpo_lightning.data import QueryDataModule, build_or_load_cache  # noqa: E402
from erpo_lightning.evaluation import SweepConfig, run_validate  # noqa: E402
from erpo_lightning.modules.erpo_module import ERPOModule  # noqa: E402


class ERPOTrainer(Trainer):
    """Lightning's Trainer plus the `cache` subcommand; `validate` is the temperature sweep.

    `use_distributed_sampler` defaults to False: the datamodule's `QueryBatchSampler` already gives each rank its
    share of every global batch, and resumes mid-epoch.
    """

    def __init__(self, *args, use_distributed_sampler: bool = False, **kwargs) -> None:
        super().__init__(*args, use_distributed_sampler=use_distributed_sampler, **kwargs)

    def cache(self, model: ERPOModule, datamodule: QueryDataModule, force: bool = False) -> None:
        """Compute (or check and load) the frozen-reference query score cache of the configured training data.

        Args:
            force: recompute even when a matching cache exists.
        """
        build_or_load_cache(datamodule, force=force, strategy=self.strategy if self.world_size > 1 else None)

    def validate(
        self,
        model: ERPOModule,
        datamodule: QueryDataModule | None = None,
        ckpt_path: str | None = None,
        sweep: SweepConfig | None = None,
        compare_ckpt_paths: list[str] | None = None,
        include_base: bool = False,
    ) -> list[dict[str, float]]:
        """Temperature sweep: Avg@k / Pass@1 / Pass@k per benchmark and temperature, table, results files, plot.

        Without a checkpoint the weights of `model.model_path` are evaluated (the "Base" row). See
        docs/evaluation.md.

        Args:
            ckpt_path: a Lightning checkpoint whose policy weights are evaluated.
            sweep: benchmarks, temperatures, k, ... (`SweepConfig`).
            compare_ckpt_paths: more checkpoints, each evaluated and shown beside the first.
            include_base: also evaluate `model.model_path` itself, first.
        """
        checkpoints = [path for path in (ckpt_path, *(compare_ckpt_paths or [])) if path]
        return run_validate(self, model, datamodule, sweep or SweepConfig(), checkpoints, include_base)


class ERPOCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        lightning_subcommands = LightningCLI.subcommands()  # test/predict have no meaning for RL training
        return {
            "fit": lightning_subcommands["fit"],
            "validate": lightning_subcommands["validate"],
            "cache": {"model", "datamodule"},
        }

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(RolloutCallback, "rollout")
        parser.link_arguments("model.model_path", "data.model_path")
        parser.link_arguments("rollout.temperature", "model.temperature")


def main(args: list[str] | None = None) -> None:
    ERPOCLI(
        ERPOModule,
        QueryDataModule,
        trainer_class=ERPOTrainer,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # the module builds AdamW + warm-up from its own fields
        args=args,
    )


if __name__ == "__main__":
    main()
