"""A user's data file (``task=file``): a CSV or ``.npz``, one parser for the pre-launch check and the full read.

:func:`csv_header`, :func:`npz_shape` and :func:`file_summary` read only a CSV's header line or an ``.npz``'s array
headers (cheap enough for ``RunConfig.validate``); :func:`read_table` reads the whole file. Every error names the
file and, where it applies, the data row (and a CSV's line) and the column.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import zipfile

import torch


def _csv_reader(f):
    """The one CSV dialect: commas, double quotes, spaces after a comma ignored (``a, b, y``)."""
    return csv.reader(f, delimiter=",", quotechar='"', skipinitialspace=True, strict=True)


def _header_from_row(row: list[str], path: str) -> list[str]:
    names = [c.strip() for c in row]
    if not names or names == [""]:
        raise ValueError(f"{path}: the first line must be a header row naming the columns, but it is empty")
    for i, n in enumerate(names):
        if not n:
            raise ValueError(f"{path}: header column {i + 1} has no name (header: {row})")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column name(s) {', '.join(map(repr, dup))} in the header")
    return names


def _open_csv(path: str):
    # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of the first column's name.
    return open(path, newline="", encoding="utf-8-sig")


def csv_header(path: str) -> list[str]:
    """The column names of a CSV file, from its first line only (the same parse :func:`read_table` uses)."""
    try:
        with _open_csv(path) as f:
            reader = _csv_reader(f)
            return _header_from_row(next(reader, []), path)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read the header line as CSV: {e}") from None


class TargetColumnError(ValueError):
    """The ``target`` column a config names is not in the file's header."""


def split_columns(names: list[str], target_column: str, path: str) -> tuple[list[int], int]:
    """Column indices of the features and of the target (``target_column``, default the last column)."""
    col = target_column or names[-1]
    if col not in names:
        raise TargetColumnError(f"{path}: no target column {col!r} (columns: {', '.join(names)})")
    t = names.index(col)
    features = [i for i in range(len(names)) if i != t]
    if not features:
        raise ValueError(f"{path}: only the target column {col!r}; a data file needs at least one feature column")
    return features, t


def _read_csv(path: str, target_column: str):
    """``(table (rows, columns) float64 ndarray, column names, feature column indices, target index, each data
    row's line of the file)``.

    The csv module splits the rows; numpy converts the whole table at once (the same conversion as
    ``float()``). Only when that fails, or a value is not finite, are the rows walked one by one to name
    the first bad value.
    """
    import numpy as np

    rows, lines = [], []
    try:
        with _open_csv(path) as f:
            reader = _csv_reader(f)
            names = _header_from_row(next(reader, []), path)
            features, t = split_columns(names, target_column, path)
            for row in reader:
                if row:  # a blank line is not a data row
                    rows.append(row)
                    lines.append(reader.line_num)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read as CSV: {e}") from None
    if not rows:
        raise ValueError(f"{path}: no data rows after the header")
    try:
        table = np.asarray(rows, dtype=np.float64) if all(len(r) == len(names) for r in rows) else None
    except ValueError:
        table = None
    if table is None or not np.isfinite(table).all():
        _raise_first_bad_value(path, names, rows, lines)
    return table, names, features, t, lines


def _raise_first_bad_value(path: str, names: list[str], rows: list[list[str]], lines: list[int]) -> None:
    """Raise the error of the first row, in file order, with the wrong number of values or a value that
    is empty, not a number, or not finite (inf, -inf, nan)."""
    for i, (row, line) in enumerate(zip(rows, lines)):
        where = f"{path}: data row {i + 1} (line {line} of the file)"
        if len(row) != len(names):
            raise ValueError(f"{where} has {len(row)} values, but the header has {len(names)} columns "
                             f"({', '.join(names)})")
        for name, cell in zip(names, row):
            cell = cell.strip()
            if not cell:
                raise ValueError(f"{where}, column {name!r}: empty value")
            try:
                v = float(cell)
            except ValueError:
                raise ValueError(f"{where}, column {name!r}: {cell!r} is not a number") from None
            if not math.isfinite(v):
                raise ValueError(f"{where}, column {name!r}: {cell!r} is not a finite number")
    raise AssertionError(f"{path}: numpy refused the table but every value reads as a finite number")


def _npy_header(zf: zipfile.ZipFile, key: str, path: str):
    """``(shape, dtype)`` of array ``key`` of an .npz, read from the .npy header only."""
    import numpy as np

    with zf.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # rare (3.0: non-latin-1 field names); read the array itself
            with np.load(path, allow_pickle=False) as z:
                a = z[key]
                shape, dtype = a.shape, a.dtype
    return tuple(shape), dtype


def _check_npz_arrays(path: str, x_shape, x_dtype, y_shape, y_dtype) -> None:
    import numpy as np

    for key, dtype in (("x", x_dtype), ("y", y_dtype)):
        if not (np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)):
            raise ValueError(f"{path}: array {key!r} must be numeric, got dtype {dtype}")
    if len(x_shape) != 2:
        raise ValueError(f"{path}: array 'x' must be 2-D (rows, features), got shape {x_shape}")
    if not (len(y_shape) == 1 or (len(y_shape) == 2 and y_shape[1] == 1)):
        raise ValueError(f"{path}: array 'y' must have shape (rows,) or (rows, 1), got {y_shape}")
    if x_shape[0] != y_shape[0]:
        raise ValueError(f"{path}: x has {x_shape[0]} rows but y has {y_shape[0]}")
    if x_shape[0] == 0 or x_shape[1] == 0:
        raise ValueError(f"{path}: array 'x' has shape {x_shape}: no rows or no features")


def npz_shape(path: str) -> tuple[int, int]:
    """``(rows, features)`` of an .npz data file, from its array headers only (never the data)."""
    try:
        with zipfile.ZipFile(path) as zf:
            files = sorted(n[:-4] for n in zf.namelist() if n.endswith(".npy"))
            if "x" not in files or "y" not in files:
                raise ValueError(f"{path}: an .npz data file needs arrays 'x' and 'y', has {files}")
            xs, xd = _npy_header(zf, "x", path)
            ys, yd = _npy_header(zf, "y", path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path}: not a readable .npz file: {e}") from None
    _check_npz_arrays(path, xs, xd, ys, yd)
    return xs[0], xs[1]


def _first_non_finite(a, path: str, key: str, names: list[str] | None = None) -> None:
    import numpy as np

    bad = np.argwhere(~np.isfinite(a))
    if len(bad):
        r, c = (int(bad[0][0]), int(bad[0][1])) if a.ndim == 2 else (int(bad[0][0]), 0)
        column = f"column {c + 1} ({names[c]})" if names else "the target"
        index = f"{key}[{r}, {c}]" if a.ndim == 2 else f"{key}[{r}]"
        raise ValueError(f"{path}: data row {r + 1}, {column}: {a[(r, c) if a.ndim == 2 else r]} is not a finite "
                         f"number (array {index})")


def read_table(path: str, target_column: str = "") -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Features and target of a data file: ``x (n, d)``, ``y (n, 1)`` as float64, and the feature names.

    CSV: a header row (names may be quoted; spaces after commas are ignored) and numeric columns;
    ``target_column`` (default: the last column) is the target, every other column a feature. Blank lines
    are skipped. NPZ: arrays ``x`` (n, d) and ``y`` (n,) or (n, 1); feature names ``x0 .. x{d-1}``.
    A missing, non-numeric or non-finite value (inf, -inf, nan, empty), or a row with the wrong number
    of values, is an error naming the file, the data row (and for CSV the line) and the column.
    """
    x, y, names, _, _ = read_table_with_lines(path, target_column)
    return x, y, names


def read_table_with_lines(path: str, target_column: str):
    """:func:`read_table`'s ``x, y, feature names``, the target's name, and each data row's line of the file (CSV;
    None for NPZ, whose rows are array rows): what kanlib.data needs to name a bad row."""
    import numpy as np

    if path.endswith(".npz"):
        npz_shape(path)  # shapes and dtypes, with the same messages as the pre-launch check
        with np.load(path, allow_pickle=False) as z:
            x, y = np.asarray(z["x"], dtype=np.float64), np.asarray(z["y"], dtype=np.float64).reshape(-1, 1)
        names = [f"x{i}" for i in range(x.shape[1])]
        _first_non_finite(x, path, "x", names)
        _first_non_finite(y[:, 0], path, "y")
        return torch.from_numpy(x), torch.from_numpy(y), names, "y", None
    table, names, features, t, lines = _read_csv(path, target_column)
    return (torch.from_numpy(np.ascontiguousarray(table[:, features])),
            torch.from_numpy(np.ascontiguousarray(table[:, [t]])), [names[i] for i in features], names[t], lines)


@functools.lru_cache(maxsize=64)
def file_summary(path: str, target_column: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], int | None]:
    """``(feature names, rows or None)`` of a data file from its header only; cached per file version."""
    if path.endswith(".npz"):
        rows, d = npz_shape(path)
        return tuple(f"x{i}" for i in range(d)), rows
    names = csv_header(path)
    features, _ = split_columns(names, target_column, path)
    return tuple(names[i] for i in features), None  # counting CSV rows would read the whole file


def file_features(path: str, target_column: str = "") -> list[str]:
    """Feature names of a data file, reading only its header line (CSV) or array headers (NPZ)."""
    st = os.stat(path)
    return list(file_summary(path, target_column, st.st_mtime_ns, st.st_size)[0])


@functools.lru_cache(maxsize=64)
def csv_rows(path: str, mtime_ns: int, size: int) -> int:
    """Data rows of a CSV file (blank lines are not rows), without converting a value; cached per file version."""
    try:
        with _open_csv(path) as f:
            reader = _csv_reader(f)
            next(reader, None)  # the header
            return sum(1 for row in reader if row)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read as CSV: {e}") from None
