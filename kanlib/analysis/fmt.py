"""Numbers as a reader wants them, one function per unit: times in ms, fractions in %, speedups as x,
95% intervals in brackets, bytes with a binary prefix. Anything not finite prints as ``n/a``."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def finite(v) -> bool:
    """Whether ``v`` is a finite number (None and NaN are not)."""
    return v is not None and bool(np.isfinite(v))


def ms(v) -> str:
    """Seconds as milliseconds, 3 significant digits."""
    return f"{v * 1e3:.3g}" if np.isfinite(v) else "n/a"


def us(v) -> str:
    """Seconds as microseconds, 3 significant digits."""
    return f"{v * 1e6:.3g}" if finite(v) else "n/a"


def sec(v) -> str:
    """Seconds, 3 significant digits."""
    return f"{v:.3g}" if np.isfinite(v) else "n/a"


def pct(v) -> str:
    """A fraction as a whole percentage."""
    return f"{v:.0%}" if np.isfinite(v) else "n/a"


def pct1(v) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{v:.1%}" if np.isfinite(v) else "n/a"


def signed_pct(v) -> str:
    """A relative change as a signed percentage with two decimals."""
    return f"{v:+.2%}" if finite(v) else "n/a"


def x(v) -> str:
    """A ratio as ``1.23x``."""
    return f"{v:.2f}x" if np.isfinite(v) else "n/a"


def slower_faster(ratio) -> str:
    """A time against a reference's (``ratio = time / reference``) in words that say which way: ``1.32x slower``,
    ``1.14x faster`` (the reference over the time), ``as fast`` when both print as 1.00x; ``n/a`` when not finite."""
    if not finite(ratio) or ratio <= 0:
        return "n/a"
    if f"{ratio:.2f}" == "1.00" and f"{1 / ratio:.2f}" == "1.00":
        return "as fast"
    return f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"


def mib(v) -> str:
    """Bytes in MiB with a thousands separator."""
    return f"{v / 2**20:,.1f}" if finite(v) else "n/a"


def nbytes(b: float) -> str:
    """Bytes with the largest binary prefix that keeps the number below 1024: ``3.2 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} TiB"


def outward(lo, hi, fmt) -> tuple[str, str]:
    """An interval's bounds as ``fmt`` writes them, rounded outward for the percentages a decision reads: the low
    end down, the high end up, so a printed interval never claims more than was measured (a low end of 71.9% that
    missed a 72% decision bound read "72%" when rounded to nearest, beside a decision that rejected it)."""
    digits = {pct: 0, pct1: 1}.get(fmt)
    if digits is None or not (finite(lo) and finite(hi)):
        return fmt(lo), fmt(hi)
    scale = 100 * 10 ** digits
    down = math.floor(lo * scale + 1e-9) / scale
    up = math.ceil(hi * scale - 1e-9) / scale
    return fmt(down), fmt(up)


def ci_text(v, lo, hi, fmt) -> str:
    """``fmt(v) [fmt(lo), fmt(hi)]`` (bounds rounded outward, :func:`outward`); only ``fmt(v)`` when the interval is
    the point or not finite."""
    if not np.isfinite(v):
        return "n/a"
    if np.isfinite(lo) and np.isfinite(hi) and (lo != v or hi != v):
        a, b = outward(lo, hi, fmt)
        return f"{fmt(v)} [{a}, {b}]"
    return fmt(v)


def runs_text(v, n: int, fmt, runs=None) -> str:
    """A value from fewer runs than an interval needs: ``212 (2 runs: 191, 234)`` with the runs themselves when
    known, else ``82% (2 runs)``: no bracketed interval (with two runs a bootstrap "interval" is their min and
    max)."""
    if not finite(v):
        return "n/a"
    if isinstance(runs, (tuple, list)) and len(runs):
        return f"{fmt(v)} ({n} run{'s' if n != 1 else ''}: {', '.join(fmt(r) for r in sorted(runs))})"
    return f"{fmt(v)} ({n} run{'s' if n != 1 else ''})"


def too_few(n) -> bool:
    """Whether ``n`` runs are fewer than an interval needs (:data:`kanlib.analysis.stats.MIN_RUNS`)."""
    from kanlib.analysis.stats import MIN_RUNS

    try:
        return int(n) < MIN_RUNS
    except (TypeError, ValueError):
        return False


def ci_column(t: pd.DataFrame, col: str, fmt, lo: str | None = None, hi: str | None = None) -> list[str]:
    """:func:`ci_text` of every row of column ``col`` of ``t`` (bounds ``<col>_lo`` / ``<col>_hi`` by default);
    a row with fewer runs (``n_runs``) than an interval needs shows :func:`runs_text` instead (the runs themselves
    from ``<col>_runs`` when the table has them)."""
    n = t["n_runs"] if "n_runs" in t else pd.Series([None] * len(t), index=t.index)
    runs = t[f"{col}_runs"] if f"{col}_runs" in t else pd.Series([None] * len(t), index=t.index)
    return [runs_text(v, k, fmt, r) if too_few(k) else ci_text(v, a, b, fmt)
            for v, a, b, k, r in zip(t[col], t[lo or f"{col}_lo"], t[hi or f"{col}_hi"], n, runs)]


def row_ci(row, col: str, fmt, lo: str | None = None, hi: str | None = None) -> str:
    """A table row's ``col`` as :func:`ci_text`, or :func:`runs_text` when the row has fewer runs (``n_runs``)
    than an interval needs."""
    if too_few(row.get("n_runs")):
        return runs_text(row[col], int(row["n_runs"]), fmt, row.get(f"{col}_runs"))
    return ci_text(row[col], row.get(lo or f"{col}_lo", np.nan), row.get(hi or f"{col}_hi", np.nan), fmt)


def pct_ci(row, col: str, lo: str | None = None, hi: str | None = None) -> str:
    """``91% [88%, 93%]``: a row's fraction ``col`` with its interval (always both bounds, ``n/a`` if missing);
    ``82% (2 runs)`` when the row has fewer runs (``n_runs``) than an interval needs."""
    if too_few(row.get("n_runs")):
        return runs_text(row[col], int(row["n_runs"]), pct)
    a, b = outward(row.get(lo or f"{col}_lo", np.nan), row.get(hi or f"{col}_hi", np.nan), pct)
    return f"{pct(row[col])} [{a}, {b}]"


def value(v) -> str:
    """A config value as a reader writes it: lists for tuples, integral floats as integers."""
    if isinstance(v, tuple):
        return str(list(v))
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def link_desc(lat: float, bw: float) -> str:
    """An emulated link: ``5000 us, 1 GB/s``, or ``none``."""
    if not (lat or bw):
        return "none"
    return f"{lat * 1e6:g} us" + (f", {bw / 1e9:g} GB/s" if bw else "")


def distinct(df: pd.DataFrame, col: str) -> str:
    """The distinct values of ``col`` as a reader writes them, sorted and comma-separated (``not recorded`` when
    there is none)."""
    if col not in df:
        return "not recorded"
    vals = sorted({value(tuple(v) if isinstance(v, list) else v) for v in df[col].dropna()})
    return ", ".join(vals) if vals else "not recorded"
