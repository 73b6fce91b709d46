"""Tiny Qwen2-architecture models and a byte-level tokenizer, built locally (no model hub).

Tests, benchmarks and the quickstart all build their models here, so that everything runs offline on a CPU.
The models are real Hugging Face `Qwen2ForCausalLM` checkpoints that both transformers and vLLM load.
vLLM's CPU attention kernel accepts head_dim 32/64/128 only, hence the head sizes below.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# A ChatML template, as Qwen2.5 uses, kept short: tests need a real chat template to render queries.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: 256 byte tokens (no merges) plus the ChatML special tokens.

    Any UTF-8 text round-trips exactly; one ASCII character is one token.
    """
    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(byte_alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_positions: int = 1024,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM sized for `tokenizer` (head_dim = hidden_size / num_heads)."""
    head_dim = hidden_size // num_heads
    if head_dim not in (32, 64, 128):
        raise ValueError(f"head_dim {head_dim} is not one of 32/64/128, which vLLM's CPU attention requires")
    # Round the vocabulary up to a multiple of 64, as real checkpoints do.
    vocab_size = (len(tokenizer) + 63) // 64 * 64
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float().eval()


def save_tiny_model(path: str | Path, seed: int = 0, **model_kwargs) -> Path:
    """Build the byte tokenizer and a tiny Qwen2 model and save both with `save_pretrained` into `path`."""
    path = Path(path)
    tokenizer = build_byte_tokenizer()
    model = build_tiny_qwen2(tokenizer, seed=seed, **model_kwargs)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_tiny_model(path: str | Path) -> Qwen2ForCausalLM:
    """Load a model saved by `save_tiny_model` in fp32, in eval mode."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
