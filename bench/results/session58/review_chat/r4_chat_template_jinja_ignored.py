"""Q1: where a checkpoint ships its template as chat_template.jinja (how transformers >= 4.43 saves it, and how the
GLM-4.5 ... GLM-5.x checkpoints ship it), transformers' AutoTokenizer reads it; glmserve's Tokenizer.from_dir reads only
tokenizer_config.json's "chat_template" (models/tokenizer.py from_dir / __init__): every chat request is then a 400 (no
template), or, where tokenizer_config.json still holds an older template, rendered with the wrong one."""
import os

import _h

TINY_T = open(os.path.join(_h.TINY, "tokenizer_config.json")).read()
import json  # noqa: E402

tiny_template = json.loads(TINY_T)["chat_template"]
msgs = [{"role": "user", "content": "hi"}]

# (a) template only in chat_template.jinja
only_file = _h.model_dir(jinja_file=tiny_template, keep_config_template=False)
ing = _h.ingress(only_file)
ids, err = _h.chat_ids(ing, {"messages": msgs})
ref, text = _h.hf_ids(msgs, model=only_file)
_h.check(ids == ref, f"template only in chat_template.jinja: glmserve {'ids' if ids else err} vs transformers "
         f"{len(ref)} ids ({text!r})")

# (b) both: the .jinja file is the one transformers uses
other = tiny_template.replace("<|user|>", "<|user|>\n")
both = _h.model_dir(jinja_file=other)
ing = _h.ingress(both)
ids, err = _h.chat_ids(ing, {"messages": msgs})
ref, text = _h.hf_ids(msgs, model=both)
_h.check(ids == ref, f"chat_template.jinja beside an older tokenizer_config template: glmserve "
         f"{_h.text_of(ids) if ids else err!r} vs transformers {text!r}")
_h.done()
