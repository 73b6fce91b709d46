"""The quickstart's toy task and model: problems, prompt format, pre-training, the cached asset build, and the
shipped model (its identity and its greedy accuracy)."""

import hashlib
import json
import operator
import re
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from erpo_lightning.data.templates import render_prompt, tokenize_prompts
from erpo_lightning.rewards import MathReward
from erpo_lightning.rollout.engine import left_pad
from erpo_lightning.toy import (
    MAX_NEW_TOKENS,
    SHIPPED_DIR,
    TOY_TEMPLATE_SUFFIX,
    PretrainConfig,
    ToyConfig,
    compare_with_shipped,
    ensure_toy_assets,
    make_problems,
    shipped_assets,
    toy_template,
    verify_shipped,
)
from erpo_lightning.toy import assets as toy_assets
from erpo_lightning.toy.pretrain import IGNORE_INDEX, collate, encode_examples, pretrain, sample_correct
from erpo_lightning.toy.ship import file_sha256, ship, weights_sha256
from erpo_lightning.toy.task import NUM_PROBLEMS
from erpo_lightning.toy.tiny_qwen2 import build_byte_tokenizer

PROBLEM = re.compile(r"Compute (\d+) ([+-]) (\d+) ([+-]) (\d+)\.")
OPS = {"+": operator.add, "-": operator.sub}
SMALL = ToyConfig(
    num_test=24,
    num_val=16,
    eval_samples=2,
    pretrain=PretrainConfig(batch_size=16, max_steps=6, eval_every=3, warmup_steps=2, target_accuracy=2.0),
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Train on one thread, as the toy build does: two OpenMP threads crawl when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_problems_are_deterministic_distinct_and_exclusion_holds():
    first, again, other = make_problems(300, seed=3), make_problems(300, seed=3), make_problems(300, seed=4)
    assert first == again
    assert [row["id"] for row in first] != [row["id"] for row in other]
    assert len({row["problem"] for row in first}) == len({row["id"] for row in first}) == 300
    held_out = {row["problem"] for row in first[:100]}
    rest = make_problems(NUM_PROBLEMS - 100, seed=9, exclude=held_out)
    assert not held_out & {row["problem"] for row in rest}
    with pytest.raises(ValueError, match="only"):
        make_problems(NUM_PROBLEMS - 99, seed=9, exclude=held_out)


def test_answers_and_worked_solutions_are_right():
    grader = MathReward(num_workers=0)
    rows = make_problems(NUM_PROBLEMS, seed=0)
    for row in rows:
        a, op1, b, op2, c = PROBLEM.fullmatch(row["problem"]).groups()
        first = OPS[op1](int(a), int(b))
        answer = OPS[op2](first, int(c))
        assert row["answer"] == str(answer) and first >= 0 and answer >= 0
        assert row["solution"].startswith(f"{a} {op1} {b} = {first}. {first} {op2} {c} = {answer}.")
    assert all(grader.verdicts([row["solution"] for row in rows], [row["answer"] for row in rows]))
    # Solutions plus eos fit the recommended rollout length with room to spare.
    assert max(len(row["solution"]) for row in rows) + 1 + 8 <= MAX_NEW_TOKENS


def test_training_sequences_are_the_rendered_prompt_then_solution_and_eos():
    tokenizer = build_byte_tokenizer()
    row = make_problems(1, seed=0)[0]
    assert render_prompt(toy_template(), row["problem"], tokenizer) == row["problem"] + TOY_TEMPLATE_SUFFIX
    [(ids, prompt_length)] = encode_examples([row], tokenizer)
    assert ids[:prompt_length] == tokenize_prompts(toy_template(), [row["problem"]], tokenizer)[0]
    assert tokenizer.decode(ids[prompt_length:]) == row["solution"] + tokenizer.eos_token

    examples = encode_examples(make_problems(3, seed=1), tokenizer)
    input_ids, labels = collate(examples, tokenizer.pad_token_id)
    for row_ids, row_labels, (ids, prompt_length) in zip(input_ids, labels, examples, strict=True):
        assert row_ids[: len(ids)].tolist() == ids
        assert (row_labels[:prompt_length] == IGNORE_INDEX).all() and (row_labels[len(ids) :] == IGNORE_INDEX).all()
        assert row_labels[prompt_length : len(ids)].tolist() == ids[prompt_length:]

    padded, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert padded.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.mark.slow
def test_short_pretraining_lowers_the_loss_and_is_repeatable():
    tokenizer = build_byte_tokenizer()
    rows = make_problems(400, seed=0)
    config = PretrainConfig(batch_size=32, max_steps=40, eval_every=1000, warmup_steps=5)
    grader = MathReward(num_workers=0)
    result = pretrain(tokenizer, rows, rows[:8], config, grader)
    assert result.steps == 40
    assert sum(result.losses[-5:]) < 0.5 * sum(result.losses[:5])
    again = pretrain(tokenizer, rows, rows[:8], replace(config, max_steps=3), grader)
    assert again.losses == result.losses[:3]


def test_pretraining_stops_once_the_sampled_accuracy_reaches_the_target():
    tokenizer = build_byte_tokenizer()
    rows = make_problems(64, seed=0)
    calls = []
    config = PretrainConfig(batch_size=8, max_steps=20, eval_every=4, target_accuracy=0.0)
    result = pretrain(tokenizer, rows, rows[:4], config, MathReward(num_workers=0), lambda *args: calls.append(args))
    assert result.steps == 4 and [call[0] for call in calls] == [1, 2, 3, 4]
    assert calls[-1][2] is not None and all(call[2] is None for call in calls[:-1])


def test_sample_correct_grades_each_sample(tiny_model):
    tokenizer = build_byte_tokenizer()
    rows = make_problems(5, seed=0)
    sampled = sample_correct(tiny_model, tokenizer, rows, MathReward(num_workers=0), num_samples=3)
    greedy = sample_correct(tiny_model, tokenizer, rows, MathReward(num_workers=0), temperature=0.0)
    assert sampled.shape == (5, 3) and greedy.shape == (5, 1) and sampled.dtype == torch.bool
    assert not sampled.any()  # a random model does not write \boxed{right answer}


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    """A real (few-step) build, run with two torch threads set: it trains on one and must give the two back."""
    root = tmp_path_factory.mktemp("toy") / "assets"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    assets = ensure_toy_assets(root, config=SMALL)
    threads_after, _ = torch.get_num_threads(), torch.set_num_threads(threads)
    return root, assets, threads_after


def test_build_writes_a_loadable_model_and_disjoint_splits(small_build):
    root, assets, threads_after = small_build
    assert threads_after == 2
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    train = [json.loads(line) for line in assets.train_file.read_text().splitlines()]
    test = [json.loads(line) for line in assets.test_file.read_text().splitlines()]
    assert len(test) == SMALL.num_test and len(train) == NUM_PROBLEMS - SMALL.num_test - SMALL.num_val
    assert all(set(row) == {"id", "problem", "answer"} for row in train + test)
    assert not {row["problem"] for row in train} & {row["problem"] for row in test}
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest == assets.manifest and manifest["metrics"]["steps"] == SMALL.pretrain.max_steps
    assert manifest["template_suffix"] == TOY_TEMPLATE_SUFFIX and 0 <= manifest["metrics"]["test_pass@2"] <= 1
    assert not list(root.parent.glob(".assets.partial-*"))


def test_second_call_reuses_the_build(small_build, monkeypatch):
    root, assets, _ = small_build
    mtimes = {path: path.stat().st_mtime_ns for path in root.rglob("*")}
    monkeypatch.setattr(toy_assets, "build_toy_assets", lambda *args: pytest.fail("rebuilt a completed build"))
    assert ensure_toy_assets(root, config=SMALL) == assets
    assert {path: path.stat().st_mtime_ns for path in root.rglob("*")} == mtimes


def test_partial_stale_or_forced_builds_are_redone(tmp_path, monkeypatch):
    builds = []

    def fake_build(directory, config, console):
        builds.append(directory)
        (directory / "model").mkdir()
        for name in ("model/config.json", "model/model.safetensors", "train.jsonl", "test.jsonl"):
            (directory / name).write_text("{}")
        manifest = {
            "name": toy_assets.TOY_NAME,
            "config": config.to_dict(),
            "metrics": dict.fromkeys(
                (
                    "params",
                    "steps",
                    "seconds",
                    "test_greedy_accuracy",
                    "test_pass@1",
                    f"test_pass@{config.eval_samples}",
                ),
                0,
            ),
        }
        (directory / "manifest.json").write_text(json.dumps(manifest))
        return manifest

    monkeypatch.setattr(toy_assets, "build_toy_assets", fake_build)
    root = tmp_path / "assets"
    root.mkdir()
    (root / "train.jsonl").write_text("half written")  # an interrupted build: no manifest
    ensure_toy_assets(root, config=SMALL)
    ensure_toy_assets(root, config=SMALL)
    assert len(builds) == 1 and (root / "train.jsonl").read_text() == "{}"
    ensure_toy_assets(root, config=replace(SMALL, data_seed=7))  # other settings: stale
    ensure_toy_assets(root, config=replace(SMALL, data_seed=7), force=True)
    assert len(builds) == 3

    (root / "notes.txt").write_text("not ours")
    with pytest.raises(FileExistsError, match="notes.txt"):
        ensure_toy_assets(root, config=SMALL)
    assert (root / "notes.txt").exists() and not list(tmp_path.glob(".assets.partial-*"))


def test_default_root_follows_erpo_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ERPO_CACHE_HOME", str(tmp_path))
    assert toy_assets.default_root() == tmp_path / "toy-arith-v1"


# The shipped toy model's identity: sha256 of its files' `sha256sum` listing (manifest.json's `sha256`). Changing the
# shipped files must change this line too, and re-measure SHIPPED_GREEDY_CORRECT.
SHIPPED_SHA256 = "22f62e769ef1b3fd3127a3847ebab0d355a16ceea64634c359066b9bcc151310"
# Greedy decoding of the shipped fp32 model on its 500 test problems: 240 right, measured with 1 and 2 threads and
# batches of 7, 64 and 256. Exact on any machine: the smallest gap between the top two logits along the greedy
# paths is 3.7e-3, far above the float32 rounding (~1e-6) that other kernels or batch shapes add to these logits.
SHIPPED_GREEDY_CORRECT = 240


def test_shipped_files_match_their_manifest_and_the_pinned_identity():
    manifest = verify_shipped()
    digests = {name: hashlib.sha256((SHIPPED_DIR / name).read_bytes()).hexdigest() for name in manifest["files"]}
    listing = "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))
    assert hashlib.sha256(listing.encode()).hexdigest() == manifest["sha256"] == SHIPPED_SHA256
    assert {"config.json", "model.safetensors", "train.jsonl", "test.jsonl"} <= set(manifest["files"])
    assert sum((SHIPPED_DIR / name).stat().st_size for name in manifest["files"]) < 2_000_000
    assets = shipped_assets()
    assert assets.model_dir == SHIPPED_DIR and assets.manifest == manifest["build"]
    train = [json.loads(line) for line in assets.train_file.read_text().splitlines()]
    test = [json.loads(line) for line in assets.test_file.read_text().splitlines()]
    assert len(test) == ToyConfig().num_test and len(train) == NUM_PROBLEMS - ToyConfig().num_test - ToyConfig().num_val
    assert not {row["problem"] for row in train} & {row["problem"] for row in test}


def test_shipped_base_model_greedy_accuracy_is_the_pinned_count():
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR)
    test = [json.loads(line) for line in (SHIPPED_DIR / "test.jsonl").read_text().splitlines()]
    greedy = sample_correct(model, tokenizer, test, MathReward(num_workers=0), temperature=0.0)
    assert int(greedy.sum()) == SHIPPED_GREEDY_CORRECT
    assert verify_shipped()["build"]["metrics"]["test_greedy_accuracy"] == round(SHIPPED_GREEDY_CORRECT / len(test), 4)


def test_a_changed_missing_or_extra_shipped_file_is_named(tmp_path):
    copy = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, copy)
    assert verify_shipped(copy)["sha256"] == SHIPPED_SHA256
    with (copy / "train.jsonl").open("a") as handle:
        handle.write("\n")
    (copy / "notes.txt").write_text("not shipped")
    (copy / "tokenizer.json").unlink()
    with pytest.raises(ValueError) as error:
        verify_shipped(copy)
    assert all(word in str(error.value) for word in ("train.jsonl changed", "notes.txt not", "tokenizer.json missing"))
    assert "config.json" not in str(error.value)


def test_ship_writes_a_verifiable_copy_and_compare_tells_builds_apart(small_build, tmp_path):
    _, assets, _ = small_build
    target = tmp_path / "shipped"
    manifest = ship(assets, target)
    assert verify_shipped(target) == manifest and manifest["build"] == assets.manifest
    assert (target / "model.safetensors").read_bytes() == (assets.model_dir / "model.safetensors").read_bytes()
    same, lines = compare_with_shipped(assets, target)
    assert same and len(lines) == 3 and all("same as shipped" in line for line in lines)
    different, lines = compare_with_shipped(assets)  # the few-step build against the real shipped model
    assert not different and "weights: DIFFERENT" in lines[0]
    assert ship(assets, target)["sha256"] == manifest["sha256"]  # shipping again replaces the set in place
    (target / "stray.bin").write_bytes(b"")
    with pytest.raises(FileExistsError, match="stray.bin"):
        ship(assets, target)


def test_weights_hash_follows_the_tensors_not_the_file_layout(tmp_path):
    tensors = load_file(SHIPPED_DIR / "model.safetensors")
    shipped = verify_shipped()["weights_sha256"]
    assert weights_sha256(SHIPPED_DIR / "model.safetensors") == shipped
    save_file(tensors, tmp_path / "annotated.safetensors", metadata={"format": "pt", "saved_by": "another version"})
    assert file_sha256(tmp_path / "annotated.safetensors") != file_sha256(SHIPPED_DIR / "model.safetensors")
    assert weights_sha256(tmp_path / "annotated.safetensors") == shipped
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = torch.nextafter(tensors[name].view(-1)[0], torch.tensor(float("inf")))  # one ulp
    save_file(tensors, tmp_path / "nudged.safetensors", metadata={"format": "pt"})
    assert weights_sha256(tmp_path / "nudged.safetensors") != shipped
