"""Build the English training corpus for the embedded tiny GLM-5 model.

Every source is a Debian package fetched with ``apt-get download`` and unpacked
with ``dpkg-deb -x`` into a temporary directory (nothing is installed). Each
source has an extractor that yields *documents*: a stable id (a file, a Bible
chapter, a single fortune) and its cleaned text blocks.

Output format (``--out``, default ``data/corpus``):

* ``train.txt`` / ``heldout.txt``: UTF-8, one block (a paragraph, a fortune, a
  dictionary entry, a Bible chapter) per group of non-empty lines; blocks are
  separated by exactly one blank line and contain no blank line. Prose blocks
  are unwrapped onto a single line; verse-like blocks (fortunes, Bible
  chapters) keep one line per line/verse. Whitespace inside a line is
  collapsed to single spaces, text is NFC-normalised, exact duplicate blocks
  are dropped corpus-wide (first occurrence wins).
* The held-out split is by *document*, not by block: a document goes to
  ``heldout.txt`` when sha1("<source>:<doc id>") falls in the first
  ``--heldout-fraction`` of the hash space, so the split is deterministic and
  never separates the paragraphs of one document.
* ``SOURCES.json``: per package its version, license, copyright file digest,
  and document/block/byte counts.

Usage: ``python tools/corpus.py --out data/corpus``
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import json
import re
import subprocess
import tempfile
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Document = tuple[str, list[str]]  # (doc id, cleaned blocks)


@dataclass(frozen=True)
class Source:
    """One corpus source: the packages to unpack and how to read them."""

    name: str
    packages: tuple[str, ...]  # packages[0] carries the text and the license
    license: str  # SPDX-like summary of /usr/share/doc/<pkg>/copyright
    extract: Callable[[Path], Iterator[Document]]


# ---------------------------------------------------------------- normalising

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACES = re.compile(r"[ \t\u00a0]+")


def normalize_line(line: str) -> str:
    line = re.sub(r".\x08", "", line)  # overstrike (x\bx, _\bx) as used by some fortunes
    line = _CONTROL.sub(" ", unicodedata.normalize("NFC", line))
    return _SPACES.sub(" ", line).strip()


def is_prose(block: str, min_words: int = 3) -> bool:
    """Keep blocks of real words: enough of them, and mostly letters."""
    if len(block.split()) < min_words:
        return False
    visible = [c for c in block if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    return letters >= 0.6 * len(visible)


def split_blocks(text: str) -> list[list[str]]:
    """Split on blank lines; lines keep their indentation (tabs expanded)."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.expandtabs(8).splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def unwrap(lines: list[str]) -> str:
    return normalize_line(" ".join(lines))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


# ---------------------------------------------------------------- Bible (KJV)


def extract_bible(root: Path) -> Iterator[Document]:
    """Dump the KJV with the package's own ``bible`` reader; a chapter is a document."""
    out = subprocess.run(
        [str(root / "usr/bin/bible"), "-l1000000", "-p", str(root / "usr/lib"), "gen1:1-rev22:21"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    chapter, verses = "", []
    for line in out.splitlines():
        if re.fullmatch(r"[1-3]?\s?[A-Z][A-Za-z ]+ \d+", line.strip()):
            if verses:
                yield chapter, ["\n".join(verses)]
            chapter, verses = line.strip(), []
        elif m := re.match(r"\s*\d+ (.*)", line):
            verses.append(normalize_line(m.group(1)))
        elif line.strip() and verses:
            verses[-1] = normalize_line(verses[-1] + " " + line)
    if verses:
        yield chapter, ["\n".join(verses)]


# ---------------------------------------------------------------- fortunes

_FORTUNE_SKIP = {"art", "ascii-art"}  # pictures, not text


def extract_fortunes(root: Path) -> Iterator[Document]:
    for path in sorted((root / "usr/share/games/fortunes").iterdir()):
        if path.suffix in (".dat", ".u8") or path.is_symlink() or path.name in _FORTUNE_SKIP:
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for i, cookie in enumerate(re.split(r"^%\s*$", text, flags=re.MULTILINE)):
            lines = [normalize_line(line) for line in cookie.splitlines()]
            block = "\n".join(line for line in lines if line)
            if is_prose(block):
                yield f"{path.name}/{i}", [block]


# ---------------------------------------------------------------- dictd dictionaries

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64_int(s: str) -> int:
    n = 0
    for ch in s:
        n = n * 64 + _B64.index(ch)
    return n


def extract_devil(root: Path) -> Iterator[Document]:
    """The Devil's Dictionary: one entry (headword + definition) per document."""
    data = gzip.decompress((root / "usr/share/dictd/devil.dict.dz").read_bytes())
    for line in (root / "usr/share/dictd/devil.index").read_text().splitlines():
        word, offset, length = line.split("\t")[:3]
        if word.startswith("00database"):
            continue
        entry = data[_b64_int(offset) : _b64_int(offset) + _b64_int(length)].decode("utf-8", "replace")
        blocks = [unwrap(b) for b in split_blocks(entry)]
        blocks = [b for b in blocks if is_prose(b)]
        if blocks:
            yield word, blocks


# ---------------------------------------------------------------- plain wrapped text


def extract_jargon(root: Path) -> Iterator[Document]:
    """The Jargon File: wrapped plain text; documents are runs of 20 paragraphs."""
    text = gzip.decompress((root / "usr/share/doc/jargon-text/jargon.txt.gz").read_bytes()).decode(
        "utf-8", "replace"
    )
    blocks = [unwrap(b) for b in split_blocks(text) if _indent(b[0]) < 8]
    blocks = [b for b in blocks if is_prose(b, min_words=6)]
    for start in range(0, len(blocks), 20):
        yield f"para{start}", blocks[start : start + 20]


# ---------------------------------------------------------------- reStructuredText (Python docs)

# Directives whose body is prose; every other directive's body (code, tables, toctrees) is skipped.
_RST_PROSE_DIRECTIVES = {
    "note",
    "warning",
    "tip",
    "important",
    "caution",
    "attention",
    "hint",
    "danger",
    "seealso",
    "versionadded",
    "versionchanged",
    "deprecated",
    "deprecated-removed",
    "impl-detail",
    "admonition",
    "function",
    "method",
    "class",
    "attribute",
    "data",
    "exception",
    "decorator",
    "describe",
    "classmethod",
    "staticmethod",
    "module",
    "opcode",
    "cmdoption",
    "envvar",
    "abstractmethod",
    "coroutinefunction",
    "coroutinemethod",
    "c:function",
    "c:type",
    "c:macro",
    "c:member",
    "c:var",
}
_RST_UNDERLINE = re.compile(r"^\s*([=\-~^*#+\"'`.:_])\1{2,}\s*$")
_RST_FIELD = re.compile(r"^\s*:[\w -]+:(\s|$)")  # directive options / field lists, not :role:`x`
_RST_ROLE = re.compile(r":[\w:.+-]+:`([^`]*)`")
_RST_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{1,2}")


def _rst_role_text(match: re.Match[str]) -> str:
    text = match.group(1).lstrip("!~")
    if m := re.fullmatch(r"(.*?)\s*<[^<>]*>", text, flags=re.DOTALL):
        text = m.group(1) or text
    return text


def clean_rst_inline(text: str) -> str:
    text = _RST_ROLE.sub(_rst_role_text, text)
    text = _RST_LINK.sub(r"\1", text)
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r"`([^`]+)`_{0,2}", r"\1", text)
    text = re.sub(r"\*\*(\S.*?)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)
    text = re.sub(r"\|(\w+)\|", r"\1", text)
    text = text.replace("\\ ", "").replace("\\", "")
    return normalize_line(text)


def rst_paragraphs(text: str) -> Iterator[str]:
    """Prose paragraphs of one reST file: drops code, tables, headings and markup."""
    skip_deeper_than: int | None = None
    for block in split_blocks(text):
        indent = _indent(block[0])
        if skip_deeper_than is not None:
            if indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        first = block[0].strip()
        if first.startswith(".."):
            m = re.match(r"\.\.\s+([\w:-]+)::\s*(.*)", first)
            if not m or m.group(1) not in _RST_PROSE_DIRECTIVES:
                skip_deeper_than = indent  # comment, label, code-block, toctree, index...
                continue
            lead = m.group(2) if m.group(1) in ("note", "warning", "seealso", "impl-detail") else ""
            block = ([lead] if lead else []) + block[1:]
        lines = [ln for ln in block if not _RST_UNDERLINE.match(ln) and not _RST_FIELD.match(ln)]
        if not lines or len(block) != len(lines) and len(lines) == 1:
            continue  # a heading (text + underline) or an option list
        if lines[0].strip().startswith((">>>", "+-", "|")) or re.fullmatch(r"[=\- ]+", lines[0].strip()):
            continue
        para = unwrap(lines)
        if para.endswith("::"):
            skip_deeper_than = indent
            para = para[:-2].rstrip() + ":"
        para = re.sub(r"^(?:[-*+]|#\.|\d+\.)\s+", "", para)
        para = clean_rst_inline(para)
        if is_prose(para, min_words=6):
            yield para


def extract_python_docs(root: Path) -> Iterator[Document]:
    base = root / "usr/share/doc/python3.11/html/_sources"
    for path in sorted(base.rglob("*.rst.txt")):
        rel = path.relative_to(base).as_posix()
        if rel.startswith("whatsnew/changelog"):
            continue  # a bug-number list, not prose
        paras = list(rst_paragraphs(path.read_text("utf-8", errors="replace")))
        if paras:
            yield rel, paras


# ---------------------------------------------------------------- POD (Perl docs)

_POD_SKIP = {"perltoc.pod", "perluniprops.pod"}  # generated indexes, not prose
_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}


def _pod_link(inner: str) -> str:
    """L<text|target> -> text; L<name/"section"> and L</section> -> section; URLs kept."""
    if "|" in inner:
        return inner.split("|", 1)[0]
    if "://" in inner:
        return inner
    return inner.rsplit("/", 1)[-1].strip('"') or inner


def clean_pod_inline(text: str) -> str:
    text = re.sub(
        r"([A-Z])<{2,}\s+(.*?)\s+>{2,}",
        lambda m: f"{m.group(1)}<{m.group(2).replace('<', '&lt;').replace('>', '&gt;')}>",
        text,
    )
    for _ in range(8):  # innermost-first; nesting is shallow in practice
        new = re.sub(r"([A-Z])<([^<>]*)>", _pod_code, text)
        if new == text:
            break
        text = new
    return normalize_line(html.unescape(text))


def _pod_number(inner: str) -> str | None:
    """The character of a numeric ``E<...>`` escape (perlpodspec: ``0x41`` hex, ``0101`` octal, ``65`` decimal)."""
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", inner):
        return chr(int(inner, 16))
    if re.fullmatch(r"0[0-7]+", inner):
        return chr(int(inner, 8))
    return chr(int(inner)) if inner.isdigit() else None


def _pod_code(m: re.Match[str]) -> str:
    code, inner = m.group(1), m.group(2)
    if code in "XZ":
        return ""
    if code == "E":
        return _POD_ESCAPES.get(inner, _pod_number(inner) or html.unescape(f"&{inner};"))
    if code == "L":
        return _pod_link(inner)
    return inner


def pod_paragraphs(text: str) -> Iterator[str]:
    in_begin = False
    for block in split_blocks(text):
        first = block[0]
        if in_begin:
            in_begin = not first.startswith("=end")
            continue
        if first.startswith("=begin"):
            in_begin = True
            continue
        if first.startswith("=") or first[0] == " ":
            continue  # commands (=head, =item, =for ...) and verbatim code
        para = clean_pod_inline(" ".join(block))
        if is_prose(para, min_words=6):
            yield para


def extract_perl_docs(root: Path) -> Iterator[Document]:
    base = root / "usr/share/perl"
    for path in sorted(base.rglob("*.pod")):
        if path.name in _POD_SKIP:
            continue
        paras = list(pod_paragraphs(path.read_text("utf-8", errors="replace")))
        if paras:
            yield path.relative_to(base).as_posix(), paras


# ---------------------------------------------------------------- sources

SOURCES = (
    Source(
        "bible-kjv",
        ("bible-kjv-text", "bible-kjv"),
        "public-domain (KJV text); Debian packaging GPL-2+",
        extract_bible,
    ),
    Source(
        "fortunes",
        ("fortunes",),
        "BSD-3-Clause (fortune-mod notice; quotations by many authors)",
        extract_fortunes,
    ),
    Source(
        "fortunes-min",
        ("fortunes-min",),
        "BSD-3-Clause (fortune-mod notice; quotations by many authors)",
        extract_fortunes,
    ),
    Source("devil", ("dict-devil",), "public-domain (Ambrose Bierce, 1911)", extract_devil),
    Source("jargon", ("jargon-text",), "public-domain (The Jargon File 4.4.7)", extract_jargon),
    Source("python-docs", ("python3.11-doc",), "PSF-2.0 (Python documentation)", extract_python_docs),
    Source("perl-docs", ("perl-doc",), "GPL-1.0-or-later OR Artistic-1.0-Perl", extract_perl_docs),
)


def fetch(package: str, workdir: Path) -> tuple[Path, str]:
    """Download and unpack one Debian package; returns (root dir, version)."""
    debdir = workdir / "debs"
    debdir.mkdir(exist_ok=True)
    debdir.chmod(0o777)  # lets apt's unprivileged _apt user write there
    subprocess.run(["apt-get", "download", "-q", package], cwd=debdir, check=True, capture_output=True)
    (deb,) = debdir.glob(f"{package}_*.deb")
    version = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    root = workdir / package
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root, version


def is_heldout(package: str, doc_id: str, fraction: float) -> bool:
    digest = hashlib.sha1(f"{package}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def build(out: Path, heldout_fraction: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    seen: set[bytes] = set()
    manifest: dict = {"format": "blocks separated by one blank line; see tools/corpus.py", "sources": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        open(out / "train.txt", "w", encoding="utf-8") as train,
        open(out / "heldout.txt", "w", encoding="utf-8") as heldout,
    ):
        workdir = Path(tmp)
        for source in SOURCES:
            roots, versions = [], {}
            for package in source.packages:
                root, versions[package] = fetch(package, workdir)
                roots.append(root)
            merged = roots[0]
            for extra in roots[1:]:  # e.g. the bible reader next to its data
                subprocess.run(["cp", "-a", f"{extra}/.", str(merged)], check=True)
            copyright_file = merged / f"usr/share/doc/{source.packages[0]}/copyright"
            stats = {"docs": 0, "blocks": 0, "dupes": 0, "train_bytes": 0, "heldout_bytes": 0}
            for doc_id, blocks in source.extract(merged):
                held = is_heldout(source.name, doc_id, heldout_fraction)
                stats["docs"] += 1
                for block in blocks:
                    key = hashlib.sha1(block.encode()).digest()
                    if key in seen:
                        stats["dupes"] += 1
                        continue
                    seen.add(key)
                    stats["blocks"] += 1
                    data = block + "\n\n"
                    (heldout if held else train).write(data)
                    stats["heldout_bytes" if held else "train_bytes"] += len(data.encode())
            manifest["sources"].append(
                {
                    "name": source.name,
                    "packages": versions,
                    "license": source.license,
                    "copyright_file": f"/usr/share/doc/{source.packages[0]}/copyright",
                    "copyright_sha256": hashlib.sha256(copyright_file.read_bytes()).hexdigest(),
                    **stats,
                }
            )
            print(
                f"{source.name:13s} docs={stats['docs']:6d} blocks={stats['blocks']:7d} "
                f"train={stats['train_bytes'] / 1e6:6.2f}MB heldout={stats['heldout_bytes'] / 1e6:5.2f}MB"
            )
    for split in ("train", "heldout"):
        manifest[f"{split}_bytes"] = (out / f"{split}.txt").stat().st_size
    (out / "SOURCES.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(
        f"total train={manifest['train_bytes'] / 1e6:.2f}MB heldout={manifest['heldout_bytes'] / 1e6:.2f}MB"
    )
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    parser.add_argument("--heldout-fraction", type=float, default=0.01)
    args = parser.parse_args()
    build(args.out, args.heldout_fraction)


if __name__ == "__main__":
    main()
