"""Structured output's pieces: the mask's bit layout on the logits, a guide's grammar over the embedded tokenizer."""

from __future__ import annotations

import pytest
import torch

from cluster.config import DEFAULT_MODEL
from workers.sampler import allow_only

pytest.importorskip("xgrammar", reason="xgrammar is not installed (it is in the 'serve' and 'test' extras)")


def test_allow_only_reads_token_t_at_bit_t_mod_32_of_word_t_div_32():
    logits = torch.randn(3, 70)
    words = torch.zeros(3, dtype=torch.int32)              # ⌈70 / 32⌉ words
    for t in (0, 31, 32, 69):
        words[t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)    # bit 31: a negative int32
    out = allow_only(logits, [None, words, None])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0, 31, 32, 69]
    assert torch.equal(out[1, [0, 31, 32, 69]], logits[1, [0, 31, 32, 69]])
    assert torch.isfinite(logits).all()                    # a copy: the step's logits are left as they were
    assert allow_only(logits, [None, None, None]) is logits


@pytest.fixture(scope="module")
def tok():
    from cluster.local import load_tokenizer

    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def guides(tok):
    from cluster.guided import Guides

    return Guides(tok, 6144, tok.eos_token_ids)


def allowed(guide) -> set[int]:
    words = guide.mask()
    return set(allow_only(torch.zeros(1, 6144), [words]).isfinite().nonzero()[:, 1].tolist())


SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def test_a_guide_allows_the_schema_then_only_stop_tokens(tok, guides):
    g = guides.guide(SCHEMA, tok.encode("hi"))
    first = allowed(g)
    assert first and all(tok.decode([t], skip_special_tokens=False).lstrip().startswith("{") or
                         not tok.decode([t], skip_special_tokens=False).strip() for t in first)
    assert tok.encode("{")[0] in first and tok.encode("[")[0] not in first
    g.accept(tok.encode('{"a": '))
    assert tok.encode('"')[0] not in allowed(g)            # an integer, not a string
    g.accept(tok.encode("12}"))
    assert allowed(g) == set(tok.eos_token_ids) and g.rejected == 0


def test_special_tokens_never_ride_inside_the_value(tok, guides):
    g = guides.guide('{"type": "object"}', tok.encode("hi"))
    g.accept(tok.encode('{"x": "'))                        # inside a string: text only
    inside = allowed(g)
    assert len(inside) > 1000 and not inside & set(tok.special_ids)


def test_a_prompt_opening_the_reasoning_is_free_until_it_closes(tok, guides):
    marks = tok.special_ids_by_token()
    g = guides.guide(SCHEMA, [*tok.encode("hi"), marks["<think>"]])
    assert g.mask() is None
    g.accept([*tok.encode("let me think [1, 2"), marks["</think>"]])
    assert g.rejected == 0 and tok.encode("{")[0] in allowed(g) and tok.encode("[")[0] not in allowed(g)
    closed = guides.guide(SCHEMA, [*tok.encode("hi"), marks["</think>"]])      # thinking off: constrained at once
    assert closed.mask() is not None


def test_a_schema_the_grammar_cannot_follow_is_a_value_error(guides, tok):
    from cluster.guided import check_schema

    with pytest.raises(ValueError, match='Unsupported type "objectx"'):
        check_schema('{"type": "objectx"}')
    with pytest.raises(ValueError, match="json_schema"):
        guides.guide('{"type": "objectx"}', tok.encode("hi"))



def test_a_vocabulary_that_is_not_byte_level_is_refused(tok):
    """xgrammar reads the vocabulary's strings as GPT-2's byte alphabet: another kind would be misread, so refused."""
    from cluster.guided import Guides

    class Metaspace:
        byte_level, special_ids = False, frozenset()

        def special_ids_by_token(self):
            return {}

        def vocab(self):
            return {"▁a": 0, "b": 1}
    with pytest.raises(ValueError, match="byte-level"):
        Guides(Metaspace(), 2, [1]).guide('{"type": "object"}', [0])


def test_a_prefix_allows_its_trie_then_nothing_more(tok, guides):
    """``forced_paths`` as a token trie: each mask is the node's children; once a path is out the guide is done (the
    output free); a prompt that opens the reasoning waits for its end first; a token off the trie counts, then frees."""
    marks = tok.special_ids_by_token()
    call, key, end = marks["<tool_call>"], marks["<arg_key>"], marks["</tool_call>"]
    add, adder = tok.encode("add"), tok.encode("adder")
    paths = [(call, *add, key), (call, *add, end), (call, *adder, key)]
    p = guides.prefix(paths, [*tok.encode("hi"), marks["<think>"]])
    assert p.mask() is None and not p.done
    p.accept([*tok.encode("hmm"), marks["</think>"]])
    assert allowed(p) == {call}
    p.accept([call])
    assert allowed(p) == {add[0], adder[0]}
    p.accept(add)
    assert {key, end} <= allowed(p) and not p.done
    p.accept([end])
    assert p.done and p.mask() is None and p.rejected == 0
    off = guides.prefix(paths, tok.encode("hi"))
    off.accept([call, key])                             # not a name: counted, and the output is free from there
    assert off.rejected == 1 and off.done
