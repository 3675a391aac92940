"""What a ``--where`` condition may be, checked before polars sees it.

A condition is an expression over one metadata row: its columns, literals (numbers, 'strings',
TRUE, FALSE, NULL), comparisons, arithmetic, ``AND``/``OR``/``NOT``, ``IN (...)``, ``BETWEEN``,
``LIKE``/``ILIKE``, ``IS [NOT] NULL|TRUE|FALSE``, ``CAST(x AS type)`` / ``x::type`` and the row
functions of :data:`FUNCTIONS`. Nothing else reaches polars: polars' SQL layer would otherwise
run a subquery (``IN (SELECT ... FROM read_parquet('/any/file'))`` reads that file while the
condition is only being parsed), an aggregate or window (``score > avg(score)``: a figure of the
whole input, which under MPI each rank would compute over its own share) or a function of the
clock (``now()``). The check is on tokens: a lexer that splits the text as polars' SQL tokenizer
does (single-quoted strings with ``''`` for a quote and no backslash escape, double-quoted
column names with ``""``), then every word must be a keyword of the list above, a listed
function followed by ``(``, a type after ``AS``/``::``, or a column of the metadata; comments,
``;``, backticks, ``$``, ``||`` and other operators are refused.

Polars' optimiser is superlinear in the size of an expression (3,000 ``OR`` terms over 600 rows
took 20 GB and 756 s), so a condition is bounded before it is parsed: at most
:data:`MAX_CHARS` characters, :data:`MAX_TERMS` terms (column references, operators and
function calls; an ``IN`` list's values do not count) and :data:`MAX_DEPTH` nested parentheses.
256 terms, the most, evaluate in about a second over 600 rows on a shared 2-core machine.

Also no function whose result can be larger than its input row (``repeat``, ``lpad``,
``concat``, ``||``, ``replace``): a literal of 16 KB repeated over 100 M rows is 1.6 TB.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from varpack.errors import ConfigError

#: the longest condition (characters) and its most terms and nested parentheses
MAX_CHARS = 16_384
MAX_TERMS = 256
MAX_DEPTH = 32

#: functions of one row whose result is a number, a boolean or no larger than their input
FUNCTIONS = frozenset(
    "abs cbrt ceil ceiling exp floor ln log log10 log2 mod pow power round sign sqrt trunc "
    "char_length length lower octet_length upper "
    "ends_with left ltrim regexp_like right rtrim starts_with strpos substr trim".split()
)
KEYWORDS = frozenset(
    "AND OR NOT IS NULL TRUE FALSE IN BETWEEN LIKE ILIKE CAST AS".split()
)  # fmt: skip
TYPES = frozenset(
    "BOOL BOOLEAN SMALLINT INT INTEGER BIGINT FLOAT REAL DOUBLE VARCHAR TEXT STRING".split()
)
#: keywords that count as a term (an operation), as operators do
_TERM_WORDS = frozenset("AND OR NOT IS IN BETWEEN LIKE ILIKE CAST".split())

ALLOWED = (
    "a condition is an expression over one metadata row: its columns, literals, comparisons, "
    "+ - * / %, AND, OR, NOT, IN (...), BETWEEN, LIKE, ILIKE, IS [NOT] NULL, CAST(x AS type) "
    f"and the functions {', '.join(sorted(FUNCTIONS))}"
)

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>--|/\*)
      | (?P<string>'(?:[^']|'')*')
      | (?P<quoted>"(?:[^"]|"")*")
      | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<word>[^\W\d]\w*)
      | (?P<op><>|!=|<=|>=|::|[=<>+\-*/%])
      | (?P<punct>[(),])""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Condition:
    """A checked condition: its text (whitespace outside literals made single spaces, what
    polars runs and plan.json keeps) and the column names it reads."""

    text: str
    columns: tuple[str, ...]


def parse(sql: str, flag: str = "--where") -> Condition:
    """The condition ``sql``, checked; ``flag`` names where it came from in an error.

    >>> parse("score  > 0.5 AND\\nlang = 'a  b'")
    Condition(text="score > 0.5 AND lang = 'a  b'", columns=('score', 'lang'))
    >>> parse("sample_id IN (SELECT sample_id FROM read_parquet('x'))")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    varpack.errors.ConfigError: --where "sample_id IN (SELECT sample_id FROM read_parquet('x'))": SELECT is not allowed in a condition; ...
    """
    if not sql.strip():
        raise ConfigError(f"{flag}: the condition is empty; give a SQL condition (score > 0.5)")
    if len(sql) > MAX_CHARS:
        raise _refused(
            sql[:60] + "...", flag, f"{len(sql):,} characters, more than the {MAX_CHARS:,} a "
            "condition may hold", "select with a shorter condition",
        )  # fmt: skip
    tokens = _lex(sql, flag)
    columns = _check_words(tokens, sql, flag)
    _check_size(tokens, len(columns), sql, flag)
    text = "".join((" " if gap and out else "") + tok for out, (_, tok, gap) in enumerate(tokens))
    return Condition(text, tuple(dict.fromkeys(columns)))


def check_columns(cond: Condition, names: Sequence[str], flag: str = "--where") -> None:
    """Every column ``cond`` reads is one of ``names`` (the metadata's, exactly as spelled)."""
    missing = [c for c in cond.columns if c not in names]
    if missing:
        raise _refused(
            cond.text, flag, f"no column {missing[0]!r} in the metadata (columns: "
            f"{', '.join(names)})", "write the condition over these columns (names are "
            'case-sensitive; quote one that is not a plain word: "my col")',
        )  # fmt: skip


def _lex(sql: str, flag: str) -> list[tuple[str, str, bool]]:
    """``(kind, text, space before)`` of each token; a character outside the grammar, a
    comment or an unterminated literal is refused."""
    tokens: list[tuple[str, str, bool]] = []
    pos, gap = 0, False
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise _refused(sql, flag, _bad_char(sql, pos), ALLOWED)
        kind = m.lastgroup or ""
        if kind == "comment":
            raise _refused(sql, flag, "no comments (-- or /* */)", "write the condition alone")
        if kind == "space":
            gap = True
        else:
            tokens.append((kind, m.group(), gap))
            gap = False
        pos = m.end()
    return tokens


def _bad_char(sql: str, pos: int) -> str:
    c = sql[pos]
    if c == ";":
        return "one condition, no ';' (a WHERE clause, not a query)"
    if c in "'\"":
        return (
            f"an unterminated {'string' if c == chr(39) else 'column name'} at character {pos + 1}"
        )
    if c == "`":
        return 'quote a column name with double quotes ("my col"), not backticks'
    if sql.startswith("||", pos):
        return "no || (a condition compares values, it does not build strings)"
    return f"{c!r} at character {pos + 1} is not part of a condition"


def _check_words(tokens: list[tuple[str, str, bool]], sql: str, flag: str) -> list[str]:
    """The column names the condition reads, one per reference; any other word must be a
    keyword, a function called, or a type after ``AS``/``::``."""
    columns: list[str] = []
    for k, (kind, tok, _) in enumerate(tokens):
        after = tokens[k + 1][1] if k + 1 < len(tokens) else ""
        before = tokens[k - 1][1].upper() if k else ""
        if kind == "quoted":
            if after == "(":
                raise _refused(sql, flag, f"{tok} is not a function of a condition", ALLOWED)
            columns.append(tok[1:-1].replace('""', '"'))
        elif kind != "word":
            continue
        elif before in ("AS", "::"):
            if tok.upper() not in TYPES:
                raise _refused(sql, flag, f"{tok} is not a type a condition casts to",
                               f"cast to one of {', '.join(sorted(TYPES))}")  # fmt: skip
        elif tok.upper() in KEYWORDS:
            continue
        elif tok.upper() in _QUERY_WORDS:
            raise _refused(
                sql, flag, f"{tok.upper()} is not allowed in a condition",
                f'{ALLOWED} (a column named {tok} is written "{tok}")',
            )  # fmt: skip
        elif after == "(":
            if tok.lower() not in FUNCTIONS:
                raise _refused(sql, flag, f"{tok}() is not a function of one row", ALLOWED)
        else:
            columns.append(tok)
    return columns


#: words of SQL beyond a row's condition; named as such (unquoted, they are never a column)
_QUERY_WORDS = frozenset(
    "SELECT FROM WHERE UNION WITH JOIN EXISTS OVER PARTITION ORDER GROUP BY HAVING LIMIT "
    "OFFSET INTERSECT EXCEPT VALUES TABLE LATERAL INTO ALL ANY SOME DISTINCT CASE WHEN THEN "
    "ELSE END ESCAPE SIMILAR REGEXP RLIKE INTERVAL QUALIFY WINDOW FETCH UNNEST".split()
)


def _check_size(tokens: list[tuple[str, str, bool]], columns: int, sql: str, flag: str) -> None:
    """At most :data:`MAX_TERMS` terms (``columns`` references, operators, functions called;
    an ``IN`` list's literal values are not terms) and :data:`MAX_DEPTH` nested parentheses."""
    terms, depth, deepest = columns, 0, 0
    for k, (kind, tok, _) in enumerate(tokens):
        word = tok.upper() if kind == "word" else ""
        called = word not in KEYWORDS and k + 1 < len(tokens) and tokens[k + 1][1] == "("
        if kind == "op" or (word and called) or word in _TERM_WORDS:
            terms += 1
        depth += {"(": 1, ")": -1}.get(tok, 0) if kind == "punct" else 0
        deepest = max(deepest, depth)
    if terms > MAX_TERMS:
        raise _refused(
            sql, flag, f"{terms:,} terms (column references, operators, functions), more than "
            f"the {MAX_TERMS} a condition may hold", "select with a shorter condition (IN (...) "
            "takes its list of values as one term)",
        )  # fmt: skip
    if deepest > MAX_DEPTH:
        raise _refused(
            sql, flag, f"{deepest} nested parentheses, more than the {MAX_DEPTH} a condition "
            "may hold", "write the condition with fewer parentheses",
        )  # fmt: skip


def _refused(sql: str, flag: str, what: str, todo: str) -> ConfigError:
    shown = sql if len(sql) <= 200 else sql[:200] + "..."
    return ConfigError(f"{flag} {shown!r}: {what}; {todo}")
