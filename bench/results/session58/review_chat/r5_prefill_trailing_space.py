"""Q1: continue_final_message (vLLM's, and /v1/messages' last-assistant prefill): transformers renders the final
message with a tag and cuts the prompt right after the message's own text, so a prefill that ends in a newline or
indent is continued as given. glmserve only renders with add_generation_prompt false (cluster/serve.py _chat_ids;
protocol.py continue_final_message is only validated), so a template that strips assistant content (every GLM
template: content.strip()) eats the prefill's trailing whitespace — the model continues after "```python" instead of
after "```python\\n"."""
import _h

ing = _h.ingress()
for prefill in ("```python\n", "def f(x):\n    ", "Sure, here is the plan:\n\n1."):
    msgs = [{"role": "user", "content": "write f"}, {"role": "assistant", "content": prefill}]
    _h.compare(ing, f"chat prefill {prefill!r}", {"messages": msgs, "add_generation_prompt": False,
                                                   "continue_final_message": True}, msgs, _agp=False, _cfm=True)
# the Messages API's prefill goes the same way (its last assistant message)
ids, err = _h.messages_ids(ing, {"max_tokens": 64, "messages": [{"role": "user", "content": "write f"},
                                                                {"role": "assistant", "content": "```python\n"}]})
ref, text = _h.hf_ids([{"role": "user", "content": "write f"}, {"role": "assistant", "content": "```python\n"}],
                      add_generation_prompt=False, continue_final_message=True, enable_thinking=False)
_h.check(ids == ref, f"/v1/messages prefill '```python\\n': glmserve {_h.text_of(ids) if ids else err!r} vs "
         f"transformers {text!r}")
_h.done()
