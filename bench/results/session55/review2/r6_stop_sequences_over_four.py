"""stop_sequences goes to the chat's `stop`, which keeps OpenAI's bound of 4 strings (protocol.py:132-135): a Messages
request with 5 stop sequences is a 400 whose message names the chat's rule ("stop takes at most 4"). Anthropic
documents no such bound for stop_sequences (its API reference gives none; OpenAI's "up to 4" is the chat's). The test
suite asserts this 400 (tests/unit/test_anthropic.py), so it is a deliberate choice: reported as a risk, with the
wording. Exits 1 while 5 stop sequences are refused."""
from _h2 import ApiError, anth_req, check, done

try:
    chat = anth_req(stop_sequences=["\n\nHuman:", "</answer>", "END", "STOP", "###"]).to_chat()
    print("accepted: stop =", chat.stop)
    err = None
except ApiError as e:
    err = e
    print(f"ApiError {e.status} param={e.param}: {e.message}")
check(err is None, "5 stop_sequences accepted (Anthropic states no bound of 4)")
done()
