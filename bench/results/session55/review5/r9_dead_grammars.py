"""Grammars that can never complete: Guides.guide refuses only one that allows no token at all at the start (`empty`).
One that allows only the stop tokens at the start (a JSON schema {"anyOf": []}: no JSON text is empty) or that reaches a
dead end after some text (EBNF root ::= "ab" [], regex a[^\\s\\S], a left-recursive rule) is admitted, and the output ends
at the dead end with finish_reason "stop" -- text the grammar does not match. Expected: a 400 naming the field (as for
root ::= x / x ::= x, which is refused), or at least not "stop"."""
import json
import re

from common import SamplingParams, check, done, engine, run

from cluster.guided import ebnf_grammar, regex_grammar
from scheduler.scheduler import AdmissionError

CASES = {
    'json_schema {"anyOf": []}': (dict(json_schema=json.dumps({"anyOf": []})), lambda s: False),
    'ebnf root ::= "ab" []': (dict(grammar=ebnf_grammar('root ::= "ab" []')), lambda s: False),
    'ebnf root ::= "a" x / x ::= x "b"': (dict(grammar=ebnf_grammar('root ::= "a" x\nx ::= x "b"')), lambda s: False),
    "regex a[^\\s\\S]": (dict(grammar=regex_grammar(r"a[^\s\S]")), lambda s: re.fullmatch(r"a[^\s\S]", s)),
    "(control) ebnf root ::= x / x ::= x": (dict(grammar=ebnf_grammar("root ::= x\nx ::= x")), lambda s: False),
}


def main():
    eng, tok = engine()
    prompt = tok.encode_chat([{"role": "user", "content": "x"}], enable_thinking=False)
    for name, (kw, matches) in CASES.items():
        try:
            o = run(eng, {"r": (prompt, SamplingParams(max_tokens=20, temperature=0.0, **kw))})["r"]
        except AdmissionError as e:
            check(True, f"{name}: 400 {e.field}: {e}")
            continue
        check(o["reason"] != "stop" or bool(matches(o["text"])),
              f"{name}: admitted; finish_reason {o['reason']!r} on {o['text']!r}, which the grammar does not match")
    check(not eng._guides, "guides dropped")
    done()


if __name__ == "__main__":
    main()
