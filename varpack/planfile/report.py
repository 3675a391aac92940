"""The outcome of ``varpack validate``: the violations found, one line each, and a few figures.

Every check family appends to one :class:`Report`; a violation that hits many rows or samples is
one line naming the first few (:data:`SHOW`) and how many more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: items named in one violation line before "(and N more)"
SHOW = 5


@dataclass
class Report:
    """Violations found (empty: the plan is valid) and a few figures for the OK line."""

    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, message: str) -> None:
        self.problems.append(message)

    def examples(self, what: str, items: Any, total: int | None = None) -> None:
        """One line for a violation that hits many items: the first few and the count."""
        items = list(items[:SHOW])
        total = len(items) if total is None else total
        shown = ", ".join(str(i) for i in items)
        more = f" (and {total - len(items)} more)" if total > len(items) else ""
        self.add(f"{what}: {shown}{more}")
