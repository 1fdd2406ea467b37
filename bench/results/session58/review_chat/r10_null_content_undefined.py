"""Q1 (informational): the chat endpoint drops a message's null fields (cluster/protocol.py template_messages:
model_dump(exclude_none=True)), so a template sees `content` undefined where transformers passes None. GLM-4.5-era
templates' visible_text ends in `{%- else -%}{{- content }}`: transformers writes the literal "None" before the calls
of an assistant turn with content null; glmserve writes nothing. (glmserve's prompt is arguably the better one, but it
is not transformers' — the question is which one the checkpoint was trained on.)"""
import json

import _h

T = r"""[gMASK]<sop>
{%- macro visible_text(content) -%}
    {%- if content is string -%}{{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}{%- if item is mapping and item.type == 'text' -%}{{- item.text }}{%- endif -%}{%- endfor -%}
    {%- else -%}{{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}<|assistant|></think>{{ visible_text(m.content) }}
{%- for tc in m.tool_calls or [] -%}<tool_call>{{ tc.function.name }}</tool_call>{%- endfor -%}
{%- elif m.role == 'tool' -%}<|observation|><tool_response>{{ visible_text(m.content) }}</tool_response>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|><think>{%- endif -%}"""
MODEL = _h.model_dir(template=T)
ing = _h.ingress(MODEL)
msgs = [{"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "run", "arguments": json.dumps({})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
_h.compare(ing, "assistant content null before its calls (GLM-4.5-era visible_text)", {"messages": msgs}, msgs, MODEL)
_h.done()
