"""The offline tools that build ``models/tiny``, part 1: the corpus builder (``tools/corpus.py``) and the tokenizer
trainer (``tools/train_tokenizer.py``). Nothing here downloads: the extractors read small synthetic package trees laid
out as the Debian packages are, ``build`` runs with a ``fetch`` that unpacks such trees instead of calling apt-get."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models.config import ModelConfig
from models.tokenizer import Tokenizer
from tools import corpus
from tools import train_tokenizer as tt
from tools.train_tiny import EOS_ID, TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "tiny"


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return root


# ---- text normalisation ----------------------------------------------------------------------------------------------
def test_normalize_line_is_nfc_with_whitespace_collapsed():
    assert corpus.normalize_line("  Cafe\u0301  au\tlait\u00a0\u00a0noir  ") == "Caf\u00e9 au lait noir"
    assert corpus.normalize_line("a\x01b\x7fc\x1bd") == "a b c d"                   # control characters -> spaces
    assert corpus.normalize_line("b\x08bo\x08ol\x08ld _\x08u") == "bold u"           # overstrike: the last char wins
    assert corpus.normalize_line("\t \u00a0") == ""


def test_is_prose_counts_words_and_letters():
    assert corpus.is_prose("three real words")
    assert not corpus.is_prose("two words")
    assert corpus.is_prose("two words", min_words=2)
    assert not corpus.is_prose("five real words here", min_words=5)
    # letters must be at least 60 % of the visible characters: 6 of 10 passes, 5 of 10 does not
    assert corpus.is_prose("ab cd ef 1234")
    assert not corpus.is_prose("ab cd e 12345")
    assert not corpus.is_prose("|---|---|---|---| table row |")


def test_split_blocks_and_unwrap():
    text = "first  line\n\tindented\n   \nsecond block\n\n\n  third\n  block  \n"
    blocks = corpus.split_blocks(text)
    assert blocks == [["first  line", "        indented"], ["second block"], ["  third", "  block"]]
    assert corpus.split_blocks("") == [] and corpus.split_blocks("\n \n\t\n") == []
    assert corpus.split_blocks("no newline at the end") == [["no newline at the end"]]
    assert corpus.unwrap(blocks[0]) == "first line indented"
    assert corpus.unwrap(["  wrapped", "   across\tlines "]) == "wrapped across lines"


# ---- reStructuredText ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, clean", [
    (":func:`os.path.join` joins", "os.path.join joins"),
    (":meth:`~dict.get` and :class:`!Foo`", "dict.get and Foo"),
    (":ref:`the tutorial <tut-intro>` says", "the tutorial says"),
    ("See `Python <https://python.org>`_ and `PEP 8 <https://peps.org/8>`__ now", "See Python and PEP 8 now"),
    ("``x + 1`` is `interpreted` and `a title`_", "x + 1 is interpreted and a title"),
    ("*emphasis* and **strong** text", "emphasis and strong text"),
    ("2 * 3 * 4 and a*b*c stay", "2 * 3 * 4 and a*b*c stay"),
    ("the |version| here", "the version here"),
    ("escaped\\ text and a\\*b", "escapedtext and a*b"),
])
def test_clean_rst_inline(raw, clean):
    assert corpus.clean_rst_inline(raw) == clean


RST = """\
Title of the page
=================

.. _a-label:

This is the first paragraph of prose, wrapped
across two lines with :func:`len` in it.

Example::

    print("this is code and must not appear")
    more code here

After the code block there is more prose to keep here.

The next example shows the usage of the thing::

   >>> code_again()


.. code-block:: python

   import this_is_code_too

.. note:: A note that starts on the directive line itself
   and goes on for a while here.

.. versionadded:: 3.11
   Added in this version to do the things it does well.

.. toctree::
   :maxdepth: 2

   some/page

   another/page that is a toctree entry not prose at all

* A bullet item that has enough words to be prose.

#. An enumerated item that has enough words as well.

2. A numbered item also has enough words to be kept.

>>> print("a doctest line with several words")

+------+------+
| a    | b    |
+------+------+

A heading that has more than six words in it
---------------------------------------------

:param x: a field list entry with plenty of words.

Too short to keep.
"""


def test_rst_paragraphs_keep_prose_only():
    # Dropped: the heading, the label, "Example::" (its code skipped; "Example:" is too short), the code-block and
    # toctree bodies, the doctest, the table, the field list and the short last line. Kept: the note's lead text
    # and the versionadded body (prose directives), list items without their markers.
    assert list(corpus.rst_paragraphs(RST)) == [
        "This is the first paragraph of prose, wrapped across two lines with len in it.",
        "After the code block there is more prose to keep here.",
        "The next example shows the usage of the thing:",
        "A note that starts on the directive line itself and goes on for a while here.",
        "Added in this version to do the things it does well.",
        "A bullet item that has enough words to be prose.",
        "An enumerated item that has enough words as well.",
        "A numbered item also has enough words to be kept.",
    ]


# ---- POD -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, clean", [
    ("B<bold> I<italic> C<code> F<file.pl> S<no break>", "bold italic code file.pl no break"),
    ("C<< $a->b >> and C<<< $x <=> $y >>>", "$a->b and $x <=> $y"),
    ("E<lt>tagE<gt> E<verbar> E<sol> E<eacute> E<65>", "<tag> | / \u00e9 A"),
    ("E<0x41>E<0X62> E<0101>", "Ab A"),                                 # perlpodspec's hex and octal too
    ("B<I<nested>> codes", "nested codes"),
    ("L<the docs|perlfunc> L<perlfunc/\"open\"> L</SYNOPSIS> L<perlvar>", "the docs open SYNOPSIS perlvar"),
    ("L<https://www.perl.org/>", "https://www.perl.org/"),
    ("X<index entry>Z<>text stays", "text stays"),
    ("&amp; entities too", "& entities too"),
])
def test_clean_pod_inline(raw, clean):
    assert corpus.clean_pod_inline(raw) == clean


POD = """\
=head1 NAME

perlthing - a thing

=head1 DESCRIPTION

This paragraph of ordinary text has B<markup>
that spans two lines of the file.

    my $verbatim = "code that must not appear";

=begin html

<p>This html paragraph is inside a begin block.</p>

<p>And so is this second html paragraph of the block.</p>

=end html

=over 4

=item * an item line

The item's body is ordinary text with enough words.

=back

Short one.
"""


def test_pod_paragraphs_keep_ordinary_text():
    assert list(corpus.pod_paragraphs(POD)) == [
        "This paragraph of ordinary text has markup that spans two lines of the file.",
        "The item's body is ordinary text with enough words.",
    ]


# ---- the held-out split ----------------------------------------------------------------------------------------------
def test_is_heldout_is_the_sha1_prefix_rule():
    ids = [f"doc{i}" for i in range(4000)]
    for doc in ids[:200]:
        digest = hashlib.sha1(f"fortunes:{doc}".encode()).hexdigest()
        assert corpus.is_heldout("fortunes", doc, 0.25) == (int(digest[:16], 16) / 2**64 < 0.25)
    for fraction in (0.01, 0.1, 0.5):
        share = sum(corpus.is_heldout("src", d, fraction) for d in ids) / len(ids)
        assert abs(share - fraction) < 4 * (fraction * (1 - fraction) / len(ids)) ** 0.5 + 1e-9, (fraction, share)
    assert not any(corpus.is_heldout("src", d, 0.0) for d in ids) and all(corpus.is_heldout("src", d, 1.0) for d in ids)
    # A growing fraction only adds documents, and the split depends on the source name too.
    small = {d for d in ids if corpus.is_heldout("src", d, 0.05)}
    assert small <= {d for d in ids if corpus.is_heldout("src", d, 0.2)}
    assert small != {d for d in ids if corpus.is_heldout("other", d, 0.05)}


def held(source: str, doc_id: str, fraction: float) -> bool:
    """The split as the module docstring and the data card state it: sha1("<source>:<doc id>")'s first 64 bits."""
    return int.from_bytes(hashlib.sha1(f"{source}:{doc_id}".encode()).digest()[:8], "big") < fraction * 2**64


# ---- the extractors, on trees laid out as the packages are -----------------------------------------------------------
def test_extract_fortunes(tmp_path):
    base = "usr/share/games/fortunes/"
    root = write_tree(tmp_path, {
        base + "wisdom": "The first  cookie has\tenough words.\n    -- Some Author\n%\nx\n%\nSecond cookie,\n\n"
                         "with a blank line inside.\n%\n",
        base + "wisdom.dat": b"\x00\x01binary index",
        base + "wisdom.u8": "The u8 twin of the file has words too.\n%\n",
        base + "art": "A picture made of many words here.\n%\n",
        base + "ascii-art": "Another picture made of many words.\n%\n",
        base + "apple": "An apple a day keeps the doctor away.\n",
    })
    (root / base / "link").symlink_to("wisdom")
    assert list(corpus.extract_fortunes(root)) == [
        ("apple/0", ["An apple a day keeps the doctor away."]),
        ("wisdom/0", ["The first cookie has enough words.\n-- Some Author"]),
        ("wisdom/2", ["Second cookie,\nwith a blank line inside."]),
    ]


def b64(n: int) -> str:
    """dictd's base-64 number (most significant digit first)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = alphabet[n % 64]
    while n >= 64:
        n //= 64
        digits = alphabet[n % 64] + digits
    return digits


def test_b64_int():
    assert [corpus._b64_int(s) for s in ("A", "B", "/", "BA", "Bb", "BAA")] == [0, 1, 63, 64, 91, 4096]
    assert all(corpus._b64_int(b64(n)) == n for n in (0, 5, 63, 64, 4095, 123456))


def test_extract_devil(tmp_path):
    entries = [("00databaseshort", "The Devil's Dictionary, a database header entry."),
               ("ABSURDITY", "ABSURDITY\n   A statement or belief manifestly\n"
                             "   inconsistent with one's own opinion.\n\n   A second paragraph of the entry.\n"),
               ("ADORE", "ADORE\n   v.t. To venerate\n   expectantly.\n"),
               ("X", "X\n   -- 1 2 3 --\n")]
    data, index, at = b"", [], 0
    for word, text in entries:
        raw = text.encode()
        data += raw
        index.append(f"{word}\t{b64(at)}\t{b64(len(raw))}" + ("\textra" if word == "ADORE" else ""))
        at += len(raw)
    root = write_tree(tmp_path, {"usr/share/dictd/devil.dict.dz": gzip.compress(data),
                                 "usr/share/dictd/devil.index": "\n".join(index) + "\n"})
    assert list(corpus.extract_devil(root)) == [
        ("ABSURDITY", ["ABSURDITY A statement or belief manifestly inconsistent with one's own opinion.",
                       "A second paragraph of the entry."]),
        ("ADORE", ["ADORE v.t. To venerate expectantly."]),
    ]


def test_extract_jargon_groups_twenty_paragraphs(tmp_path):
    paras = [f"Paragraph number {i} of the file,\nwrapped over two lines of text." for i in range(45)]
    text = "\n\n".join(paras[:10] + ["        indented eight: a table or a figure with words"] + paras[10:]
                       + ["Too short here."])
    root = write_tree(tmp_path, {"usr/share/doc/jargon-text/jargon.txt.gz": gzip.compress(text.encode())})
    docs = list(corpus.extract_jargon(root))
    unwrapped = [p.replace("\n", " ") for p in paras]
    assert docs == [("para0", unwrapped[:20]), ("para20", unwrapped[20:40]), ("para40", unwrapped[40:])]


def test_extract_python_docs(tmp_path):
    base = "usr/share/doc/python3.11/html/_sources/"
    prose = "This page has a paragraph with plenty of words in it.\n"
    root = write_tree(tmp_path, {
        base + "library/os.rst.txt": "os\n==\n\n" + prose,
        base + "faq.rst.txt": prose + "\nAnd a second paragraph that also has words.\n",
        base + "whatsnew/changelog.rst.txt": prose,
        base + "whatsnew/3.11.rst.txt": prose,
        base + "contents.rst.txt": ".. toctree::\n\n   faq\n",
        base + "notes.txt": prose,
    })
    assert list(corpus.extract_python_docs(root)) == [
        ("faq.rst.txt", [prose.strip(), "And a second paragraph that also has words."]),
        ("library/os.rst.txt", [prose.strip()]),
        ("whatsnew/3.11.rst.txt", [prose.strip()]),
    ]


def test_extract_perl_docs(tmp_path):
    prose = "Perl has a paragraph of ordinary text with words.\n"
    root = write_tree(tmp_path, {
        "usr/share/perl/5.36.0/pod/perlintro.pod": "=head1 NAME\n\n" + prose,
        "usr/share/perl/5.36.0/pod/perltoc.pod": prose,
        "usr/share/perl/5.36.0/pod/perluniprops.pod": prose,
        "usr/share/perl/5.36.0/pod/perlempty.pod": "=head1 NAME\n\n    code only\n",
        "usr/share/perl/5.36.0/Some/Module.pod": prose,
        "usr/share/perl/5.36.0/Some/Module.pm": prose,
    })
    assert list(corpus.extract_perl_docs(root)) == [
        ("5.36.0/Some/Module.pod", [prose.strip()]),
        ("5.36.0/pod/perlintro.pod", [prose.strip()]),
    ]


BIBLE_OUT = """\
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without  form,
      and void.
Genesis 2
  1 Thus the heavens and the earth were finished.
1 John 1
  1 That which was from the beginning, which we have heard.
"""


def test_extract_bible_runs_the_packaged_reader(tmp_path):
    reader = tmp_path / "usr/bin/bible"
    write_tree(tmp_path, {"usr/bin/out.txt": BIBLE_OUT, "usr/lib/bible.data": b""})
    reader.write_text('#!/bin/sh\nd="$(dirname "$0")"\necho "$@" > "$d/args"\ncat "$d/out.txt"\n')
    reader.chmod(0o755)
    assert list(corpus.extract_bible(tmp_path)) == [
        ("Genesis 1", ["In the beginning God created the heaven and the earth.\n"
                       "And the earth was without form, and void."]),
        ("Genesis 2", ["Thus the heavens and the earth were finished."]),
        ("1 John 1", ["That which was from the beginning, which we have heard."]),
    ]
    assert (tmp_path / "usr/bin/args").read_text().split() == ["-l1000000", "-p", str(tmp_path / "usr/lib"),
                                                              "gen1:1-rev22:21"]


# ---- build: the whole pipeline, with fetch unpacking synthetic trees -------------------------------------------------
FORTUNES = "usr/share/games/fortunes/"
# package -> its fortune files -> their cookies (a cookie is a document of one block). Three repeat an earlier block:
# one in the source's other package, one in another source, one in the same file. Non-ASCII text makes bytes count.
COOKIES = {
    "alpha-text": {"one": [f"Alpha cookie number {i} has words." for i in range(12)] + ["Shared cookie text here."]},
    "alpha-extra": {"two": [f"Extra cookie number {i} has words." for i in range(12)]
                    + ["Alpha cookie number 3 has words."]},
    "beta-doc": {"three": ["Shared cookie text here."] + ["Bêta cookie with its own wörds."] * 2
                 + [f"Beta cookie number {i} has words." for i in range(12)]},
}


def package_tree(package: str) -> dict[str, str]:
    files = {FORTUNES + name: "".join(c + "\n%\n" for c in cookies) for name, cookies in COOKIES[package].items()}
    return files | {f"usr/share/doc/{package}/copyright": f"Copyright notice of {package}\n"}


def test_build_splits_by_document_and_drops_duplicates_corpus_wide(tmp_path, monkeypatch):
    fetched = []

    def fake_fetch(package: str, workdir: Path) -> tuple[Path, str]:
        fetched.append(package)
        return write_tree(workdir / package, package_tree(package)), f"1.{len(fetched)}"

    monkeypatch.setattr(corpus, "fetch", fake_fetch)
    monkeypatch.setattr(corpus, "SOURCES", (
        corpus.Source("alpha", ("alpha-text", "alpha-extra"), "PD", corpus.extract_fortunes),
        corpus.Source("beta", ("beta-doc",), "MIT", corpus.extract_fortunes),
    ))
    fraction = 0.3
    out = tmp_path / "corpus"
    manifest = corpus.build(out, fraction)
    assert fetched == ["alpha-text", "alpha-extra", "beta-doc"]

    # What the documented rules give: documents in file order (both packages of a source merged), a document's
    # blocks to heldout when sha1("<source>:<doc id>") says so, a block seen before anywhere dropped.
    expected = {"train": [], "heldout": []}
    seen, stats = set(), {}
    merged = {"alpha": {**COOKIES["alpha-text"], **COOKIES["alpha-extra"]}, "beta": COOKIES["beta-doc"]}
    for source, files in merged.items():
        s = stats[source] = {"docs": 0, "blocks": 0, "dupes": 0, "train_bytes": 0, "heldout_bytes": 0}
        for name in sorted(files):
            for i, block in enumerate(files[name]):
                split = "heldout" if held(source, f"{name}/{i}", fraction) else "train"
                s["docs"] += 1
                if block in seen:
                    s["dupes"] += 1
                    continue
                seen.add(block)
                expected[split].append(block)
                s["blocks"] += 1
                s[f"{split}_bytes"] += len(block.encode()) + 2
    assert expected["train"] and expected["heldout"], "the fixture must put documents in both splits"
    for split in ("train", "heldout"):
        text = (out / f"{split}.txt").read_text(encoding="utf-8")
        assert text == "".join(b + "\n\n" for b in expected[split])         # blocks apart by exactly one blank line
        assert manifest[f"{split}_bytes"] == len(text.encode())
    assert [s["dupes"] for s in stats.values()] == [1, 2]

    assert json.loads((out / "SOURCES.json").read_text()) == manifest
    for entry, (source, packages, license_) in zip(manifest["sources"], [
            ("alpha", ("alpha-text", "alpha-extra"), "PD"), ("beta", ("beta-doc",), "MIT")], strict=True):
        copyright_text = f"Copyright notice of {packages[0]}\n".encode()
        assert entry == {"name": source, "packages": {p: f"1.{fetched.index(p) + 1}" for p in packages},
                         "license": license_, "copyright_file": f"/usr/share/doc/{packages[0]}/copyright",
                         "copyright_sha256": hashlib.sha256(copyright_text).hexdigest(), **stats[source]}


def test_main_passes_the_command_line_to_build(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(corpus, "build", lambda out, fraction: calls.append((out, fraction)))
    monkeypatch.setattr(sys, "argv", ["corpus.py", "--out", str(tmp_path), "--heldout-fraction", "0.25"])
    corpus.main()
    monkeypatch.setattr(sys, "argv", ["corpus.py"])
    corpus.main()
    assert calls == [(tmp_path, 0.25), (Path("data/corpus"), 0.01)]


def test_fetch_downloads_and_unpacks_a_package(tmp_path, monkeypatch):
    """fetch against a stand-in apt-get that hands over a .deb built here (dpkg-deb is Debian's own tool)."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    stage = write_tree(tmp_path / "stage", {
        "DEBIAN/control": "Package: demo-text\nVersion: 2:1.5-3+deb12u1\nArchitecture: all\nMaintainer: A <a@b.c>\n"
                          "Description: demo\n",
        "usr/share/doc/demo-text/copyright": "Public domain.\n",
    })
    debs = tmp_path / "debs"
    debs.mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(stage), str(debs / "demo-text_1.5-3_all.deb")],
                   check=True, capture_output=True)
    bin_dir = write_tree(tmp_path / "bin", {"apt-get": f'#!/bin/sh\necho "$@" >> {tmp_path}/apt.log\n'
                                                       f'cp {debs}/"$3"_*.deb .\n'})
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    work = tmp_path / "work"
    work.mkdir()
    root, version = corpus.fetch("demo-text", work)
    assert version == "2:1.5-3+deb12u1"
    assert (root / "usr/share/doc/demo-text/copyright").read_text() == "Public domain.\n"
    assert (tmp_path / "apt.log").read_text().split() == ["download", "-q", "demo-text"]


# ---- the tokenizer ---------------------------------------------------------------------------------------------------
TEXT = ("The old man said that the sea was calm, and the old man went down to the sea in the morning.\n\n"
        "In the beginning the word was with the old man; the word was good, and the sea was good.\n\n")
ROUND_TRIP = ["The old man said: \"café, naïve — 日本語 🎉\"\n\tindented\n\n  two spaces  ",
              "  leading and trailing  ", "\x00\x7f bytes \u00a0 nbsp", "<|user|>Hi<|assistant|></think>ok"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tokenizer trained by the tool's main() on a small text with a small vocabulary, in a folder of its own."""
    folder = tmp_path_factory.mktemp("tok")
    corpus_file = folder / "train.txt"
    corpus_file.write_text(TEXT * 30 + "a quizzical zebra\n", encoding="utf-8")
    argv = sys.argv
    sys.argv = ["train_tokenizer.py", "--corpus", str(corpus_file), "--out", str(folder / "out"), "--vocab-size", "400"]
    try:
        tt.main()
    finally:
        sys.argv = argv
    return folder / "out"


def test_trained_vocabulary_is_specials_then_bytes_then_merges(trained):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

    tok = HFTokenizer.from_file(str(trained / "tokenizer.json"))
    inv = {i: t for t, i in tok.get_vocab().items()}
    n = len(tt.SPECIAL_TOKENS)
    assert n == 33 and [inv[i] for i in range(n)] == list(tt.SPECIAL_TOKENS)
    assert {inv[i] for i in range(n, n + 256)} == set(pre_tokenizers.ByteLevel.alphabet())
    assert n + 256 < tok.get_vocab_size() <= 400                                # merges learned, the size respected
    assert all(tok.id_to_token(i) is None for i in range(tok.get_vocab_size(), 401))
    # The byte symbols have the ids the committed tokenizer gives them.
    tiny = json.loads((TINY / "tokenizer.json").read_text())
    assert all(tiny["model"]["vocab"][inv[i]] == i for i in range(n + 256))
    # min_frequency 2: the pairs of a word seen once are not merged; those of a frequent word are.
    assert "Ġzebra" not in tok.get_vocab() and "zebra" not in tok.get_vocab()
    assert len(tok.encode("the old man").ids) < len("the old man") / 2
    for key in ("pre_tokenizer", "decoder"):
        assert json.loads(tok.to_str())[key] == tiny[key]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_trained_tokenizer_round_trips_bytes(trained, text):
    tok = Tokenizer.from_dir(trained)
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()


def test_trained_tokenizer_loads_in_glmserve_with_the_chat_template(trained):
    tok = Tokenizer.from_dir(trained)
    specials = tok.special_ids_by_token()
    assert [specials[t] for t in tt.SPECIAL_TOKENS] == list(range(33))
    assert tok.encode("<|user|>") == [tt.SPECIAL_TOKENS.index("<|user|>")]
    # The stop ids glmserve derives from tokenizer_config.json are the tiny model's config eos ids.
    assert tok.eos_token_ids == tuple(TINY_CONFIG["eos_token_id"]) == (0, 7, 9)
    assert specials[tt.BOS_TOKEN] == TINY_CONFIG["bos_token_id"] and specials[tt.EOS_TOKEN] == EOS_ID
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Call the tool."},
                {"role": "assistant", "content": "", "reasoning_content": "I should call it.",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
                {"role": "tool", "content": "Sunny"}, {"role": "tool", "content": "Warm"}]
    assert tok.apply_chat_template(messages) == (
        "[gMASK]<sop><|system|>Be brief.<|user|>Call the tool.<|assistant|><think>I should call it.</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call><|observation|><tool_response>Sunny</tool_response>"
        "<tool_response>Warm</tool_response><|assistant|><think>")
    past = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>hmm</think>Hello"},
            {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(past, enable_thinking=False) == (
        "[gMASK]<sop><|user|>Hi<|assistant|></think>Hello<|user|>Bye<|assistant|></think>")
    ids = tok.encode_chat(past)
    assert ids[:3] == [specials["[gMASK]"], specials["<sop>"], specials["<|user|>"]]
    assert ids[-2:] == [specials["<|assistant|>"], specials["<think>"]]
    with pytest.raises(ValueError, match="unknown message role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])


def test_committed_tiny_model_is_what_the_tools_write():
    """models/tiny was made by these tools: its tokenizer config is tokenizer_config(), its config TINY_CONFIG."""
    assert json.loads((TINY / "tokenizer_config.json").read_text(encoding="utf-8")) == tt.tokenizer_config()
    assert ModelConfig.from_dict(TINY_CONFIG) == ModelConfig.from_json(TINY)
    assert TINY_CONFIG["vocab_size"] == tt.VOCAB_SIZE == Tokenizer.from_dir(TINY).vocab_size
    config = tt.tokenizer_config()
    assert config["stop_tokens"] == list(tt.STOP_TOKENS) and config["eos_token"] == tt.EOS_TOKEN
    assert not config["add_bos_token"] and config["chat_template"].startswith(tt.BOS_TOKEN + "<sop>")
