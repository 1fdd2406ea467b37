import time, _s
from _s import *
_s.model(); _s.tok()
texts = ["The old man said unto the king", "In the beginning God created", "Python is a programming language that",
 "A hacker is a person who", "The perl interpreter reads", "And it came to pass, when"]
for k in (0,1,2,3):
    e = make_engine(k=k)
    t=time.time(); outs=[]
    for i,s in enumerate(texts):
        o = collect(e, {"a": (tok().encode(s), SamplingParams(max_tokens=64, temperature=0))})["a"]
        outs.append(o["tokens"])
        if k==0: print(o["reason"], len(o["tokens"]), repr(o["text"][:100]))
    print(k, time.time()-t, e.spec_metrics() if k else "", idle(e))
