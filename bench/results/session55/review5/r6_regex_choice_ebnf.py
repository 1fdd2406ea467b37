"""vLLM's structured_outputs regex / choice / grammar (cluster/guided.py regex_grammar, choice_grammar, ebnf_grammar):
every "stop" output fully matches (Python re / one of the choices / a Python check of the EBNF), every token replays
through a fresh matcher; plain, seeded, MTP k=2, look-ahead, after a thinking budget."""
import re

from common import SamplingParams, check, done, engine, replay, run

from cluster.guided import choice_grammar, ebnf_grammar, regex_grammar

CHOICES = ["a\"b", "\\", "é", "x\ny", "<think>", "yes", "yes please", "{\"k\": 1}"]
CASES = {
    "regex digits": (regex_grammar(r"\d{3}-[a-z]{2,4}"), lambda s: re.fullmatch(r"\d{3}-[a-z]{2,4}", s)),
    "regex hex escape": (regex_grammar(r"[\x41-\x43]{2}\x2e"), lambda s: re.fullmatch(r"[A-C]{2}\.", s)),
    "regex unicode": (regex_grammar(r"(é|ü)+!"), lambda s: re.fullmatch(r"(é|ü)+!", s)),
    "regex alternation": (regex_grammar(r"(yes|no|maybe)"), lambda s: s in ("yes", "no", "maybe")),
    "regex anchored": (regex_grammar(r"^[a-z]{1,5}$"), lambda s: re.fullmatch(r"[a-z]{1,5}", s)),
    "choice": (choice_grammar(CHOICES), lambda s: s in CHOICES),
    "ebnf list": (ebnf_grammar('root ::= "[" num ("," num)* "]"\nnum ::= [0-9]+'),
                  lambda s: re.fullmatch(r"\[[0-9]+(,[0-9]+)*\]", s)),
}


def main():
    plain, tok = engine()
    end = tok.special_ids_by_token()["</think>"]
    chat = tok.encode_chat([{"role": "user", "content": "Answer."}], enable_thinking=False)
    think = tok.encode_chat([{"role": "user", "content": "Answer."}])
    modes = [("greedy", dict(temperature=0.0)), ("s1", dict(temperature=1.0, seed=1)), ("s2", dict(temperature=1.0, seed=2)),
             ("think", dict(temperature=0.0, thinking_budget=2))]
    import xgrammar
    compiled = plain.guides._compiled_grammar(CASES["choice"][0])
    for text in CHOICES + ["yes please!", "a\\\"b", "x\\ny", "é "]:
        m = xgrammar.GrammarMatcher(compiled)
        took = all(m.accept_token(t) for t in tok.encode_pieces([(text, True)])) and m.accept_token(0) and m.is_terminated()
        check(took == (text in CHOICES), f"choice matcher {'takes' if took else 'refuses'} {text!r}")
    for ename, eng in [("plain", plain), ("k2", engine(speculative_tokens=2)[0]), ("eager", engine(cuda_graphs="eager")[0])]:
        for name, (grammar, ok) in CASES.items():
            compiled = eng.guides._compiled_grammar(grammar)
            for mode, kw in modes:
                prompt = think if mode == "think" else chat
                o = run(eng, {"r": (prompt, SamplingParams(max_tokens=40, grammar=grammar, **kw))})["r"]
                bad, _ = replay(eng, compiled, o["ids"], skip_until=end if mode == "think" else None)
                tag = f"{ename} {name} {mode}"
                check(bad == -1 and o["error"] is None, f"{tag}: {len(o['ids'])} tokens allowed ({bad}), {o['reason']}")
                if o["reason"] == "stop":
                    ids = o["ids"][o["ids"].index(end) + 1:] if mode == "think" else o["ids"]
                    text = tok.decode(ids, skip_special_tokens=True)
                    check(bool(ok(text)), f"{tag}: stop output {text!r} matches")
        check(not eng._guides, f"{ename}: guides dropped")
    done()


if __name__ == "__main__":
    main()
