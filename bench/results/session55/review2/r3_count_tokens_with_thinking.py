"""POST /v1/messages/count_tokens takes no max_tokens (Anthropic's count_tokens body: model, messages, system, tools,
tool_choice, thinking ...). CountTokensRequest defaults max_tokens to 1, and serve._parse runs the Messages request's
check_supported on it — whose `thinking: enabled` rule wants budget_tokens < max_tokens. So counting the tokens of any
request with thinking enabled (what a client that uses extended thinking sends) is a 400.
Exits 1 while that is so."""
from _h2 import ApiError, check, done

from cluster.anthropic import CountTokensRequest

body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 2048}}
req = CountTokensRequest.model_validate(body)
try:
    req.check_supported()          # as serve._parse does (cluster/serve.py:536)
    chat = req.to_chat()
    print("counted as chat:", chat.template_messages(), "template kwargs:", chat.template_kwargs())
    err = None
except ApiError as e:
    err = e
    print(f"ApiError {e.status} param={e.param}: {e.message}")
check(err is None, "count_tokens with thinking enabled (budget 2048, no max_tokens) is accepted, as Anthropic's")
plain = CountTokensRequest.model_validate({**body, "thinking": {"type": "disabled"}})
plain.check_supported()
check(plain.to_chat() is not None, "count_tokens without thinking is accepted")
done()
