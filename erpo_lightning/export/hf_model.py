"""`erpo export`: a training checkpoint as a Hugging Face model folder that transformers and vLLM load.

    erpo export --ckpt_path runs/quickstart/checkpoints/last.ckpt --out runs/quickstart/hf_model
    erpo export --ckpt_path CKPT --out DIR --push_to_hub user/name      # also upload the folder to the Hub
    erpo export --ckpt_path CKPT --out DIR --adapter_out ADAPTER_DIR    # a LoRA run: also the adapter alone
    erpo export --ckpt_path CKPT --out DIR --metrics RUN/metrics.csv    # the model card's sweep from this file

The checkpoint is a single file (one device, DDP) or an FSDP2 sharded folder (ModelParallelStrategy), read in one
process without a GPU or a process group. What the policy was built from is read from the checkpoint itself (the
module's hyper-parameters: `model_path`, `dtype`, `trust_remote_code`); the architecture, tokenizer and generation
config come from that initial model, the weights from the checkpoint. `--model_path` points elsewhere when the
initial model has moved since training (the weights must still fit it).

A LoRA run's checkpoint (`model.peft`) is written merged (W + scale·B·A per adapted layer, `weights.merged`): a plain
model that transformers and vLLM load without peft. `--adapter_out` also writes the adapter alone in peft's format
(`adapter_config.json`, `adapter_model.safetensors`: `PeftModel.from_pretrained(base, ADAPTER_DIR)`); its
`base_model_name_or_path` is the initial model's absolute path (or its Hub id), wherever the export ran from. A
checkpoint of the adapters alone (`model.peft.checkpoint: adapters`) gets its base from the initial model, whose
weight files must hash as the checkpoint records (`checkpoints.policy_weights.load_policy_weights`).

The folder also gets a model card, `README.md` (`model_card`): the initial model, the algorithm and its resolved loss
settings, the global step, the run's last temperature sweep (from `--metrics`, else the sweep history the checkpoint
keeps, else the `metrics.csv` beside the checkpoint; "No sweep was logged" when there is none) and this toolkit's
version. A metrics file that cannot be read is named in the card; it does not stop the export.

Before anything loads, `--out` and `--adapter_out` must be folders (or not exist yet) that do not overlap: the same
folder, or one inside the other, would put the adapter beside (or around) the merged model, which already holds it.
For the same reason `--out` may not hold an adapter's files (`adapter_config.json`, `adapter_model.*`: an earlier
`--adapter_out` export there would be applied by `from_pretrained` on top of the merged weights), nor
`--adapter_out` a model's; the error names the files. An earlier export of the same kind in the folder is replaced:
its files are deleted (a line says which) before the new ones are written, so the folder loads as exactly the model
exported; files of neither kind are left as they are.
After writing, the folder is read back (config.json, and safetensors whose tensor names cover the written state
dict) before the export counts as done; the message names the global step the checkpoint holds. A write that fails
(a full disk) is one line naming the folder and the cause, and a folder the export created is removed, not left
half-written. A checkpoint file that cannot be read (empty, cut short, not a checkpoint) is named with what is wrong
(`checkpoints.files.read_checkpoint`). A model whose config ties the LM head to the input embeddings but whose
trained head differs from them (LoRA on the head, from a checkpoint older than the refusal in modules/lora.py) is
written untied: `tie_word_embeddings: false` in config.json and `lm_head.weight` in the weights
(`weights.merged.tied_head_state`), so that no loader silently swaps the trained head for the embeddings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from erpo_lightning.checkpoints.files import read_checkpoint
from erpo_lightning.checkpoints.policy_weights import load_policy_weights
from erpo_lightning.checkpoints.resume_config import CONFIG_KEY
from erpo_lightning.common.errors import SettingsError
from erpo_lightning.export.model_card import CARD_NAME, model_card
from erpo_lightning.modules.lora import lora_config, lora_settings
from erpo_lightning.weights.gguf import share_like_other_files
from erpo_lightning.weights.merged import base_model_state_dict, embedding_weight_names, tied_head_state


class ExportError(ValueError):
    """The written folder is not a loadable model (`check_exported_folder`): one line naming it, exit status 1."""


def checkpoint_model_settings(ckpt_path: str | Path) -> dict[str, Any]:
    """`model_path`, `dtype`, `trust_remote_code` and `peft` (None: full fine-tuning) of the run that wrote
    `ckpt_path` (its module hyper-parameters, else the `model:` group of the run config the CLI stores in every
    checkpoint), and the optimizer step it holds (`global_step`; None when the checkpoint does not say)."""
    if not Path(ckpt_path).exists():
        raise SettingsError(f"--ckpt_path: no checkpoint at {ckpt_path}")
    checkpoint = read_checkpoint(ckpt_path)
    settings = checkpoint.get("hyper_parameters") or (checkpoint.get(CONFIG_KEY) or {}).get("model") or {}
    if not settings.get("model_path"):
        raise SettingsError(
            f"--ckpt_path {ckpt_path}: the checkpoint names no model_path (not an ERPOModule checkpoint?); "
            "pass --model_path, the run's initial model"
        )
    return {
        "model_path": str(settings["model_path"]),
        "dtype": settings.get("dtype") or "float32",
        "trust_remote_code": bool(settings.get("trust_remote_code", False)),
        "peft": lora_settings(settings.get("peft")),
        "global_step": checkpoint.get("global_step"),
    }


# The files each kind of export writes (a model's: weights, configs, tokenizer, card; an adapter's: peft's), by name.
MODEL_EXPORT_FILES = re.compile(
    r"config\.json|generation_config\.json|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)"
    r"|(model\.safetensors|pytorch_model\.bin)\.index\.json|tokenizer.*|special_tokens_map\.json|vocab\..+"
    r"|merges\.txt|added_tokens\.json|chat_template\..+|spiece\.model|README\.md"
)
ADAPTER_EXPORT_FILES = re.compile(r"adapter_config\.json|adapter_model\.(safetensors|bin)|README\.md")
# A file of the other kind changes what loads from the folder: transformers' `from_pretrained` applies an adapter
# it finds beside a model's weights (the merged ones: the adapter twice), and reads a model's config beside an adapter.
_FOREIGN = {
    "--out": (
        re.compile(r"adapter_config\.json|adapter_model\..+"),
        "a LoRA adapter (an earlier --adapter_out export?), which transformers' from_pretrained of the folder would "
        "apply on top of the merged weights written here",
    ),
    "--adapter_out": (
        re.compile(r"config\.json|generation_config\.json|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)"
                   r"|(model\.safetensors|pytorch_model\.bin)\.index\.json"),
        "a model's files (an earlier --out export?), which a loader of the folder would take for the adapter's base",
    ),
}  # fmt: skip


def export_files(folder: Path, kind: re.Pattern[str]) -> list[str]:
    """The names of the files directly in `folder` that match `kind` (sorted; [] when `folder` does not exist).
    Subfolders are not looked into: `from_pretrained` does not read them (HFExportCallback's `step_<n>` exports)."""
    if not folder.is_dir():
        return []
    return sorted(path.name for path in folder.iterdir() if path.is_file() and kind.fullmatch(path.name))


def check_output_folders(out: str | Path, adapter_out: str | Path | None = None) -> None:
    """SettingsError when `--out` or `--adapter_out` is an existing file, holds files of the other kind of export
    (`_FOREIGN`: an adapter's in `--out`, a model's in `--adapter_out`), or when the two folders overlap (the same
    folder, or one inside the other, after resolving links and `..`): checked before anything loads. Files of the
    same kind (an earlier export to the same folder) are replaced when the export writes (`clear_earlier_export`)."""
    for flag, path in (("--out", out), ("--adapter_out", adapter_out)):
        if path is not None and Path(path).exists() and not Path(path).is_dir():
            raise SettingsError(f"{flag}: {path} is a file, not a folder; name a folder to write the model into")
        if path is None:
            continue
        pattern, what = _FOREIGN[flag]
        foreign = export_files(Path(path), pattern)
        if foreign:
            raise SettingsError(
                f"{flag}: {path} holds {', '.join(foreign)}: {what}; delete {'them' if len(foreign) > 1 else 'it'} "
                f"(or the folder), or give {flag} an empty folder"
            )
    if adapter_out is None:
        return
    merged, adapter = Path(out).resolve(), Path(adapter_out).resolve()
    if merged == adapter or merged in adapter.parents or adapter in merged.parents:
        raise SettingsError(
            f"--adapter_out {adapter_out} and --out {out} overlap (the same folder, or one inside the other): the "
            "merged model already holds the adapter, and loading it beside the adapter's files would apply the "
            "adapter a second time; give them separate folders"
        )


def clear_earlier_export(folder: Path, kind: re.Pattern[str], flag: str) -> None:
    """Delete the files of an earlier export of the same `kind` from `folder`, saying so, so that the folder then holds
    exactly what this export writes (an earlier model's tokenizer files or weight shards would otherwise stay beside
    the new ones). Other files are left as they are."""
    earlier = export_files(folder, kind)
    if earlier:
        shown = ", ".join(earlier[:6]) + (f" and {len(earlier) - 6} more" if len(earlier) > 6 else "")
        print(f"[erpo] {flag} {folder} holds an earlier export ({shown}): replacing it", flush=True)
        for name in earlier:
            (folder / name).unlink()


def initial_model_reference(source: str) -> str:
    """`source` as a reader elsewhere finds it: the absolute path of a local model, a Hub id unchanged."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def export_checkpoint(
    ckpt_path: str | Path,
    out: str | Path,
    model_path: str | None = None,
    adapter_out: str | Path | None = None,
    metrics: str | Path | None = None,
) -> Path:
    """Write the policy of `ckpt_path` to `out` as a Hugging Face folder (weights as safetensors, config.json,
    generation_config.json, tokenizer files, the model card README.md) and return `out`, once it is read back as a
    loadable model.

    Args:
        ckpt_path: a Lightning checkpoint file or FSDP2 sharded checkpoint folder of an ERPOModule run.
        out: the folder to write (created when missing); not an existing file, nor a folder holding an adapter's
            files (refused). An earlier model export there is deleted, file by file, before the new one is written
            (`clear_earlier_export`, which says so); other files are left.
        model_path: the run's initial model; None = the one the checkpoint names.
        adapter_out: a LoRA run only: also write the adapter alone there, in peft's `save_pretrained` format, with
            `base_model_name_or_path` the initial model's absolute path (or Hub id); a folder apart from `out`,
            holding no model's files (an earlier adapter there is replaced).
        metrics: the run's CSVLogger metrics file, read first for the model card's sweep; None = the sweep history
            the checkpoint keeps, else the metrics.csv beside it.

    Raises:
        SettingsError: before anything loads, for a bad `out` / `adapter_out` (`check_output_folders`), `metrics`
            that is not a file, or a bad checkpoint.
        ExportError: the written folder does not hold a loadable model (`check_exported_folder`), or a write failed
            (a full disk: the folders the export created are removed, `removed_if_the_write_fails`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_output_folders(out, adapter_out)
    if metrics is not None and not Path(metrics).is_file():
        raise SettingsError(f"--metrics: no metrics file at {metrics}")
    settings = checkpoint_model_settings(ckpt_path)
    source = model_path or settings["model_path"]
    if not (Path(source) / "config.json").is_file() and Path(source).exists():
        raise SettingsError(f"--model_path: no model at {source} (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, settings["dtype"]), trust_remote_code=settings["trust_remote_code"]
        )
    except OSError as error:
        raise SettingsError(
            f"the checkpoint's initial model {source} cannot be loaded from here ({error.__class__.__name__}); "
            "pass --model_path, the run's initial model as it is now"
        ) from None
    lora = settings["peft"]
    if adapter_out is not None and lora is None:
        raise SettingsError(f"--adapter_out: {ckpt_path} is not from a LoRA run (its model.peft is null)")
    adapters = None
    if lora is not None:  # the checkpoint's policy names: the base model with the run's adapters in place
        from peft import get_peft_model

        adapters = get_peft_model(model, lora_config(lora))  # wraps `model`, adding the adapters to it in place
    load_policy_weights(model, str(ckpt_path))
    out = Path(out)
    with removed_if_the_write_fails([out] + ([Path(adapter_out)] if adapter_out is not None else [])):
        if adapter_out is not None:
            adapters.peft_config["default"].base_model_name_or_path = initial_model_reference(source)
            clear_earlier_export(Path(adapter_out), ADAPTER_EXPORT_FILES, "--adapter_out")
            adapters.save_pretrained(Path(adapter_out))
            check_adapter_folder(Path(adapter_out))
        state = tied_head_state(model, base_model_state_dict(model))  # may set config.tie_word_embeddings false
        clear_earlier_export(out, MODEL_EXPORT_FILES, "--out")
        # Also writes generation_config.json, the initial model's (or transformers' default).
        model.save_pretrained(out, state_dict=state)
        AutoTokenizer.from_pretrained(source, trust_remote_code=settings["trust_remote_code"]).save_pretrained(out)
        check_exported_folder(out, state, embedding_weight_names(model), settings["trust_remote_code"])
        card = model_card(read_checkpoint(ckpt_path), ckpt_path, initial_model_reference(source), metrics)
        (out / CARD_NAME).write_text(card, encoding="utf-8")
    for folder in (out, adapter_out):  # save_pretrained writes weight files 0600; the folder is meant to be shared
        if folder is not None:
            share_like_other_files(Path(folder))
    return out


@contextlib.contextmanager
def removed_if_the_write_fails(folders: list[Path]) -> Iterator[None]:
    """Run the block that writes `folders`; when a write fails (a full disk: OSError, or safetensors' own
    SafetensorError), remove each folder the block created, so that no half-written model is left to load, and
    raise ExportError naming the folder and the cause. A folder that existed before is left as it is (it may hold
    other files), and the message says it may hold a partial export."""
    from safetensors import SafetensorError

    existed = {folder: folder.exists() for folder in folders}
    try:
        yield
    except (OSError, SafetensorError) as error:
        for folder in folders:
            if not existed[folder]:
                shutil.rmtree(folder, ignore_errors=True)
        kept = [str(folder) for folder in folders if existed[folder]]
        after = (
            f"; {' and '.join(kept)} existed before and may hold a partial export: delete it or export again"
            if kept
            else "; the partial export was removed"
        )
        cause = " ".join(str(error).split()) or type(error).__name__
        raise ExportError(f"could not write the export to {', '.join(map(str, folders))}: {cause}{after}") from error


def check_exported_folder(
    folder: Path,
    state: Mapping[str, torch.Tensor],
    embeddings: tuple[str, str] | None = None,
    trust_remote_code: bool = False,
) -> None:
    """ExportError naming `folder` unless it holds config.json and safetensors weights (`model.safetensors`, or
    `model.safetensors.index.json` and every shard it names) whose tensor names cover `state`, the state dict
    written: an entry counts as covered when it, or an entry sharing its storage (a tied weight, saved once), is in
    the files. Only the files' headers are read.

    Args:
        embeddings: the (input embedding, LM head) weight names (`weights.merged.embedding_weight_names`): a config
            that ties them must not come with both in the files (a loader would keep one and drop the other).
        trust_remote_code: needed to read the config of a model with code of its own.
    """
    from safetensors import safe_open
    from transformers import AutoConfig

    def fail(problem: str) -> ExportError:
        return ExportError(f"the exported folder {folder} does not hold a loadable model: {problem}")

    if not (folder / "config.json").is_file():
        raise fail("no config.json")
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        shards = [folder / "model.safetensors"]
    elif index.is_file():
        shards = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        raise fail("no model.safetensors (nor model.safetensors.index.json)")
    written: set[str] = set()
    for shard in shards:
        if not shard.is_file():
            raise fail(f"its index names {shard.name}, which is missing")
        with safe_open(str(shard), framework="pt") as handle:
            written.update(handle.keys())
    storages: dict[tuple[int, tuple[int, ...]], set[str]] = {}
    for name, tensor in state.items():
        storages.setdefault((tensor.data_ptr(), tuple(tensor.shape)), set()).add(name)
    missing = [names for names in storages.values() if not names & written]
    if missing:
        shown = sorted(min(names) for names in missing)
        raise fail(f"{len(shown)} of the model's tensors are not in its safetensors (first: {shown[0]})")
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code).get_text_config()
    except (OSError, ValueError) as error:
        raise fail(f"its config.json does not load ({type(error).__name__})") from None
    if embeddings is not None and getattr(config, "tie_word_embeddings", False) and set(embeddings) <= written:
        raise fail(f"config.json ties the LM head to the input embeddings, yet {embeddings[1]} is written on its own")


def check_adapter_folder(folder: Path) -> None:
    """ExportError naming `folder` unless it holds peft's adapter_config.json and adapter_model.safetensors."""
    missing = [name for name in ("adapter_config.json", "adapter_model.safetensors") if not (folder / name).is_file()]
    if missing:
        raise ExportError(f"the adapter folder {folder} does not hold the adapter: no {missing[0]}")


def checkpoint_step(ckpt_path: str | Path) -> str:
    """` (global step N)`: the optimizer step the checkpoint holds, for the export's message ("" when unknown)."""
    step = checkpoint_model_settings(ckpt_path)["global_step"]
    return "" if step is None else f" (global step {step})"


def push_to_hub(folder: Path, repo_id: str) -> str:
    """Upload `folder` to the Hub model repository `repo_id` (made if missing; needs `hf auth login` or
    HF_TOKEN); the repository's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="erpo export")
    return str(url)


def main(args: list[str] | None = None) -> None:
    """`erpo export` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="erpo export", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint file or an FSDP2 sharded checkpoint folder")
    parser.add_argument("--out", required=True, help="the Hugging Face folder to write")
    parser.add_argument("--model_path", default=None, help="the run's initial model, if it moved since training")
    parser.add_argument("--push_to_hub", default=None, metavar="REPO_ID", help="also upload the folder to the Hub")
    parser.add_argument("--adapter_out", default=None, help="a LoRA run: also write the adapter alone (peft format)")
    parser.add_argument("--metrics", default=None, help="the run's metrics.csv, for the model card's sweep numbers")
    parsed = parser.parse_args(args)
    folder = export_checkpoint(parsed.ckpt_path, parsed.out, parsed.model_path, parsed.adapter_out, parsed.metrics)
    step = checkpoint_step(parsed.ckpt_path)
    print(f"[erpo] exported the policy of {parsed.ckpt_path}{step} to {folder}", flush=True)
    if parsed.adapter_out:
        print(f"[erpo] wrote its LoRA adapter to {parsed.adapter_out}", flush=True)
    if parsed.push_to_hub:
        print(f"[erpo] uploaded {folder} to {push_to_hub(folder, parsed.push_to_hub)}", flush=True)
