"""Incremental detokenizer and stop strings, on a tiny byte-level BPE trained in the test."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cluster.detok import IncrementalDetokenizer, StopStringMatcher

CORPUS = (
    "héllo wörld 你好 🙂 café. The quick brown fox jumps over the lazy dog. "
    "Naïve façade, smörgåsbord, jalapeño; 今天天气很好 🚀🎉 — stop here END or not. "
) * 3
SAMPLE = "héllo wörld 你好 🙂 café! 今天 🚀 naïve END façade 🎉🎉 smörgåsbord"
EOS = "<eos>"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOS],
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS], trainer)
    return tokenizer


def _decode(tok: Tokenizer):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def _stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    deltas = [detok.add(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    return deltas + [detok.flush()]


def test_tokenizer_really_splits_multibyte_chars(tok):
    pieces = [tok.decode([i]) for i in tok.encode(SAMPLE).ids]
    assert any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_streaming_matches_full_decode_without_replacement_chars(tok, chunk):
    ids = tok.encode(SAMPLE).ids
    detok = IncrementalDetokenizer(_decode(tok))
    deltas = _stream(detok, ids, chunk)
    assert "".join(deltas) == SAMPLE == detok.text
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d) > len(ids) // (2 * chunk)  # text flows while streaming


def test_prompt_is_context_only_and_special_tokens_vanish(tok):
    prompt_ids = tok.encode("Naïve 你").ids
    ids = tok.encode("好 🙂 café").ids + [tok.token_to_id(EOS)]
    detok = IncrementalDetokenizer(_decode(tok), prompt_ids)
    deltas = _stream(detok, ids)
    assert detok.text == "好 🙂 café"
    assert deltas[-2:] == ["", ""]  # the eos id decodes to nothing, flush has nothing held


def test_decode_window_stays_small(tok):
    calls: list[int] = []

    def decode(ids: list[int]) -> str:
        calls.append(len(ids))
        return tok.decode(ids)

    ids = tok.encode(SAMPLE * 8).ids
    detok = IncrementalDetokenizer(decode, prompt_ids=tok.encode(CORPUS).ids)
    _stream(detok, ids)
    assert detok.text == SAMPLE * 8
    assert max(calls) <= 8  # window = a few ids around a multibyte char, not the whole output


def test_flush_releases_an_invalid_tail(tok):
    first_byte = tok.encode("你").ids[:1]  # the 3-byte char needs more than this id
    assert tok.decode(first_byte).endswith("\ufffd")
    detok = IncrementalDetokenizer(_decode(tok))
    assert detok.add(tok.encode("ok ").ids) == "ok "
    assert detok.add(first_byte) == ""
    assert detok.flush() == "\ufffd"
    assert detok.text == "ok \ufffd"


def test_stop_straddling_tokens_is_trimmed_and_prior_text_emitted_once(tok):
    ids = tok.encode(SAMPLE).ids
    detok = IncrementalDetokenizer(_decode(tok))
    matcher = StopStringMatcher(["END"])
    emitted, stopped = [], False
    for tid in ids:
        out, stopped = matcher.feed(detok.add([tid]))
        emitted.append(out)
        if stopped:
            break
    assert stopped
    assert "".join(emitted) == SAMPLE[: SAMPLE.index("END")]
    assert matcher.feed("more") == ("", True) and matcher.flush() == ""


def test_stop_split_across_deltas():
    matcher = StopStringMatcher(["</s>"])
    assert matcher.feed("abc<") == ("abc", False)
    assert matcher.feed("/") == ("", False)
    assert matcher.feed("s>tail") == ("", True)


def test_a_kept_stop_string_ends_the_text_even_split_across_deltas():
    """vLLM's include_stop_str_in_output: the text ends after the stop string (the earliest one), not before."""
    matcher = StopStringMatcher(["</s>", "END"], keep=True)
    assert matcher.feed("abc<") == ("abc<", False)      # nothing held back: the text out is the same either way
    assert matcher.feed("/") == ("/", False)
    assert matcher.feed("s>tail END") == ("s>", True) and matcher.matched == "</s>"
    assert matcher.flush() == ""
    assert StopStringMatcher(["lo w", "world"], keep=True).feed("hello world") == ("hello w", True)
    unarmed = StopStringMatcher(["ab"], keep=True)
    assert unarmed.feed("xa", armed=False) == ("xa", False) and unarmed.feed("b!") == ("b", True)   # ends armed
    late = StopStringMatcher(["ab"], keep=True)
    assert late.feed("ab", armed=False) == ("ab", False) and late.feed("cab") == ("cab", True)     # the next one


def test_held_partial_prefix_that_is_not_a_stop_is_emitted():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("go ST") == ("go ", False)
    assert matcher.feed("O") == ("", False)
    assert matcher.feed("RM!") == ("STORM!", False)
    assert matcher.feed("x S") == ("x ", False)
    assert matcher.flush() == "S"


def test_earliest_of_several_stops_wins():
    matcher = StopStringMatcher(["world", "lo w"])
    out = [matcher.feed(c) for c in "hello world"]
    assert "".join(text for text, _ in out) == "hel"
    assert out[-1][1] and sum(stopped for _, stopped in out) == len("hello world") - 6
    assert StopStringMatcher(["b", "a"]).feed("xxabxx") == ("xx", True)
    assert StopStringMatcher(["cd", "abcdef"]).feed("abcdef") == ("", True)


def test_no_stops_passes_text_through():
    matcher = StopStringMatcher([])
    assert matcher.feed("anything") == ("anything", False)
    assert matcher.flush() == ""
    with pytest.raises(ValueError):
        StopStringMatcher([""])


def test_no_stop_ends_in_unarmed_text_but_one_may_start_there():
    """``armed`` False (an output short of its min_tokens, as vLLM counts): a stop string wholly inside it does not
    stop the text, one that starts there and ends in an armed delta does (cut where it starts), and a short stop
    inside the text held back then does not match later."""
    m = StopStringMatcher([" LORD"])
    assert m.feed(", the LORD", armed=False) == (", the LORD", False)
    assert m.feed(" and", armed=False) == (" and", False)
    assert m.feed(" LO", armed=False) == ("", False)                   # held: a stop's possible start
    assert m.feed("RD said") == ("", True) and m.matched == " LORD"
    m = StopStringMatcher(["ab", "abcdef"])
    assert m.feed("xabcd", armed=False) == ("x", False)                # "abcd" held for "abcdef"; "ab" inside it
    assert m.feed("zab") == ("abcdz", True) and m.matched == "ab"      # the "ab" that ends past it stops the text


@pytest.mark.parametrize("keep", [False, True])
def test_a_long_stop_string_met_a_character_at_a_time(keep):
    """A stop string longer than 3 characters whose text comes a character a token (or none: a token inside a UTF-8
    character), with and without include_stop_str_in_output (session 57's stream review: kept, the held tail shrank
    and the stop was never seen)."""
    m = StopStringMatcher(["abcd"], keep=keep)
    out = [m.feed(c) for c in ["x", "y", "", "a", "b", "", "c", "d", "z"]]
    assert [stopped for _, stopped in out] == [False] * 7 + [True, True] and m.matched == "abcd"
    assert "".join(text for text, _ in out) == ("xyabcd" if keep else "xy")


@pytest.mark.parametrize("keep", [False, True])
def test_a_stop_string_inside_unarmed_text_does_not_match_a_step_later(keep):
    """``min_tokens``: "a" ends in the unarmed text, and the held tail (a possible start of "a b c") still holds it
    when the next, armed, text comes — it must not stop the output then (session 57's review)."""
    m = StopStringMatcher(["a", "a b c"], keep=keep)
    out = [m.feed("a", armed=False), m.feed(" "), m.feed("x"), m.feed(" a")]
    if keep:
        assert out == [("a", False), (" ", False), ("x", False), (" a", True)] and m.matched == "a"
    else:
        assert out == [("", False), ("", False), ("a x", False), (" ", True)] and m.matched == "a"


def test_byte_detokenizer_is_the_whole_decode_and_holds_nothing_it_cannot_complete():
    """GLM's byte-level BPE streams through ``ByteDetokenizer`` (``TextOf.stream``): for random ids — bytes that split
    characters or never make one, special tokens — the deltas add up to ``decode(ids)``, each id's bytes are read
    once (O(1) a token: the window method decoded a growing window every step while its text ended in U+FFFD), and a
    byte that can never belong to a character is out at once."""
    import random

    from cluster.config import DEFAULT_MODEL
    from cluster.detok import ByteDetokenizer, TextOf
    from cluster.local import load_tokenizer

    tok = load_tokenizer(DEFAULT_MODEL)
    text_of = TextOf(tok)
    reads = []
    text_of.token_bytes = lambda t, read=text_of.token_bytes: reads.append(t) or read(t)
    high = [i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80]
    bytes_ = [tok.encode(c)[0] for c in ("a", "b")] + high
    rng = random.Random(0)
    for _ in range(200):
        pool = (bytes_, range(tok.vocab_size), sorted(tok.special_ids))
        ids = [rng.choice(pool[rng.choices((0, 1, 2), (6, 3, 1))[0]]) for _ in range(rng.randrange(1, 40))]
        detok = text_of.stream([5, 6])
        assert isinstance(detok, ByteDetokenizer)
        reads.clear()
        deltas, at = [], 0
        while at < len(ids):
            step = rng.randrange(1, 4)
            deltas.append(detok.add(ids[at:at + step]))
            at += step
        assert "".join(deltas) + detok.flush() == tok.decode(ids, skip_special_tokens=True) == detok.text, ids
        assert len(reads) == sum(t not in tok.special_ids for t in ids)
    lone = next(i for i in bytes_ if 0x80 <= tok.token_bytes(i)[0] < 0xc0)   # a continuation byte alone: no char
    assert text_of.stream([]).add([lone] * 3) == "\ufffd" * 3
