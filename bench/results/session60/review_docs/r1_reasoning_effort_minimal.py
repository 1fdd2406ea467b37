"""README.md:39 says `reasoning_effort` "none" turns thinking off and "other values reach the chat template".
cluster/protocol.py (ChatCompletionRequest.template_kwargs) turns thinking off for "minimal" too, and "minimal" never
reaches the template. Exit 1 while README names only "none" and the code treats "minimal" the same way.
Run from the repository root: .venv/bin/python bench/results/session60/review_docs/r1_reasoning_effort_minimal.py"""
import re
import sys
from pathlib import Path

from cluster.protocol import ChatCompletionRequest

root = Path(__file__).resolve().parents[4]
readme = (root / "README.md").read_text()
claim = re.search(r"`reasoning_effort`[^.]*?turns thinking off[^.;]*", readme)
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
kw = ChatCompletionRequest.model_validate({**body, "reasoning_effort": "minimal"}).template_kwargs()
off = kw.get("enable_thinking") is False and "reasoning_effort" not in kw
print("README:", claim.group(0) if claim else None)
print("code: reasoning_effort 'minimal' ->", kw)
if claim and off and "minimal" not in claim.group(0):
    print("WRONG: README says only \"none\" turns thinking off; \"minimal\" does too and does not reach the template")
    sys.exit(1)
print("ok")
