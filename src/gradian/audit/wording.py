"""How findings name rows and numbers: short, exact, pasteable."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def id_list(ids: Sequence[str], limit: int = 8) -> str:
    """`3, 7, 12` or `3, 7, 12 … and 40 more (all in findings.json)`."""
    shown = ", ".join(str(i) for i in ids[:limit])
    rest = len(ids) - limit
    return f"{shown} … and {rest} more (all ids in findings.json)" if rest > 0 else shown


def share(count: int, total: int) -> str:
    """`37 of 400 rows (9.2%)`."""
    return f"{count} of {total} rows ({100 * count / max(total, 1):.1f}%)"


def p99(lengths: Sequence[int]) -> int:
    """The length that fits 99% of rows (rounded up to a whole token)."""
    return int(np.ceil(np.percentile(np.asarray(lengths, dtype=np.float64), 99))) if len(lengths) else 0
