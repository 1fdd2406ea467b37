"""sglang #37645 (and vLLM #54744's direction): the GLM template opens the thought (<|assistant|><think>), the model skips
thinking, writes its answer and stops on EOS without ever writing </think>.
Observed vs expected:
  A. thinking on, answer + EOS, no </think>: expected the answer as `content` (sglang PR #37644: a template-opened
     thought that ends on EOS is the answer); a max_tokens cut (finish_reason length) stays reasoning.
Informational (printed, not asserted):
  B. enable_thinking false (prompt ends in </think>, so the split starts in content) and the model still writes
     "thought</think>answer": what comes out.
  C. how the split's start is decided from the real template's prompt (enable_thinking true / false).
Exits non-zero when A puts the whole answer in reasoning_content."""
import types

from _harness import EOS, SP, TOK, enc, run_variants, show

from cluster.serve import _TURNS, OpenAIIngress

failed = []
answer = "The capital of France is Paris."
out = run_variants(enc(answer) + [EOS], thinking=True, tools=True)
print("=== A. thinking on, no </think>, EOS"); show(out)
for v, (w, s) in out.items():
    for label, view in (("whole", w), ("streamed", s)):
        if view["content"] != answer:
            failed.append(f"A / {v} / {label}: content {view['content']!r}, reasoning_content "
                          f"{view['reasoning']!r}, finish_reason {view['finish_reason']}")
cut = run_variants(enc(answer), thinking=True, tools=True, ks=(0,))    # cut by max_tokens: finish_reason length
print("=== A'. thinking on, no </think>, cut by max_tokens (reasoning is right here)"); show(cut)

out = run_variants(enc("Let me think.") + [SP["</think>"]] + enc(answer) + [EOS], thinking=False, tools=True)
print("=== B. enable_thinking false, the model writes a thought and </think> anyway"); show(out)

ingress = types.SimpleNamespace(think_start=SP["<think>"], think_end=SP["</think>"], turn_ids={SP[t] for t in _TURNS})
for kw in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
    ids = TOK.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True, **kw)
    print(f"=== C. {kw or 'default'}: prompt ends {TOK.decode(ids[-2:], skip_special_tokens=False)!r} -> split starts "
          f"in {'reasoning' if OpenAIIngress._thinking(ingress, ids) else 'content'}")
ids = TOK.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=False)[:-1] + \
    [SP["<think>"]]         # a template that ignores enable_thinking false (vLLM #54744's): the prompt opens the thought
print(f"=== C'. enable_thinking false sent, prompt still ends '<|assistant|><think>' -> split starts in "
      f"{'reasoning' if OpenAIIngress._thinking(ingress, ids) else 'content'} (decided by the prompt, not the flag)")
print("\n".join(failed) or "OK")
assert not failed
