import sys, time, json
sys.path.insert(0, '.')
from common import *
from cluster.guided import regex_grammar, ebnf_grammar, choice_grammar
from scheduler.scheduler import AdmissionError
eng, tok = engine()
prompt = tok.encode_chat([{"role": "user", "content": "x"}], enable_thinking=False)
cases = [
 ("ebnf", 'root ::= "ab" []'),
 ("ebnf", 'root ::= "a" x\nx ::= x "b"'),
 ("ebnf", 'root ::= x\nx ::= x'),
 ("ebnf", 'root ::= ""'),
 ("ebnf", 'root ::= [^\\x00-\\U0010FFFF]'),
 ("regex", 'a[^\\s\\S]'),
 ("regex", '[^\\s\\S]'),
 ("regex", '\\u0000{3}'),
 ("regex", '(a|b){1000000}'),
 ("regex", 'a{5,2}'),
 ("regex", '(?=a)b'),
 ("regex", '\\bfoo'),
 ("regex", 'x*'),
]
for kind, src in cases:
    t = time.time()
    try:
        g = regex_grammar(src) if kind == "regex" else ebnf_grammar(src)
        stage = "edge ok"
    except Exception as e:
        print(f"{kind} {src!r}: edge refuses: {str(e)[:90]} ({time.time()-t:.2f}s)"); continue
    try:
        o = run(eng, {"r": (prompt, SamplingParams(max_tokens=20, temperature=0.0, grammar=g))})["r"]
        r = f"ran: {o['reason']} {o['text']!r}"
    except AdmissionError as e:
        r = f"400 {e.field}: {str(e)[:80]}"
    except Exception as e:
        r = f"{type(e).__name__}: {str(e)[:80]}"
    print(f"{kind} {src!r}: {r} ({time.time()-t:.2f}s)", flush=True)
