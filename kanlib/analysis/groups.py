"""How records split into groups that are never pooled, placements, and selecting records.

- **Configuration.** Every table groups by every config field that differs between its records
  (:func:`design`), except the study's own axes (placement, and e.g. the global batch of weak scaling) and
  bookkeeping (``repeat``, ``out_dir``, timeouts, checkpointing), and shows those fields. When records differ
  in a field that no single sweep of the study varies, the table's note says the folder holds several sweeps.
- **Host allocator.** ``host_malloc`` (steady or system) is a group field like the code version: a study resumed
  under another ``KANLIB_HOST_MALLOC`` shows both settings as groups of their own, named.
- **Placement.** ``nnodes`` x ``nproc_per_node`` is always part of a table row: two processes on one node
  (``1x2``) and on two nodes (``2x1``) are two points.
- **Bad values.** A NaN, infinite, zero or negative time never enters a median (:func:`valid` drops such
  values from frames built another way than the loader, which refuses them, and counts them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kanlib.analysis.table import Table

# Fields that never separate records: bookkeeping of a run, not what it measured.
BOOKKEEPING = ("repeat", "out_dir", "pg_timeout_s", "checkpoint_every", "study", "config_backend",
               "config_device", "record_path", "disturbed_why")
# Fields of the records that are not config fields but say what ran (values used, or the code).
RECORD_GROUP_FIELDS = ("backend", "device", "device_name", "code_version", "torch_version", "hostname",
                       "data_sha256", "host_malloc", "disturbed")
"""``disturbed``: kept disturbed runs (kanlib.analysis.load, ``disturbed="keep"``) are a group of their own.
``host_malloc``: the host allocator's setting (``KANLIB_HOST_MALLOC``) moved a one-process step from 200 to 129 ms,
so runs of different settings are never pooled (an empty value, a record older than the field, is a setting of its
own: unknown)."""
PLACEMENT_AXES = ("nnodes", "nproc_per_node")
"""The axes of a study that declares none: the placement."""


def config_fields() -> list[str]:
    """The names of every :class:`kanlib.config.RunConfig` field, in declaration order."""
    from kanlib.config import RunConfig  # torch-free; imported late so that loading this module stays cheap

    return [f.name for f in dataclasses.fields(RunConfig)]


@dataclass
class Design:
    """How a study's records split: ``groups`` are the fields that differ between records and
    separate them (each combination is analysed on its own); ``axes`` vary within a group;
    ``several_sweeps`` names group fields that no single sweep of the study varies."""

    study: str
    groups: list[str]
    axes: list[str]
    several_sweeps: list[str]
    n_groups: int
    varying: list[str] = dataclasses.field(default_factory=list)
    """The group fields that actually differ (``groups`` may add fields shown always, such as model)."""

    @property
    def note(self) -> str:
        """A sentence for tables and reports: what separates the groups ('' for one group)."""
        if self.n_groups <= 1:
            return ""
        text = (f"{self.n_groups} groups of {self.study} records differ in {', '.join(self.varying or self.groups)}; "
                f"each is analysed on its own.")
        if self.several_sweeps:
            text += (f" This folder holds several sweeps: no single {self.study} sweep varies "
                     f"{', '.join(self.several_sweeps)}.")
        return text


def hashable(v):
    """``v`` as a group key: lists become tuples (records' lists compare alike with their tuples)."""
    return tuple(v) if isinstance(v, list) else v


def varies(s: pd.Series) -> bool:
    """Whether a column holds more than one value (NaN counts as a value)."""
    return s.map(hashable).nunique(dropna=False) > 1


def design(df: pd.DataFrame, study: str, axes=PLACEMENT_AXES, swept=(), extra: tuple[str, ...] = ()) -> Design:
    """The group fields of ``df`` (records of one study): every config field, plus backend, device, device name,
    code version, torch version, host, data file content and host allocator (:data:`RECORD_GROUP_FIELDS`), that
    differs between records, except bookkeeping and the study's
    ``axes``; ``extra`` fields are added (and kept even when constant). ``swept``: what one sweep of the study
    varies; a group field outside it means the folder holds several sweeps."""
    axes = list(axes)
    # backend and device are config fields and record fields (the values used): each once
    candidates = [f for f in dict.fromkeys(config_fields() + list(RECORD_GROUP_FIELDS) + ["local_batch"])
                  if f not in BOOKKEEPING and f not in axes]
    groups = [f for f in candidates if f in df and varies(df[f])]
    groups += [f for f in extra if f not in groups and f in df]
    designed = set(swept) | {"model"}
    sweeps = [f for f in groups if f not in designed and f not in extra]
    n = int(df[groups].map(hashable).drop_duplicates().shape[0]) if groups and len(df) else 1
    return Design(study, groups, axes, sweeps, n, [f for f in groups if varies(df[f])])


def groups_of(df: pd.DataFrame, study: str, axes, swept, by=()) -> Design:
    """:func:`design` with ``by`` added, and ``model`` always a group field (every figure colours by it)."""
    d = design(df, study, axes, swept, extra=tuple(by or ()))
    if "model" in df and "model" not in d.groups and "model" not in d.axes:
        d.groups.insert(0, "model")
    return d


def finish(out: pd.DataFrame, d: Design, dropped: int, what: str) -> Table:
    """A derived table with its groups and note: what separates the groups, and how many records a bad
    ``what`` left out."""
    notes = [d.note] if d.note else []
    if dropped:
        notes.append(f"{dropped} record(s) with a NaN, infinite, zero or negative {what} were left out.")
    return Table(out, d.groups, " ".join(notes), d)


def group_label(values: dict, fields=None) -> str:
    """``"widths=[2, 32, 32, 1], global_batch=512"`` for the given group fields of a row (or dict)."""
    fields = list(values.keys()) if fields is None else list(fields)
    parts = []
    for f in fields:
        v = values[f]
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        parts.append(f"{f}={v}")
    return ", ".join(parts)


def groupby(df: pd.DataFrame, keys: list[str]):
    """``(dict of key values, sub-frame)`` per group (one group with no keys); list values hashable."""
    if not keys:
        yield {}, df
        return
    hk = df[keys].map(hashable)
    by = keys[0] if len(keys) == 1 else keys  # one key: scalar group keys (a tuple value stays one value)
    items = list(hk.groupby(by, dropna=False, sort=False).groups.items())
    try:
        items.sort(key=lambda kv: kv[0])
    except TypeError:  # mixed types in a column (None beside strings): a stable order all the same
        items.sort(key=lambda kv: repr(kv[0]))
    for key, idx in items:
        key = key if len(keys) > 1 else (key,)
        yield dict(zip(keys, key)), df.loc[idx]


def valid(df: pd.DataFrame, col: str) -> tuple[pd.DataFrame, int]:
    """Rows whose ``col`` is a finite positive number, and how many were dropped (NaN never passes)."""
    v = pd.to_numeric(df[col], errors="coerce")
    ok = np.isfinite(v.to_numpy(float)) & (v.to_numpy(float) > 0)
    return df[ok], int((~ok).sum())


# -- placements ----------------------------------------------------------------------------------
def placement_of(nnodes, nproc_per_node) -> str:
    """``"2x1"`` from nodes and processes per node."""
    return f"{int(nnodes)}x{int(nproc_per_node)}"


def with_placement(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with ``nnodes`` and ``nproc_per_node`` filled in (schema-1 records may lack them) and
    ``placement`` added."""
    df = df.copy()
    if "nnodes" not in df:
        df["nnodes"] = 1
    if "nproc_per_node" not in df:
        df["nproc_per_node"] = df["world_size"] // df["nnodes"]
    df["nnodes"] = df["nnodes"].fillna(1).astype(int)
    df["nproc_per_node"] = df["nproc_per_node"].fillna(df["world_size"] // df["nnodes"]).astype(int)
    df["placement"] = [placement_of(n, p) for n, p in zip(df["nnodes"], df["nproc_per_node"])]
    return df


def placements(g: pd.DataFrame) -> list[tuple[int, int]]:
    """The (nodes, processes per node) points of a group: by world size, then fewer nodes first."""
    pts = {(int(n), int(p)) for n, p in zip(g["nnodes"], g["nproc_per_node"])}
    return sorted(pts, key=lambda np_: (np_[0] * np_[1], np_[0]))


def placement_key(p: str) -> tuple[int, int]:
    """Sort key of a placement ``"NxP"``: world size, then fewer nodes first."""
    n, q = (int(v) for v in str(p).split("x"))
    return n * q, n


def at(g: pd.DataFrame, nodes: int, ppn: int) -> pd.DataFrame:
    """The rows of ``g`` at placement ``nodes`` x ``ppn``."""
    return g[(g["nnodes"] == nodes) & (g["nproc_per_node"] == ppn)]


def family(nodes: int) -> str:
    """Which line a placement belongs to: processes on one node, or spread over several."""
    return "one node" if nodes == 1 else "across nodes"


def emulated(df: pd.DataFrame) -> pd.Series:
    """Which rows ran through an emulated inter-node link (a latency or a bandwidth set)."""
    lat = df["emulate_latency_s"].fillna(0) if "emulate_latency_s" in df else pd.Series(0.0, index=df.index)
    bw = df["emulate_bandwidth_bytes_per_s"].fillna(0) if "emulate_bandwidth_bytes_per_s" in df else \
        pd.Series(0.0, index=df.index)
    return (lat > 0) | (bw > 0)


# -- selecting records -------------------------------------------------------------------------
def select_records(recs: pd.DataFrame, key: dict) -> pd.DataFrame:
    """The rows of ``recs`` whose fields equal ``key`` (lists and tuples compare alike; NaN matches NaN;
    a key field the frame lacks is ignored)."""
    sel = pd.Series(True, index=recs.index)
    for k, v in key.items():
        if k not in recs:
            continue
        want = hashable(v)
        col = recs[k].map(hashable)
        if isinstance(want, float) and np.isnan(want):
            sel &= col.isna()
        else:
            sel &= col.map(lambda x, w=want: x == w).astype(bool)
    return recs[sel]


def constant(df: pd.DataFrame, col: str, default):
    """The value of ``col`` when every row has the same one (``default`` when the column is missing)."""
    if col not in df:
        return default
    vals = df[col].map(hashable).dropna().unique()
    return vals[0] if len(vals) == 1 else default


def numbers(g: pd.DataFrame, col: str) -> np.ndarray:
    """``g[col]`` as a writable float array (NaN where not a number, or everywhere when missing)."""
    if col not in g:
        return np.full(len(g), np.nan)
    return np.array(pd.to_numeric(g[col], errors="coerce"), dtype=float)


def unique_text(df: pd.DataFrame, col: str) -> str:
    """The distinct values of ``col``, sorted and comma-joined ('' when the column is missing)."""
    return ",".join(sorted({str(v) for v in df[col].dropna()})) if col in df else ""


def model_label(key: dict) -> str:
    """``kan, widths=[2, 32, 1], global_batch=512`` for a group key (model first, bare): how a guideline names
    the group it answers for."""
    rest = {k: v for k, v in key.items() if k != "model"}
    head = str(key.get("model", ""))
    tail = group_label(rest)
    return ", ".join(p for p in (head, tail) if p)
