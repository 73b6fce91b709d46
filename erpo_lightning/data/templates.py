"""Prompt templates: how a raw problem becomes the token ids the policy sees.

A template is (chat template on/off, optional system prompt, instruction suffix). The rendered ids are exactly the
query tokens the reference cache scores and the trainer extends with responses, so everything that changes them is
part of the cache fingerprint (`PromptTemplate.to_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from transformers import PreTrainedTokenizerBase

from erpo_lightning.data.files import DataError

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
# The ERPO paper's training instruction (docs/erpo.md), appended to every problem after one space.
ERPO_SUFFIX = (
    " You FIRST think about the reasoning process as an internal monologue and then provide the final answer."
    " The reasoning process MUST BE enclosed within <think> </think> tags."
    " The final answer MUST BE put in \\boxed{}."
)


@dataclass(frozen=True)
class PromptTemplate:
    """How to turn a problem into a prompt.

    Attributes:
        name: the preset this came from (informational; the other fields define the prompt).
        use_chat_template: render with the tokenizer's chat template (system/user turns + generation prompt);
            when False the prompt is plain text for base models: `system_prompt + "\\n\\n" + problem + suffix`.
        system_prompt: a system turn (chat) or leading paragraph (plain); "" for none.
        suffix: text appended to the problem, e.g. an answer-format instruction.
    """

    name: str
    use_chat_template: bool
    system_prompt: str = ""
    suffix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, PromptTemplate] = {
    "qwen25-math-cot": PromptTemplate("qwen25-math-cot", use_chat_template=True, system_prompt=QWEN_MATH_SYSTEM),
    "erpo-paper": PromptTemplate("erpo-paper", use_chat_template=True, suffix=ERPO_SUFFIX),
    "plain": PromptTemplate("plain", use_chat_template=False),
}


def resolve_template(
    preset: str,
    use_chat_template: bool | None = None,
    system_prompt: str | None = None,
    suffix: str | None = None,
) -> PromptTemplate:
    """A preset with the given overrides applied (None keeps the preset's value; "" clears a text field)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown prompt template {preset!r}; choose one of {sorted(PRESETS)}")
    overrides = {"use_chat_template": use_chat_template, "system_prompt": system_prompt, "suffix": suffix}
    return replace(PRESETS[preset], **{key: value for key, value in overrides.items() if value is not None})


def render_prompt(template: PromptTemplate, problem: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """The prompt text for one problem (before tokenization)."""
    user_text = problem + template.suffix
    if not template.use_chat_template:
        return f"{template.system_prompt}\n\n{user_text}" if template.system_prompt else user_text
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"template {template.name!r} uses a chat template but the tokenizer "
            f"{getattr(tokenizer, 'name_or_path', '')!r} has none: use `template: plain` or set "
            "`use_chat_template: false` for a base model"
        )
    messages = [{"role": "system", "content": template.system_prompt}] if template.system_prompt else []
    messages.append({"role": "user", "content": user_text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tokenize_prompts(
    template: PromptTemplate, problems: list[str], tokenizer: PreTrainedTokenizerBase
) -> list[list[int]]:
    """Token ids of each rendered prompt, unpadded, untruncated.

    A chat template writes its own special tokens, so none are added to it; plain prompts get the tokenizer's
    usual ones (e.g. a BOS token for Llama-style base models, nothing for Qwen).
    """
    texts = [render_prompt(template, problem, tokenizer) for problem in problems]
    encoded = tokenizer(texts, add_special_tokens=not template.use_chat_template, truncation=False)
    return [list(ids) for ids in encoded["input_ids"]]


def render_conversation(messages: tuple[dict, ...], tokenizer: PreTrainedTokenizerBase, where: str) -> str:
    """The prompt text of a conversational row: its turns as given, in the tokenizer's chat template, with the
    generation prompt (the prompt template's system prompt and suffix apply to text problems only).

    Raises:
        DataError naming the row (`where`) when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{where}: the row is a conversation (a list of role/content turns), but the tokenizer "
            f"{getattr(tokenizer, 'name_or_path', '')!r} has no chat template to render it with: use a model whose "
            "tokenizer has one, or give the problem as text"
        )
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def tokenize_queries(template: PromptTemplate, queries: list, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Token ids of each query's prompt: a text problem through `template` (`tokenize_prompts`), a conversation
    (`Query.messages`) through the tokenizer's chat template, with no special tokens added (the template writes
    them)."""
    ids: list[list[int] | None] = [None] * len(queries)
    texts = [i for i, query in enumerate(queries) if query.messages is None]
    encoded_texts = tokenize_prompts(template, [queries[i].problem for i in texts], tokenizer) if texts else []
    for i, encoded in zip(texts, encoded_texts, strict=True):
        ids[i] = encoded
    chats = [i for i, query in enumerate(queries) if query.messages is not None]
    rendered = [
        render_conversation(queries[i].messages, tokenizer, f"{queries[i].source} row {queries[i].row}") for i in chats
    ]
    if rendered:
        encoded = tokenizer(rendered, add_special_tokens=False, truncation=False)["input_ids"]
        for i, row_ids in zip(chats, encoded, strict=True):
            ids[i] = list(row_ids)
    return ids
