"""Train the tiny model's byte-level BPE tokenizer and write its HF tokenizer files.

Reads the corpus built by ``tools/corpus.py`` and writes ``tokenizer.json`` and
``tokenizer_config.json`` (with the GLM-5 chat template) into ``--out``. The
special tokens come first, so they get ids 0..32 in the order of
``SPECIAL_TOKENS``; the 256 byte symbols follow, then the learned merges.

Usage: ``python tools/train_tokenizer.py --corpus data/corpus/train.txt --out models/tiny``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 6144  # including the special tokens

# GLM-4.5/GLM-5 special tokens (GLM's own order, minus the GLM-4.5-only "/nothink").
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|image|>",
    "<|video|>",
)
EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "[gMASK]"  # GLM's "bos": every prompt starts with [gMASK]<sop>
# A reply ends when the model starts the next turn: the user's, or a tool result.
STOP_TOKENS = ("<|user|>", "<|observation|>")

# GLM-5 convention (same as GLM-4.7): no newline after a role token; the assistant turn
# opens with <think>reasoning</think> (thinking on) or a bare </think> (thinking off, or a
# past turn whose reasoning is dropped); reasoning is kept only for turns after the last
# user message. The generation prompt is <|assistant|><think> by default and
# <|assistant|></think> with enable_thinking=false.
CHAT_TEMPLATE = """\
[gMASK]<sop>
{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content -%}
            {%- if part is mapping and part.type == 'text' -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception((part.type if part is mapping else 'non-dict') ~ ' content parts are not supported') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>...</tool_call>
{%- endif -%}
{%- set ns = namespace(last_user_index=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}{%- set ns.last_user_index = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {{- '<|system|>' + text_of(m.content) -}}
    {%- elif m.role == 'user' -%}
        {{- '<|user|>' + text_of(m.content) -}}
    {%- elif m.role == 'assistant' -%}
        {%- set content = text_of(m.content) -%}
        {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
        {%- if not reasoning and '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1] -%}
        {%- endif -%}
        {{- '<|assistant|>' -}}
        {%- if loop.index0 > ns.last_user_index and reasoning.strip() -%}
            {{- '<think>' + reasoning.strip() + '</think>' -}}
        {%- else -%}
            {{- '</think>' -}}
        {%- endif -%}
        {{- content.strip() -}}
        {%- for tc in m.tool_calls or [] -%}
            {%- set fn = tc.function if tc.function is defined else tc -%}
            {%- if fn.arguments is string -%}
                {{- raise_exception('tool call arguments must be a mapping, not a JSON string') -}}
            {%- endif -%}
            {{- '<tool_call>' + fn.name -}}
            {%- for key, value in (fn.arguments or {}).items() -%}
                {{- '<arg_key>' + key + '</arg_key><arg_value>' -}}
                {{- value if value is string else value | tojson(ensure_ascii=False) -}}
                {{- '</arg_value>' -}}
            {%- endfor -%}
            {{- '</tool_call>' -}}
        {%- endfor -%}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|observation|>' -}}
        {%- endif -%}
        {{- '<tool_response>' + text_of(m.content) + '</tool_response>' -}}
    {%- else -%}
        {{- raise_exception('unknown message role: ' ~ m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' + ('</think>' if enable_thinking is defined and not enable_thinking else '<think>') -}}
{%- endif -%}
"""


def train(corpus: Path, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(corpus)], trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == i, token
    return tokenizer


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,  # the chat template writes [gMASK]<sop> itself
        "stop_tokens": list(STOP_TOKENS),  # read by models/tokenizer.py: eos_token_ids = (eos, *stop_tokens)
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus/train.txt"))
    parser.add_argument("--out", type=Path, default=Path("models/tiny"))
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    tokenizer = train(args.corpus, args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    )
    print(f"vocab_size={tokenizer.get_vocab_size()} specials={len(SPECIAL_TOKENS)} -> {args.out}")


if __name__ == "__main__":
    main()
