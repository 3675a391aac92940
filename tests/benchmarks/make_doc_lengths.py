"""Regenerate ``tests/benchmarks/data/doc_lengths.csv``: real document lengths in BPE tokens.

    python tests/benchmarks/make_doc_lengths.py [OUT] [--sample-per-source 600] [--vocab 32000]

``OUT`` defaults to ``tests/benchmarks/data/doc_lengths.csv`` (a name ending in ``.gz`` writes it
gzip-compressed). Needs only the standard library and ``tokenizers`` (Hugging Face). The figures
depend on the files installed on the machine that runs it; the data set committed next to this
script was made on the project's development container (Debian 12, pyenv CPython 3.11.7).

Each document is one file, read as bytes. Four sources, each collected in sorted path order:

- ``python``: every ``*.py`` under the standard library of the interpreter running the script
  (``sysconfig.get_paths()["stdlib"]``, for the project venv pyenv's ``lib/python3.11``), tests
  included, ``site-packages`` and ``dist-packages`` excluded.
- ``docs``: prose documentation: (1) ``/usr/share/doc/**`` files named ``*.md``, ``*.rst``,
  ``*.txt``, ``*.markdown``, ``*.adoc`` or ``README*``, ``NEWS*``, ``FAQ*``, ``TODO*``,
  ``*ReleaseNotes*``, each optionally ``.gz``-compressed (decompressed before counting): Debian
  package READMEs and NEWS, git's release notes and technical docs, the Node.js API reference,
  pip's docs, ...; (2) ``*.md``, ``*.rst``, ``*.txt`` in the ``site-packages`` of the interpreter
  running the script (the project venv), outside ``*.dist-info`` / ``*.egg-info`` folders. In
  both: licence-like files (names containing ``license``, ``licence``, ``copying``,
  ``copyright``, ``notice``, ``authors``), change logs (``changelog*``, e.g. Debian's
  ``changelog.Debian.gz``), ``requirements*.txt``, ``CMakeLists.txt`` and ``top_level.txt``-style
  metadata are left out.
- ``man``: English manual pages ``/usr/share/man/man[1-8]/*`` (``.gz``, ``.bz2``, ``.xz`` or
  plain), with ``.so`` redirection stubs skipped and the 16k machine-generated ``gcloud*`` pages of
  the Google Cloud SDK left out (they would otherwise swamp the source). The roff source is
  stripped roughly: continued lines are joined; comments, ``.de``/``.am``/``.ig`` blocks and
  requests (``.if``, ``.ds``, ``.nr``, ...) are dropped; other macro names are removed with their
  arguments kept as text (mdoc's ``Fl`` becomes ``-``); font / size / special-character escapes
  (``\\fB``, ``\\s-1``, ``\\(em``, ``\\-``, ...) are replaced by plain text.
- ``headers``: every ``*.h`` under ``/usr/include`` (system, libc, kernel, C++ and library
  headers).

Symbolic links are followed; files of 0 bytes, files containing a NUL byte (binaries) and files
whose text is empty after decoding/stripping are skipped. Contents are decoded as UTF-8 (invalid
bytes replaced). Documents are deduplicated on their exact (post-stripping) text across all
sources: the first occurrence in (source order above, then path) order is kept.

Tokenizer: a byte-level BPE trained with ``tokenizers`` (``BPE`` model, ``ByteLevel``
pre-tokenizer without prefix space, the 256-byte initial alphabet, vocab size 32,000,
``min_frequency`` 2) on a fixed sample: ``--sample-per-source`` documents per source drawn with
``random.Random(0)`` from the sorted, deduplicated list, each cut to its first 100,000 characters.
Every document is then encoded in full (no special tokens, no truncation) and its token count is
written.

Output: CSV with header ``source,tokens``, one row per document, sources in the order python,
docs, man, headers, each in path order; paths are not stored. A summary (count and quantiles per
source) is printed to stderr.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import gzip
import hashlib
import io
import lzma
import math
import os
import random
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SOURCES = ("python", "docs", "man", "headers")
DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "doc_lengths.csv"
TRAIN_CHARS = 100_000

# --------------------------------------------------------------------------- reading


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    name = path.name
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    elif name.endswith(".bz2"):
        raw = bz2.decompress(raw)
    elif name.endswith(".xz"):
        raw = lzma.decompress(raw)
    return raw


def _decode(raw: bytes) -> str | None:
    if not raw or b"\x00" in raw:
        return None
    return raw.decode("utf-8", errors="replace")


def _sorted_files(root: Path, pattern: str, keep: Callable[[Path], bool]) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(pattern) if p.is_file() and keep(p))


# --------------------------------------------------------------------------- python


def _python_paths() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages"}
    return _sorted_files(
        stdlib, "**/*.py", lambda p: not skip.intersection(p.relative_to(stdlib).parts)
    )


# --------------------------------------------------------------------------- docs

_DOC_SUFFIXES = (".md", ".rst", ".txt", ".markdown", ".adoc")
_DOC_PREFIXES = ("readme", "news", "faq", "todo")
_DOC_EXCLUDE = re.compile(
    r"licen[cs]e|copying|copyright|notice|authors|changelog|^requirements|^cmakelists\.txt$"
    r"|^(top_level|entry_points|dependency_links|sources|installed-files|not-zip-safe)\.txt$"
)


def _doc_name(p: Path) -> str:
    name = p.name.lower()
    return name[:-3] if name.endswith(".gz") else name


def _is_doc(p: Path) -> bool:
    name = _doc_name(p)
    if _DOC_EXCLUDE.search(name):
        return False
    return name.endswith(_DOC_SUFFIXES) or name.startswith(_DOC_PREFIXES) or "releasenotes" in name


def _docs_paths() -> list[Path]:
    out = _sorted_files(Path("/usr/share/doc"), "**/*", _is_doc)
    site = Path(sysconfig.get_paths()["purelib"])
    out += _sorted_files(
        site,
        "**/*",
        lambda p: (
            p.suffix.lower() in (".md", ".rst", ".txt")
            and not any(
                part.endswith((".dist-info", ".egg-info")) for part in p.relative_to(site).parts
            )
            and _is_doc(p)
        ),
    )
    return out


# --------------------------------------------------------------------------- man

_ROFF_SKIP_REQUESTS = {
    "ad", "als", "am", "as", "bp", "br", "cc", "ce", "ch", "de", "di", "do", "ds", "ec", "el",
    "eo", "ev", "fam", "fc", "fi", "fl", "ft", "hw", "hy", "ie", "if", "ig", "in", "it", "lf",
    "ll", "ls", "lt", "mk", "na", "ne", "nf", "nh", "nr", "ns", "nx", "pc", "pl", "pn", "po",
    "ps", "rm", "rn", "rr", "rs", "rt", "so", "sp", "ss", "ta", "tc", "ti", "tl", "tm", "tr",
    "uf", "ul", "vs", "wh", "PD", "UC", "DT", "RS", "RE", "PP", "LP", "P", "TP", "TQ", "HP",
    "IX", "EX", "EE", "Vb", "Ve", "Sp", "hlm", "cstyle", "mso", "Dd", "Os", "Bl", "El", "Bd",
    "Ed", "Pp", "nop", "Dt", "Sm", "Bk", "Ek", "Bf", "Ef", "Rs", "Re",
}  # fmt: skip
# mdoc inline macros that may appear among another macro's arguments: dropped (Fl becomes "-").
_MDOC_INLINE = re.compile(
    r"\b(?:Ad|An|Ap|Aq|Ar|At|Bc|Bo|Bq|Brc|Bro|Brq|Bsx|Bx|Cd|Cm|D1|Dc|Dl|Do|Dq|Dv|Ec|Em|Eo|Er"
    r"|Ev|Fa|Fc|Fn|Fo|Ft|Fx|Ic|In|It|Lb|Li|Lk|Ms|Mt|Nd|Nm|No|Ns|Nx|Oc|Oo|Op|Ot|Ox|Pa|Pc|Pf|Po"
    r"|Pq|Qc|Ql|Qo|Qq|Sc|So|Sq|St|Sx|Sy|Ta|Tn|Ux|Va|Vt|Xc|Xo|Xr)\b ?"
)
_MDOC_KEEP = {"Fl"}  # mdoc macros whose name itself stands for text ("-")
_MDOC_FLAG = re.compile(r"\bFl ?")
# Macros not in the skip set above (TH, SH, SS, B, I, BR, IR, IP, and mdoc's Sh, Nm, Op, ...)
# are dropped with their arguments kept as text.
_SPECIAL = {"ti": "~", "ga": "`", "ha": "^", "mu": "x", "di": "/", "pl": "+", "mi": "-",
            "eq": "=", "<=": "<=", ">=": ">=", "->": "->", "<-": "<-"}  # fmt: skip
_ROFF_ESCAPES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[+-]?(\d|\(\d\d|\[\d+\])"), ""),  # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),  # string interpolation
    (re.compile(r"\\n[+-]?(\[[^\]]*\]|\(..|.)"), ""),  # number registers
    (re.compile(r"\\[kz](\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\[hvwlLxoDXYZbNS]'[^']*'"), ""),
    (re.compile(r"\\\((em|en|hy)"), "-"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\((oq|cq|aq)"), "'"),
    (re.compile(r"\\\((bu|ci|sq)"), "*"),
    (re.compile(r"\\\((co)"), "(c)"),
    (re.compile(r"\\\((rg)"), "(R)"),
    (re.compile(r"\\\((ti|ga|ha|mu|di|pl|mi|eq|<=|>=|->|<-)"), lambda m: _SPECIAL[m.group(1)]),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\[e\\]"), "\\\\"),
    (re.compile(r"\\[ ~0]"), " "),  # unbreakable / digit-width spaces
    (re.compile(r"\\[&|^%:!)cdprtua{}/,]"), ""),  # zero-width and motion escapes
    (re.compile(r"\\'"), "'"),
    (re.compile(r"\\`"), "`"),
    (re.compile(r"\\\."), "."),
    (re.compile(r'\\"'), ""),
]  # fmt: skip
_CONTROL = re.compile(r"^[.'][ \t]*(\.|[^ \t\\]*)[ \t]*(.*)$")


def _roff_args(args: str, mdoc: bool) -> str:
    # Remove the quotes that group macro arguments; keep the words.
    args = args.replace('"', "")
    if mdoc:
        args = _MDOC_INLINE.sub("", _MDOC_FLAG.sub("-", args))
    return args


def strip_roff(src: str) -> str:
    """Plain-ish text of a man page's roff source (rough, see the module docstring)."""
    lines: list[str] = []
    end: str | None = None  # inside a .de/.am/.ig block: the name of the request that ends it
    mdoc = re.search(r"^\.Dd\b", src, re.MULTILINE) is not None
    src = re.sub(r"(?<!\\)\\\n", "", src)  # backslash-newline continues a line
    for line in src.splitlines():
        if end is not None:
            m = _CONTROL.match(line)
            if m is not None and m.group(1) == end:
                end = None
            continue
        if line.startswith(('.\\"', "'\\\"", '\\"', ".\\#", "\\#")):
            continue
        m = _CONTROL.match(line)
        if m is not None:
            name, args = m.group(1), m.group(2)
            if name in ("de", "de1", "am", "am1", "ig"):
                words = args.split('\\"', 1)[0].split()
                end = words[0 if name == "ig" else 1] if len(words) > (name != "ig") else "."
                continue
            if not name or name in _ROFF_SKIP_REQUESTS:  # ".", ".\\}", ". \\" comment", requests
                continue
            args = args.split('\\"', 1)[0]  # comment trailing a macro line
            line = _roff_args(name + " " + args if mdoc and name in _MDOC_KEEP else args, mdoc)
            if name == "TH":
                line = line.split(" ")[0] if line else ""
        else:
            line = line.split('\\"', 1)[0]
        for pattern, repl in _ROFF_ESCAPES:
            line = pattern.sub(repl, line)
        line = line.rstrip()
        if line or (lines and lines[-1]):
            lines.append(line)
    return "\n".join(lines).strip()


def _man_paths() -> list[Path]:
    out: list[Path] = []
    for section in range(1, 9):
        out += _sorted_files(
            Path(f"/usr/share/man/man{section}"), "*", lambda p: not p.name.startswith("gcloud")
        )
    return out


# --------------------------------------------------------------------------- headers


def _headers_paths() -> list[Path]:
    return _sorted_files(Path("/usr/include"), "**/*.h", lambda p: True)


# --------------------------------------------------------------------------- corpus


def _documents(source: str) -> Iterator[str]:
    paths = {
        "python": _python_paths,
        "docs": _docs_paths,
        "man": _man_paths,
        "headers": _headers_paths,
    }[source]()
    for path in paths:
        try:
            raw = _read_bytes(path)
        except (OSError, EOFError, gzip.BadGzipFile, lzma.LZMAError) as exc:
            print(f"skip {path}: {exc}", file=sys.stderr)
            continue
        text = _decode(raw)
        if text is None:
            continue
        if source == "man":
            if text.lstrip().startswith(".so "):  # redirection stub: an alias, not a page
                continue
            text = strip_roff(text)
        if text.strip():
            yield text


def collect() -> list[tuple[str, str]]:
    """(source, text) for every kept document, in output order, deduplicated."""
    seen: set[bytes] = set()
    docs: list[tuple[str, str]] = []
    for source in SOURCES:
        n0 = len(docs)
        dups = 0
        for text in _documents(source):
            key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
            if key in seen:
                dups += 1
                continue
            seen.add(key)
            docs.append((source, text))
        print(f"{source}: {len(docs) - n0} documents ({dups} duplicates dropped)", file=sys.stderr)
    return docs


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(docs: list[tuple[str, str]], sample_per_source: int, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    sample: list[str] = []
    for source in SOURCES:
        texts = [t for s, t in docs if s == source]
        picked = sorted(rng.sample(range(len(texts)), min(sample_per_source, len(texts))))
        sample += [texts[i][:TRAIN_CHARS] for i in picked]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    print(
        f"tokenizer: trained on {len(sample)} documents "
        f"({sum(map(len, sample)) / 1e6:.1f}M chars), vocab {tok.get_vocab_size()}",
        file=sys.stderr,
    )
    return tok


def count_tokens(tok, texts: list[str], batch: int = 256) -> list[int]:
    out: list[int] = []
    for i in range(0, len(texts), batch):
        encs = tok.encode_batch(texts[i : i + batch], add_special_tokens=False)
        out += [len(e.ids) for e in encs]
    return out


# --------------------------------------------------------------------------- output


def _quantile(sorted_vals: list[int], q: float) -> int:
    # inverted CDF: the smallest value with at least a fraction q of the data at or below it
    return sorted_vals[max(0, math.ceil(q * len(sorted_vals)) - 1)]


def summarize(rows: list[tuple[str, int]]) -> str:
    lines = [f"{'source':<8} {'docs':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>8}"
             f" {'>8192':>6} {'>16384':>6} {'tokens':>11}"]  # fmt: skip
    for source in (*SOURCES, "total"):
        vals = sorted(t for s, t in rows if source in (s, "total"))
        if not vals:
            continue
        lines.append(
            f"{source:<8} {len(vals):>6} {_quantile(vals, 0.5):>7} {_quantile(vals, 0.9):>7}"
            f" {_quantile(vals, 0.99):>7} {vals[-1]:>8} {sum(v > 8192 for v in vals):>6}"
            f" {sum(v > 16384 for v in vals):>6} {sum(vals):>11}"
        )
    return "\n".join(lines)


def write_csv(rows: list[tuple[str, int]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["source", "tokens"])
    w.writerows(rows)
    data = buf.getvalue().encode()
    if out.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    out.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--sample-per-source", type=int, default=600)
    ap.add_argument("--vocab", type=int, default=32_000)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    docs = collect()
    tok = train_tokenizer(docs, args.sample_per_source, args.vocab)
    counts = count_tokens(tok, [t for _, t in docs])
    rows = [(s, n) for (s, _), n in zip(docs, counts, strict=True)]
    write_csv(rows, args.out)
    print(summarize(rows), file=sys.stderr)
    print(
        f"wrote {args.out} ({os.path.getsize(args.out)} bytes) in {time.perf_counter() - t0:.0f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
