"""Analysis of result records: loading them into tidy DataFrames, and the derived quantities of the
study (speedup, efficiency, Karp-Flatt, Amdahl fits, bootstrap intervals, exposed communication).

Runtime code never imports this module (a rank imports no pandas); what a run writes is defined in
kanlib.records. Derived quantities are computed here from records and never stored in them.

Nothing is pooled that should not be:

- **Code.** Records of different code (``code_version``; schema-1 records, which have none, count as
  the version ``unknown``) are never pooled. By default :func:`load_records` keeps, per study, the
  records of the newest code version (the one whose latest run finished last) and names what it left
  out in ``df.attrs['left_out']``; ``code="all"`` keeps every version as a group of its own.
- **Configuration.** Every table groups by every config field that differs between its records
  (:func:`design`), except the study's own axes (placement, and e.g. the global batch of weak
  scaling) and bookkeeping (``repeat``, ``out_dir``, timeouts, checkpointing), and shows those fields.
  When records differ in a field that no single sweep of the study varies, the table's
  ``attrs['note']`` says the folder holds several sweeps.
- **Placement.** ``nnodes`` x ``nproc_per_node`` is always part of a table row: two processes on one
  node (``1x2``) and on two nodes (``2x1``) are two points.
- **Bad values.** A NaN, infinite, zero or negative time never enters a median (the loader refuses
  such records already; the tables drop such values from frames built another way and count them).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kanlib.records import (MANIFEST_NAME, RECORD_NAME, STEP_COLUMNS, STEPS_NAME, RecordError, check_record,
                            read_manifest_rows, read_steps_rows)


class NoRecordsError(FileNotFoundError):
    """No record was found under the given folder."""


UNKNOWN_CODE = "unknown"
"""The code version of records written before ``code_version`` existed (schema 1)."""

CODE_POLICIES = ("newest", "all")


# -- loading -------------------------------------------------------------------------------
def find_record_files(root: str) -> list[str]:
    """Every ``record.json`` below ``root`` (sorted)."""
    return sorted(glob.glob(os.path.join(root, "**", RECORD_NAME), recursive=True))


def load_records(root: str, study: str | None = None, strict: bool = False, code: str = "newest") -> pd.DataFrame:
    """All run records under ``root`` as one row each (nested ``env`` flattened as ``env.X``).

    A record that cannot be read (truncated, not JSON, not an object) or fails
    :func:`kanlib.records.check_record` (unknown schema version, a NaN, zero or negative step time,
    a non-numeric measurement) is skipped and named in ``df.attrs['bad']`` as ``(file, line, reason)``
    with a warning; with ``strict=True`` it raises :class:`RecordError`. No record at all raises
    :class:`NoRecordsError` saying where it looked.

    ``code`` chooses which code versions are kept: ``"newest"`` (default) keeps, per study, only the
    records of the code version whose last run finished latest; ``"all"`` keeps every version (the
    tables then group by ``code_version``); any other string keeps that ``code_version`` only.
    ``df.attrs['left_out']`` lists what was left out as dicts (study, code_version, git_sha, n_records)
    and ``df.attrs['code_note']`` says it in one sentence (empty when nothing was left out).
    Every row carries ``code_version`` (``"unknown"`` for schema-1 records) and ``record_path``.
    """
    if not isinstance(code, str) or not code:
        raise ValueError(f"code: expected 'newest', 'all' or a code_version string, got {code!r}")
    files = find_record_files(root)
    rows, bad = [], []
    for path in files:
        try:
            with open(path) as f:
                text = f.read()
            rec = json.loads(text)
            if isinstance(rec, dict) and rec.get("record_kind", "train") != "train":
                continue  # a collective benchmark's record (kanlib.collbench.load_bench reads those)
            why = check_record(rec)
            if why:
                raise ValueError(why)
        except (OSError, ValueError) as e:
            line = getattr(e, "lineno", None)
            reason = getattr(e, "msg", None) or str(e)
            if strict:
                raise RecordError(f"{path}" + (f", line {line}" if line else "") + f": {reason}") from e
            bad.append((path, line, reason))
            continue
        if study is not None and rec.get("study") != study:
            continue
        row = _flatten(rec)
        row["code_version"] = row.get("code_version") or UNKNOWN_CODE
        row["record_path"] = path
        rows.append(row)
    if bad:
        warnings.warn(f"skipped {len(bad)} unreadable record(s): "
                      + "; ".join(f"{p} line {ln}: {r}" for p, ln, r in bad), stacklevel=2)
    if not rows:
        what = f" of study {study!r}" if study else ""
        raise NoRecordsError(f"no records{what} under {os.path.abspath(root)}"
                             + (f" ({len(bad)} unreadable)" if bad else ""))
    df = pd.DataFrame(rows)
    df, left_out = select_code(df, code)
    if df.empty:
        raise NoRecordsError(f"no records of code_version {code!r} under {os.path.abspath(root)} "
                             f"(have: {', '.join(sorted({d['code_version'] for d in left_out}))})")
    sort = [c for c in ("study", "world_size", "nnodes", "repeat") if c in df]
    df = df.sort_values(sort, kind="stable").reset_index(drop=True)
    df.attrs["bad"] = bad
    df.attrs["left_out"] = left_out
    df.attrs["code_note"] = code_note(left_out)
    df.attrs["code"] = code
    return df


def select_code(df: pd.DataFrame, code: str = "newest") -> tuple[pd.DataFrame, list[dict]]:
    """The rows of ``df`` kept by the code policy ``code`` (see :func:`load_records`), and what was left out."""
    if code == "all" or "code_version" not in df:
        return df, []
    keep = pd.Series(False, index=df.index)
    studies = df["study"] if "study" in df else pd.Series("", index=df.index)
    for s in studies.unique():
        sel = studies == s
        if code == "newest":
            # the version whose latest run finished last (schema-1 records may lack finished_at)
            when = df.loc[sel, "finished_at"] if "finished_at" in df else pd.Series("", index=df.index[sel])
            when = when.fillna("").astype(str)
            if "started_at" in df:
                when = when.where(when != "", df.loc[sel, "started_at"].fillna("").astype(str))
            newest = when.groupby(df.loc[sel, "code_version"]).max().sort_values(kind="stable").index[-1]
            keep |= sel & (df["code_version"] == newest)
        else:
            keep |= sel & (df["code_version"] == code)
    out = df[~keep]
    left = []
    for (s, cv), g in out.groupby([studies[~keep], out["code_version"]], sort=True):
        shas = sorted({str(v) for v in g.get("git_sha", pd.Series(["unknown"])).fillna("unknown")})
        left.append({"study": s, "code_version": cv, "git_sha": ", ".join(shas), "n_records": int(len(g))})
    return df[keep], left


def code_note(left_out: list[dict]) -> str:
    """One sentence naming the records left out by the code policy ('' when none were)."""
    if not left_out:
        return ""
    parts = [f"{d['n_records']} {d['study']} record(s) of code_version {d['code_version']} (git {d['git_sha']})"
             for d in left_out]
    return ("Left out records of other code (never pooled with the newest; load with code='all' to see them "
            "as separate groups): " + "; ".join(parts) + ".")


def load_steps(run_dir: str) -> pd.DataFrame:
    """The per-step rows of one run (long format).

    A last line cut short by a crash is dropped and named in ``df.attrs['bad']`` as
    ``(file, line, reason)``; so is any other row that cannot be read.
    """
    path = os.path.join(run_dir, STEPS_NAME)
    rows, bad = read_steps_rows(path)
    df = pd.DataFrame(rows, columns=STEP_COLUMNS)
    for c in STEP_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.astype({"step": "int64", "measured": "int64"})
    df["attempt"] = df["attempt"].fillna(0).astype("int64")
    df.attrs["bad"] = bad
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable row(s): "
                      + "; ".join(f"line {ln}: {r}" for _, ln, r in bad), stacklevel=2)
    return df


def load_manifest(path: str) -> pd.DataFrame:
    """Rows of a manifest (or of ``<dir>/manifest.jsonl``) as a DataFrame, in the order written.

    Lines that are not JSON objects (a last line cut short, garbage) are skipped and named in
    ``df.attrs['bad']`` as ``(file, line, reason)``. A missing file gives an empty frame.
    """
    if os.path.isdir(path):
        path = os.path.join(path, MANIFEST_NAME)
    rows, bad = read_manifest_rows(path)
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable line(s): "
                      + "; ".join(f"line {ln}: {r}" for _, ln, r in bad), stacklevel=2)
    df = pd.DataFrame(rows, columns=None if rows else ["run_key", "status"])
    df.attrs["bad"] = bad
    return df


def _flatten(rec: dict) -> dict:
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        elif isinstance(v, list):
            out[k] = tuple(v)
        else:
            out[k] = v
    return out



# -- statistics ----------------------------------------------------------------------------
def bootstrap_ci(values, stat=np.median, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile bootstrap interval of ``stat`` over ``values``: ``(low, high)``.

    With one value the interval is that value on both sides (no spread can be estimated).
    """
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return float("nan"), float("nan")
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    boots = stat(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(boots, alpha)), float(np.quantile(boots, 1 - alpha))


def karp_flatt(speedup, n):
    """Experimentally determined serial fraction ``e = (1/S - 1/N) / (1 - 1/N)`` (NaN at N = 1)."""
    s = np.asarray(speedup, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 1, (1 / s - 1 / n) / (1 - 1 / n), np.nan)


def amdahl_speedup(n, serial_fraction):
    """Amdahl's law ``S(N) = 1 / (s + (1 - s) / N)``."""
    n = np.asarray(n, dtype=float)
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def fit_amdahl(n, speedup) -> float:
    """Least-squares serial fraction ``s`` in [0, 1] of Amdahl's law through the points (N, S).

    Linear in ``u = 1/S = s (1 - 1/N) + 1/N``, so ``s`` has a closed form.
    """
    n = np.asarray(n, dtype=float)
    s = np.asarray(speedup, dtype=float)
    a = 1 - 1 / n
    y = 1 / s - 1 / n
    if not np.any(a > 0):
        return float("nan")
    return float(np.clip(np.sum(a * y) / np.sum(a * a), 0.0, 1.0))


# -- groups ----------------------------------------------------------------------------------
# Fields that never separate records: bookkeeping of a run, not what it measured.
BOOKKEEPING = ("repeat", "out_dir", "pg_timeout_s", "checkpoint_every", "study", "config_backend",
               "config_device", "record_path")
# Fields of the records that are not config fields but say what ran (values used, or the code).
RECORD_GROUP_FIELDS = ("backend", "device", "device_name", "code_version")
# Each study's axes: what varies along a table's rows or a figure's x axis, within a group.
STUDY_AXES = {
    "strong_scaling": ("nnodes", "nproc_per_node"),
    # global batch = per-process batch x N; the per-process batch (local_batch) is the group field
    "weak_scaling": ("nnodes", "nproc_per_node", "global_batch"),
    # the no-op run is each point's reference; emulation applies to the hooked runs only
    "communication": ("comm_hook", "emulate_latency_s", "emulate_bandwidth_bytes_per_s", "nnodes",
                      "nproc_per_node", "bucket_cap_mb", "nccl_algo"),
    "model_size": ("model", "widths", "grid_size"),
    # a strong series shares a global batch, a weak one a per-process batch (time_to_accuracy_table finds both)
    "time_to_accuracy": ("nnodes", "nproc_per_node", "global_batch", "local_batch", "n_train", "lr_base_batch"),
    "compounding": ("nnodes", "nproc_per_node", "kan_impl"),
}
# What one sweep of each study varies (runners/studies.py); records that differ in anything else
# come from several sweeps.
STUDY_DESIGN = {
    "strong_scaling": ("nnodes", "nproc_per_node", "global_batch", "widths", "n_train"),
    "weak_scaling": ("nnodes", "nproc_per_node", "global_batch", "local_batch"),
    "communication": ("nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo", "comm_hook",
                      "emulate_latency_s", "emulate_bandwidth_bytes_per_s", "grad_accum_steps",
                      "gradient_as_bucket_view", "static_graph", "powersgd_rank"),
    "model_size": ("model", "widths", "grid_size", "parallelism"),
    "time_to_accuracy": ("nnodes", "nproc_per_node", "global_batch", "lr_rule", "lr_base_batch", "n_train"),
    "compounding": ("nnodes", "nproc_per_node", "kan_impl"),
}


def config_fields() -> list[str]:
    """The names of every :class:`kanlib.config.RunConfig` field, in declaration order."""
    from kanlib.config import RunConfig

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


def _varies(s: pd.Series) -> bool:
    return s.map(_hashable).nunique(dropna=False) > 1


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def design(df: pd.DataFrame, study: str | None = None, extra: tuple[str, ...] = ()) -> Design:
    """The group fields of ``df`` (records of one study): every config field, plus backend, device,
    device name and code version, that differs between records, except bookkeeping and the study's
    axes; ``extra`` fields are added (and kept even when constant)."""
    study = study or (str(df["study"].iloc[0]) if "study" in df and len(df) else "")
    axes = list(STUDY_AXES.get(study, ("nnodes", "nproc_per_node")))
    # backend and device are config fields and record fields (the values used): each once
    candidates = [f for f in dict.fromkeys(config_fields() + list(RECORD_GROUP_FIELDS) + ["local_batch"])
                  if f not in BOOKKEEPING and f not in axes]
    groups = [f for f in candidates if f in df and _varies(df[f])]
    groups += [f for f in extra if f not in groups and f in df]
    designed = set(STUDY_DESIGN.get(study, ())) | {"model"}
    sweeps = [f for f in groups if f not in designed and f not in extra]
    n = int(df[groups].map(_hashable).drop_duplicates().shape[0]) if groups and len(df) else 1
    return Design(study, groups, axes, sweeps, n, [f for f in groups if _varies(df[f])])


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


def _groupby(df: pd.DataFrame, keys: list[str]):
    """``(dict of key values, sub-frame)`` per group (one group with no keys); list values hashable."""
    if not keys:
        yield {}, df
        return
    hk = df[keys].map(_hashable)
    by = keys[0] if len(keys) == 1 else keys  # one key: scalar group keys (a tuple value stays one value)
    items = list(hk.groupby(by, dropna=False, sort=False).groups.items())
    try:
        items.sort(key=lambda kv: kv[0])
    except TypeError:  # mixed types in a column (None beside strings): a stable order all the same
        items.sort(key=lambda kv: repr(kv[0]))
    for key, idx in items:
        key = key if len(keys) > 1 else (key,)
        yield dict(zip(keys, key)), df.loc[idx]


def _valid(df: pd.DataFrame, col: str) -> tuple[pd.DataFrame, int]:
    """Rows whose ``col`` is a finite positive number, and how many were dropped (NaN never passes)."""
    v = pd.to_numeric(df[col], errors="coerce")
    ok = np.isfinite(v.to_numpy(float)) & (v.to_numpy(float) > 0)
    return df[ok], int((~ok).sum())


def placement_of(nnodes, nproc_per_node) -> str:
    """``"2x1"`` from nodes and processes per node."""
    return f"{int(nnodes)}x{int(nproc_per_node)}"


def _placement_cols(df: pd.DataFrame) -> pd.DataFrame:
    """``nnodes`` and ``nproc_per_node`` filled in (schema-1 records may lack them), ``placement`` added."""
    df = df.copy()
    if "nnodes" not in df:
        df["nnodes"] = 1
    if "nproc_per_node" not in df:
        df["nproc_per_node"] = df["world_size"] // df["nnodes"]
    df["nnodes"] = df["nnodes"].fillna(1).astype(int)
    df["nproc_per_node"] = df["nproc_per_node"].fillna(df["world_size"] // df["nnodes"]).astype(int)
    df["placement"] = [placement_of(n, p) for n, p in zip(df["nnodes"], df["nproc_per_node"])]
    return df


def _placements(g: pd.DataFrame) -> list[tuple[int, int]]:
    """The (nodes, processes per node) points of a group: by world size, then fewer nodes first."""
    pts = {(int(n), int(p)) for n, p in zip(g["nnodes"], g["nproc_per_node"])}
    return sorted(pts, key=lambda np_: (np_[0] * np_[1], np_[0]))


def placement_key(p: str) -> tuple[int, int]:
    """Sort key of a placement ``"NxP"``: world size, then fewer nodes first."""
    n, q = (int(v) for v in str(p).split("x"))
    return n * q, n


def _at(g: pd.DataFrame, nodes: int, ppn: int) -> pd.DataFrame:
    return g[(g["nnodes"] == nodes) & (g["nproc_per_node"] == ppn)]


def _family(nodes: int) -> str:
    """Which line a placement belongs to: processes on one node, or spread over several."""
    return "one node" if nodes == 1 else "across nodes"


def _median_ci(v, n_boot: int, seed: int) -> tuple[float, float, float]:
    lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
    return float(np.median(v)), lo, hi


def _boot_medians(v: np.ndarray, rng, n_boot: int) -> np.ndarray:
    """``n_boot`` bootstrap medians of ``v``."""
    return np.median(v[rng.integers(0, v.size, (n_boot, v.size))], axis=1)


def _q(a: np.ndarray) -> tuple[float, float]:
    a = a[np.isfinite(a)]
    if a.size == 0:
        return float("nan"), float("nan")
    return float(np.quantile(a, 0.025)), float(np.quantile(a, 0.975))


def _finish(out: pd.DataFrame, d: Design, dropped: int, what: str) -> pd.DataFrame:
    notes = [d.note] if d.note else []
    if dropped:
        notes.append(f"{dropped} record(s) with a NaN, infinite, zero or negative {what} were left out.")
    out.attrs["group_fields"] = d.groups
    out.attrs["design"] = d
    out.attrs["note"] = " ".join(notes)
    return out


def _groups_of(df: pd.DataFrame, study: str, by) -> Design:
    d = design(df, study, extra=tuple(by or ()))
    if "model" in df and "model" not in d.groups and "model" not in d.axes:
        d.groups.insert(0, "model")  # always shown: every figure colours by it
    return d


def scaling_table(df: pd.DataFrame, metric: str = "step_time_s", by: tuple[str, ...] | None = None,
                  n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Strong-scaling table: one row per (group, placement) with the median of ``metric`` over
    repeats, its bootstrap 95% interval, the speedup ``T(N0) / T(N) * N0`` (interval from resampling
    both), the efficiency ``S / N`` (with its interval) and the Karp-Flatt serial fraction.

    Groups are every config field that differs between the records (:func:`design`), plus ``by``.
    ``N0`` is the group's smallest world size (normally 1; on the fewest nodes when several
    placements have it). Placements stay apart: ``1x2`` and ``2x1`` are two rows at N = 2.
    ``work_per_process_s = T(N0) N0 / N`` is the compute a process would do at N with perfect scaling
    (the x axis of "efficiency against work per process"). Columns: the group fields, ``world_size``,
    ``nnodes``, ``nproc_per_node``, ``placement``, ``inter_node``, ``n_runs``, ``<metric>`` with
    ``_lo``/``_hi``, ``speedup``/``_lo``/``_hi``, ``efficiency``/``_lo``/``_hi``, ``karp_flatt``,
    ``local_batch``, ``work_per_process_s``. ``attrs['note']`` says what separates the groups.
    """
    if metric not in df:
        raise KeyError(f"column {metric!r} is not in the records (have: {', '.join(df.columns)})")
    df, dropped = _valid(_placement_cols(df), metric)
    d = _groups_of(df, "strong_scaling", by)
    rows = []
    for key, g in _groupby(df, d.groups):
        rng = np.random.default_rng(seed)  # each group's interval depends on its own data only
        pts = _placements(g)
        n0_nodes, n0_ppn = pts[0]
        n0 = n0_nodes * n0_ppn
        base = _at(g, n0_nodes, n0_ppn)[metric].to_numpy(float)
        t0 = float(np.median(base))
        for nodes, ppn in pts:
            n = nodes * ppn
            at = _at(g, nodes, ppn)
            v = at[metric].to_numpy(float)
            med, lo, hi = _median_ci(v, n_boot, seed)
            sp = t0 / med * n0
            if (nodes, ppn) == (n0_nodes, n0_ppn):  # the baseline's speedup is n0 by definition
                sp_lo = sp_hi = sp
            else:
                sp_lo, sp_hi = (x * n0 for x in _q(_boot_medians(base, rng, n_boot) / _boot_medians(v, rng, n_boot)))
            gb = int(at["global_batch"].iloc[0]) if "global_batch" in at else 0
            work = {k: at[k].iloc[0] for k in ("widths", "global_batch") if k in at and k not in key}
            rows.append({**key, **work, "world_size": n, "nnodes": nodes, "nproc_per_node": ppn,
                         "placement": placement_of(nodes, ppn), "inter_node": nodes > 1, "n_runs": int(v.size),
                         metric: med, f"{metric}_lo": lo, f"{metric}_hi": hi,
                         "speedup": sp, "speedup_lo": sp_lo, "speedup_hi": sp_hi,
                         "efficiency": sp / n, "efficiency_lo": sp_lo / n, "efficiency_hi": sp_hi / n,
                         "local_batch": gb // n if gb else np.nan, "work_per_process_s": t0 * n0 / n})
    out = pd.DataFrame(rows)
    if not out.empty:
        out["karp_flatt"] = karp_flatt(out["speedup"], out["world_size"])
    return _finish(out, d, dropped, metric)


def weak_scaling_table(df: pd.DataFrame, by: tuple[str, ...] | None = None, n_boot: int = 2000,
                       seed: int = 0) -> pd.DataFrame:
    """Weak scaling at a fixed per-process batch: per (group, placement) the median throughput
    ``X(N) = global_batch / T(N)`` with its bootstrap interval, the per-process throughput ``X(N) / N``,
    the weak-scaling efficiency ``E_w = X(N) N0 / (N X(N0))`` against the group's smallest world size
    ``N0`` (with a bootstrap interval), and ``E_w,multi = X(N) N1 / (N X(N1))`` against the first
    multi-process point ``N1`` of the same kind of placement (one node, or across nodes): the
    published study saw a drop from 1 to several GPUs, then stability.

    Groups: the per-process batch ``local_batch`` and every other config field that differs (model,
    widths, ...), never only the batch. NaN for ``E_w,multi`` where it is not defined.
    """
    df, dropped = _valid(_placement_cols(df), "step_time_s")
    df["local_batch"] = df["global_batch"] // df["world_size"]
    df["throughput"] = df["global_batch"] / df["step_time_s"]
    d = _groups_of(df, "weak_scaling", tuple(by or ()) + ("local_batch",))
    rows = []
    for key, g in _groupby(df, d.groups):
        rng = np.random.default_rng(seed)
        pts = _placements(g)
        x = {p: _at(g, *p)["throughput"].to_numpy(float) for p in pts}
        p0 = pts[0]
        n0 = p0[0] * p0[1]
        x0 = float(np.median(x[p0]))
        boot0 = _boot_medians(x[p0], rng, n_boot)
        first_multi = {}
        for p in pts:
            fam = _family(p[0])
            if p[0] * p[1] > 1 and fam not in first_multi:
                first_multi[fam] = p
        for p in pts:
            n = p[0] * p[1]
            med, lo, hi = _median_ci(x[p], n_boot, seed)
            if p == p0:
                e_lo = e_hi = 1.0 * n0 / n * med / x0
            else:
                e_lo, e_hi = _q(_boot_medians(x[p], rng, n_boot) * n0 / (n * boot0))
            p1 = first_multi.get(_family(p[0]))
            multi = np.nan
            if p1 is not None and n >= p1[0] * p1[1]:
                n1 = p1[0] * p1[1]
                multi = med * n1 / (n * float(np.median(x[p1])))
            rows.append({**key, "world_size": n, "nnodes": p[0], "nproc_per_node": p[1],
                         "placement": placement_of(*p), "inter_node": p[0] > 1, "n_runs": int(x[p].size),
                         "throughput": med, "throughput_lo": lo, "throughput_hi": hi,
                         "per_process_throughput": med / n,
                         "weak_efficiency": med * n0 / (n * x0), "weak_efficiency_lo": e_lo,
                         "weak_efficiency_hi": e_hi, "weak_efficiency_multi": multi})
    return _finish(pd.DataFrame(rows), d, dropped, "step_time_s")


# The fields that identify a communication point besides its group fields (always table columns).
COMM_KEYS = ("world_size", "nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo", "model", "widths",
             "global_batch", "grid_size", "kan_impl")


def communication_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Exposed communication by the no-op-hook method, per point (group, placement, bucket size, NCCL
    algorithm) and communication hook.

    Each point needs runs with a real communication hook (``timed``, or ``bf16``/``fp16``/``powersgd``,
    each bucket timed; possibly through an emulated link) and runs with ``comm_hook='noop'`` (same
    bucketing, no network). With medians over repeats:

    - ``t_allreduce_s``: step time with the hook's communication; ``t_noop_s``: step time without it;
    - ``comm_total_s``: summed bucket communication time per step (includes queueing and waiting);
    - ``exposed_raw_s = t_allreduce_s - t_noop_s``: the communication the step waits for;
    - ``exposed_s``: the same clipped to ``[0, comm_total_s]`` (outside it is timing noise;
      ``exposed_clipped`` says when that happened);
    - ``overlap_s = comm_total_s - exposed_s``; ``overlap_fraction = overlap_s / comm_total_s``;
    - ``overhead_fraction = exposed_s / t_allreduce_s`` (the study's 'communication overhead'), with a
      bootstrap interval ``overhead_lo``/``overhead_hi`` resampling both kinds of run (of the difference
      clipped at 0 only, so the no-op runs' noise shows; it always holds the point);
    - ``compute_s = t_allreduce_s - exposed_s``.

    Groups are every other config field that differs (grid size, ``kan_impl``, widths, ...).
    """
    need = {"noop"}
    have = set(df["comm_hook"].unique()) if "comm_hook" in df else set()
    hooks = sorted(have - {"noop", "default"})
    if not need <= have or not hooks:
        raise KeyError("communication_table needs runs with comm_hook 'noop' and with a timed hook "
                       f"('timed', 'bf16', 'fp16' or 'powersgd'); have {sorted(have)}")
    df, dropped = _valid(_placement_cols(df), "step_time_s")
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        if c not in df:
            df[c] = 0.0
    d = _groups_of(df, "communication", ())
    point = list(dict.fromkeys(d.groups + [k for k in ("nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo")
                                           if k in df]))
    rows = []
    for key, g in _groupby(df, point):
        rng = np.random.default_rng(seed)
        z = g[g["comm_hook"] == "noop"]
        if z.empty:
            continue
        tz = z["step_time_s"].to_numpy(float)
        tn, tn_lo, tn_hi = _median_ci(tz, n_boot, seed)
        hooked = g[~g["comm_hook"].isin(["noop", "default"])]
        for hk, t in _groupby(hooked, ["comm_hook", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]):
            ta_v = t["step_time_s"].to_numpy(float)
            ta, ta_lo, ta_hi = _median_ci(ta_v, n_boot, seed)
            ct_v = pd.to_numeric(t["comm_total_s"], errors="coerce").to_numpy(float) if "comm_total_s" in t \
                else np.full(len(t), np.nan)
            ct = float(np.nanmedian(ct_v)) if np.isfinite(ct_v).any() else float("nan")
            raw = ta - tn
            exposed = float(np.clip(raw, 0.0, ct)) if np.isfinite(ct) else max(raw, 0.0)
            bt, bz = _boot_medians(ta_v, rng, n_boot), _boot_medians(tz, rng, n_boot)
            # The interval is that of the unclipped difference (clipped at 0 only), widened to hold the point:
            # clipping the bootstrap at comm_total_s too collapsed it onto that bound whenever the no-op runs
            # were noisy ("27% [27%, 28%]" where two runs of the same point measured 20% and 28%).
            ov_lo, ov_hi = _q(np.clip(bt - bz, 0.0, None) / bt)
            ov_lo, ov_hi = min(ov_lo, exposed / ta), max(ov_hi, exposed / ta)
            n = int(key["nnodes"]) * int(key["nproc_per_node"])
            rows.append({**key, **hk, "world_size": n, "placement": placement_of(key["nnodes"], key["nproc_per_node"]),
                         "inter_node": int(key["nnodes"]) > 1, "n_runs": int(min(len(t), len(z))),
                         "t_allreduce_s": ta, "t_allreduce_lo": ta_lo, "t_allreduce_hi": ta_hi,
                         "t_noop_s": tn, "t_noop_lo": tn_lo, "t_noop_hi": tn_hi,
                         "comm_total_s": ct, "exposed_raw_s": raw, "exposed_s": exposed,
                         "exposed_clipped": bool(exposed != raw),
                         "overlap_s": ct - exposed,
                         "overlap_fraction": (ct - exposed) / ct if ct > 0 else np.nan,
                         "overhead_fraction": exposed / ta, "overhead_lo": ov_lo, "overhead_hi": ov_hi,
                         "compute_s": ta - exposed})
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["world_size", "nnodes", "bucket_cap_mb"], kind="stable").reset_index(drop=True)
    return _finish(out, d, dropped, "step_time_s")


def model_size_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Model-size scaling: per (group, model, widths, grid size) the parameter count, median step time
    with its interval, peak memory, ``params_per_byte = n_params / peak_mem_bytes``,
    ``params_per_state_byte = n_params / model_state_bytes`` and ``time_per_param_s = step_time / n_params``.
    Groups: every other config field that differs (parallelism, placement, batch, ...).
    """
    df, dropped = _valid(_placement_cols(df), "step_time_s")
    d = _groups_of(df, "model_size", ())
    keys = list(dict.fromkeys(d.groups + [k for k in ("model", "widths", "grid_size", "spline_order",
                                                      "nnodes", "nproc_per_node") if k in df]))
    rows = []
    for key, g in _groupby(df, keys):
        st, lo, hi = _median_ci(g["step_time_s"].to_numpy(float), n_boot, seed)
        n = int(g["n_params"].iloc[0])
        mem = float(np.median(g["peak_mem_bytes"].to_numpy(float)))
        state = float(g["model_state_bytes"].iloc[0]) if "model_state_bytes" in g else np.nan
        val = pd.to_numeric(g["final_val_loss"], errors="coerce") if "final_val_loss" in g else pd.Series([np.nan])
        rows.append({**key, "placement": placement_of(key["nnodes"], key["nproc_per_node"]), "n_runs": len(g),
                     "world_size": int(key["nnodes"]) * int(key["nproc_per_node"]),
                     "final_val_loss": float(val.median()) if val.notna().any() else np.nan,
                     "n_params": n, "depth": len(key["widths"]) - 1 if "widths" in key else np.nan,
                     "step_time_s": st, "step_time_lo": lo, "step_time_hi": hi,
                     "peak_mem_bytes": mem, "model_state_bytes": state,
                     "params_per_byte": n / mem if mem > 0 else np.nan,
                     "params_per_state_byte": n / state if state > 0 else np.nan,
                     "time_per_param_s": st / n if n > 0 else np.nan})
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["model", "n_params"], kind="stable").reset_index(drop=True)
    return _finish(out, d, dropped, "step_time_s")


# -- selecting records -------------------------------------------------------------------------
def select_records(recs: pd.DataFrame, key: dict) -> pd.DataFrame:
    """The rows of ``recs`` whose fields equal ``key`` (lists and tuples compare alike; NaN matches NaN;
    a key field the frame lacks is ignored)."""
    sel = pd.Series(True, index=recs.index)
    for k, v in key.items():
        if k not in recs:
            continue
        want = _hashable(v)
        col = recs[k].map(_hashable)
        if isinstance(want, float) and np.isnan(want):
            sel &= col.isna()
        else:
            sel &= col.map(lambda x, w=want: x == w).astype(bool)
    return recs[sel]


def _constant(df: pd.DataFrame, col: str, default):
    """The value of ``col`` when every row has the same one (``default`` when the column is missing)."""
    if col not in df:
        return default
    vals = df[col].map(_hashable).dropna().unique()
    return vals[0] if len(vals) == 1 else default


# -- time to accuracy --------------------------------------------------------------------------
def _num(g: pd.DataFrame, col: str) -> np.ndarray:
    """``g[col]`` as a writable float array (NaN where not a number, or everywhere when missing)."""
    if col not in g:
        return np.full(len(g), np.nan)
    return np.array(pd.to_numeric(g[col], errors="coerce"), dtype=float)


def _ratio_ci(a: np.ndarray, b: np.ndarray, rng, n_boot: int, scale: float = 1.0) -> tuple[float, float, float]:
    """``scale * median(a) / median(b)`` with a bootstrap 95% interval resampling both (NaN when either
    has no finite value)."""
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not a.size or not b.size:
        return float("nan"), float("nan"), float("nan")
    r = scale * float(np.median(a)) / float(np.median(b))
    lo, hi = _q(scale * _boot_medians(a, rng, n_boot) / _boot_medians(b, rng, n_boot))
    return r, lo, hi


def time_to_accuracy_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Time to a target validation loss, per series, group and placement.

    A **strong** series holds one global batch at several world sizes (the time-to-target speedup
    should equal the step speedup: the same samples per step, so the same steps to the target); a
    **weak** series holds one per-process batch (``local_batch``) at several world sizes, so the global
    batch grows with N and so may the samples needed (statistical efficiency). Both are found in the
    same records: a folder may hold both kinds. Groups: every other config field that differs
    (``lr_rule``, task, widths, ...).

    Per row, over the repeats that reached the target (``n_reached`` of ``n_runs``; medians of runs that
    did not are undefined, so ``all_reached`` says when a median leaves some out): ``steps_to_target``,
    ``samples_to_target``, ``time_to_target_s`` (training wall time, evaluations excluded; ``_lo``/``_hi``
    its bootstrap 95% interval), ``step_time_s``, ``final_val_loss``, ``final_val_accuracy``. Against the
    series' smallest placement ``N0``: ``time_speedup = TTT(N0) N0 / TTT(N)`` and ``step_speedup = T(N0) N0
    / T(N)`` (each with an interval), and for weak series ``statistical_efficiency = samples(N0) /
    samples(N)`` (1: the larger batch needs no more samples; 0.5: twice as many).
    """
    df, dropped = _valid(_placement_cols(df), "step_time_s")
    df["local_batch"] = df["global_batch"] // df["world_size"]
    d = _groups_of(df, "time_to_accuracy", ())
    rows = []
    for key, g in _groupby(df, d.groups):
        for kind, by in (("strong", "global_batch"), ("weak", "local_batch")):
            for batch, s in g.groupby(by, sort=True):
                pts = _placements(s)
                if s["world_size"].nunique() < 2 or (kind == "weak" and s["global_batch"].nunique() < 2):
                    continue  # a series spans world sizes; a weak one needs a global batch that grows with them
                rng = np.random.default_rng(seed)
                p0 = pts[0]
                n0 = p0[0] * p0[1]
                base = _at(s, *p0)
                for p in pts:
                    at = _at(s, *p)
                    n = p[0] * p[1]
                    reached = at["reached_target"].fillna(False).astype(bool).to_numpy() if "reached_target" in at \
                        else np.zeros(len(at), bool)
                    ttt = _num(at, "time_to_target_s")
                    ttt[~reached] = np.nan
                    t_med, t_lo, t_hi = (_median_ci(ttt[np.isfinite(ttt)], n_boot, seed) if np.isfinite(ttt).any()
                                         else (np.nan, np.nan, np.nan))
                    row = {**key, "series": kind, "series_batch": int(batch), "world_size": n, "nnodes": p[0],
                           "nproc_per_node": p[1], "placement": placement_of(*p), "inter_node": p[0] > 1,
                           "global_batch": int(at["global_batch"].iloc[0]), "local_batch": int(at["local_batch"].iloc[0]),
                           "n_runs": int(len(at)), "n_reached": int(reached.sum()),
                           "all_reached": bool(reached.all()),
                           "steps_to_target": float(np.nanmedian(np.where(reached, _num(at, "steps_to_target"), np.nan)))
                           if reached.any() else np.nan,
                           "samples_to_target": float(np.nanmedian(np.where(reached, _num(at, "samples_to_target"),
                                                                            np.nan))) if reached.any() else np.nan,
                           "time_to_target_s": t_med, "time_to_target_lo": t_lo, "time_to_target_hi": t_hi,
                           "step_time_s": float(np.median(_num(at, "step_time_s"))),
                           "final_val_loss": float(np.nanmedian(_num(at, "final_val_loss")))
                           if np.isfinite(_num(at, "final_val_loss")).any() else np.nan,
                           "final_val_accuracy": float(np.nanmedian(_num(at, "final_val_accuracy")))
                           if np.isfinite(_num(at, "final_val_accuracy")).any() else np.nan,
                           "chance_accuracy": float(np.nanmedian(_num(at, "chance_accuracy")))
                           if np.isfinite(_num(at, "chance_accuracy")).any() else np.nan}
                    b_ttt = _num(base, "time_to_target_s")
                    b_reached = base["reached_target"].fillna(False).astype(bool).to_numpy() \
                        if "reached_target" in base else np.zeros(len(base), bool)
                    b_ttt[~b_reached] = np.nan
                    if p == p0:
                        row.update(time_speedup=float(n0) if np.isfinite(t_med) else np.nan,
                                   time_speedup_lo=float(n0) if np.isfinite(t_med) else np.nan,
                                   time_speedup_hi=float(n0) if np.isfinite(t_med) else np.nan,
                                   step_speedup=float(n0), step_speedup_lo=float(n0), step_speedup_hi=float(n0))
                    else:
                        ts, ts_lo, ts_hi = _ratio_ci(b_ttt, ttt, rng, n_boot, n0)
                        ss, ss_lo, ss_hi = _ratio_ci(_num(base, "step_time_s"), _num(at, "step_time_s"), rng, n_boot, n0)
                        row.update(time_speedup=ts, time_speedup_lo=ts_lo, time_speedup_hi=ts_hi,
                                   step_speedup=ss, step_speedup_lo=ss_lo, step_speedup_hi=ss_hi)
                    if kind == "weak":
                        b_samples = np.where(b_reached, _num(base, "samples_to_target"), np.nan)
                        samples = np.where(reached, _num(at, "samples_to_target"), np.nan)
                        se, se_lo, se_hi = ((1.0, 1.0, 1.0) if p == p0 and reached.any() else
                                            _ratio_ci(b_samples, samples, rng, n_boot))
                        row.update(statistical_efficiency=se, statistical_efficiency_lo=se_lo,
                                   statistical_efficiency_hi=se_hi)
                    rows.append(row)
    out = pd.DataFrame(rows)
    if not out.empty and "statistical_efficiency" not in out:
        out["statistical_efficiency"] = out["statistical_efficiency_lo"] = out["statistical_efficiency_hi"] = np.nan
    return _finish(out, d, dropped, "step_time_s")


def val_curves(df: pd.DataFrame) -> pd.DataFrame:
    """The validation-loss curve of every run in ``df`` (records with ``record_path``), from each run's
    ``steps.csv``: one row per evaluation with ``steps`` (optimizer steps done), ``samples``
    (steps x global batch), ``train_time_s`` (cumulative step time of rank 0 up to that step, s),
    ``val_loss``, ``val_accuracy``, and the run's ``placement``, ``world_size``, ``global_batch``,
    ``lr_rule``, ``repeat``, ``run_key`` and ``record_path``. Runs without evaluations add no rows; a
    run whose ``steps.csv`` is missing is named in ``attrs['missing']``."""
    df = _placement_cols(df)
    parts, missing = [], []
    for _, r in df.iterrows():
        run_dir = os.path.dirname(str(r.get("record_path", "")))
        if not os.path.exists(os.path.join(run_dir, STEPS_NAME)):
            missing.append(run_dir)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a truncated last row is dropped; the curve needs none of it
            s = load_steps(run_dir)
        s = s.sort_values(["step", "attempt"]).drop_duplicates("step", keep="last")
        s["train_time_s"] = s["step_time_s"].fillna(0).cumsum()
        s = s[np.isfinite(s["val_loss"].to_numpy(float))]
        if s.empty:
            continue
        out = pd.DataFrame({"steps": s["step"].to_numpy() + 1, "val_loss": s["val_loss"].to_numpy(float),
                            "val_accuracy": s["val_accuracy"].to_numpy(float),
                            "train_time_s": s["train_time_s"].to_numpy(float)})
        out["samples"] = out["steps"] * int(r["global_batch"])
        for c in ("placement", "world_size", "nnodes", "nproc_per_node", "global_batch", "lr_rule", "repeat", "run_key",
                  "record_path", "model", "task", "target_val_loss"):
            out[c] = r.get(c)
        parts.append(out)
    cols = ["steps", "samples", "train_time_s", "val_loss", "val_accuracy", "placement", "world_size", "nnodes",
            "nproc_per_node", "global_batch", "lr_rule", "repeat", "run_key", "record_path", "model", "task",
            "target_val_loss"]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    out.attrs["missing"] = missing
    return out


# -- compounding: kernel speedup x data-parallel speedup ----------------------------------------
KERNEL_ORDER = ("reference", "fast", "compiled")


def kernel_of(df: pd.DataFrame) -> pd.Series:
    """The KAN kernel path each record actually ran (``kan_path``; several paths joined by ``+``), falling
    back to the requested ``kan_impl`` for records that do not say (schema 1, non-KAN models)."""
    path = df["kan_path"] if "kan_path" in df else pd.Series("", index=df.index)
    impl = df["kan_impl"] if "kan_impl" in df else pd.Series("", index=df.index)
    path = path.fillna("").astype(str)
    return path.where(path != "", impl.fillna("").astype(str))


def _kernel_rank(k: str) -> tuple:
    return (KERNEL_ORDER.index(k) if k in KERNEL_ORDER else len(KERNEL_ORDER), k)


def compounding_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Does a faster KAN kernel's speedup multiply with the data-parallel speedup?

    Rows per (group, kernel, placement). The kernel is what ran (``kan_path``, :func:`kernel_of`), kept
    apart by the requested ``kan_impl`` too (``compiled`` that fell back to the eager path is its own
    row, ``fell_back`` True). With the group's smallest placement ``N0`` and the slowest kernel measured
    there as the baseline (``reference`` when present), medians over repeats:

    - ``kernel_speedup = T(ref, N0) / T(k, N0)``;
    - ``ddp_speedup = T(k, N0) N0 / T(k, N)``, ``efficiency = ddp_speedup / N``;
    - ``product = kernel_speedup x ddp_speedup(ref, N)``: the combination if the two compounded;
    - ``measured = T(ref, N0) N0 / T(k, N)``: the combination as measured (bootstrap 95% interval);
    - ``compounding = measured / product = ddp_speedup(k, N) / ddp_speedup(ref, N)``: below 1 when the
      faster kernel exposes communication and lowers the parallel efficiency
      (``efficiency_change = efficiency - efficiency(ref)``).
    """
    df, dropped = _valid(_placement_cols(df), "step_time_s")
    df["kernel"] = kernel_of(df)
    d = _groups_of(df, "compounding", ())
    rows = []
    for key, g in _groupby(df, d.groups):
        rng = np.random.default_rng(seed)
        pts = _placements(g)
        p0 = pts[0]
        n0 = p0[0] * p0[1]
        kernels = sorted({(k, i) for k, i in zip(g["kernel"], g["kan_impl"])},
                         key=lambda ki: (_kernel_rank(ki[0]), _kernel_rank(ki[1])))
        t = {(k, i, p): _at(g[(g["kernel"] == k) & (g["kan_impl"] == i)], *p)["step_time_s"].to_numpy(float)
             for k, i in kernels for p in pts}
        at_base = [ki for ki in kernels if t[(*ki, p0)].size]
        if not at_base:
            continue
        ref = next((ki for ki in at_base if ki[0] == "reference"), None) or \
            max(at_base, key=lambda ki: float(np.median(t[(*ki, p0)])))
        t_ref0 = t[(*ref, p0)]
        for k, i in kernels:
            t0 = t[(k, i, p0)]
            ks, ks_lo, ks_hi = _ratio_ci(t_ref0, t0, rng, n_boot) if t0.size else (np.nan,) * 3
            for p in pts:
                v = t[(k, i, p)]
                if not v.size:
                    continue
                n = p[0] * p[1]
                med, lo, hi = _median_ci(v, n_boot, seed)
                ds, ds_lo, ds_hi = _ratio_ci(t0, v, rng, n_boot, n0) if t0.size else (np.nan,) * 3
                ref_p = t[(*ref, p)]
                ds_ref = float(np.median(t_ref0)) * n0 / float(np.median(ref_p)) if ref_p.size else np.nan
                ms, ms_lo, ms_hi = _ratio_ci(t_ref0, v, rng, n_boot, n0)
                product = ks * ds_ref
                rows.append({**key, "kernel": k, "kan_impl": i, "fell_back": k != i, "baseline_kernel": ref[0],
                             "world_size": n, "nnodes": p[0], "nproc_per_node": p[1], "placement": placement_of(*p),
                             "inter_node": p[0] > 1, "n_runs": int(v.size), "step_time_s": med, "step_time_lo": lo,
                             "step_time_hi": hi, "kernel_speedup": ks, "kernel_speedup_lo": ks_lo,
                             "kernel_speedup_hi": ks_hi, "ddp_speedup": ds, "ddp_speedup_lo": ds_lo,
                             "ddp_speedup_hi": ds_hi, "efficiency": ds / n, "efficiency_ref": ds_ref / n,
                             "efficiency_change": ds / n - ds_ref / n, "product": product, "measured": ms,
                             "measured_lo": ms_lo, "measured_hi": ms_hi, "compounding": ms / product
                             if product and np.isfinite(product) else np.nan})
    return _finish(pd.DataFrame(rows), d, dropped, "step_time_s")


# -- data-parallel options against plain DDP -----------------------------------------------------
OPTION_FIELDS = {"comm_hook": "timed", "grad_accum_steps": 1, "gradient_as_bucket_view": False, "static_graph": False}
"""The data-parallel options of the communication study and their plain-DDP values."""
PLAIN_BUCKET_MB = 25.0
"""DDP's default bucket cap: the plain point a bucket-size option is compared with."""


def plain_ddp(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of a communication table that are plain DDP: the timed full-precision hook and every
    option of :data:`OPTION_FIELDS` at its plain value (a missing value predates the
    option: plain). The option fields leave the group fields, so figures do not facet by them."""
    attrs = dict(t.attrs)
    out = t
    for f, v in OPTION_FIELDS.items():
        if f in out:
            out = out[out[f].isna() | (out[f].map(_hashable) == v)]
    out = out.copy()
    out.attrs = {**attrs, "group_fields": [f for f in attrs.get("group_fields", []) if f not in OPTION_FIELDS]}
    return out


def option_label(opts: dict, bucket_cap_mb: float, powersgd_rank: int | None = None) -> str:
    """A readable name of a data-parallel option set: ``plain DDP``, ``bf16``, ``powersgd rank 1``,
    ``grad_accum_steps=2``, ``0.05 MiB buckets``, joined by ``+``."""
    parts = []
    hook = opts.get("comm_hook", "timed")
    if hook != "timed":
        parts.append(f"powersgd rank {int(powersgd_rank or 1)}" if hook == "powersgd" else hook)
    if int(opts.get("grad_accum_steps", 1)) != 1:
        parts.append(f"grad_accum_steps={int(opts['grad_accum_steps'])}")
    for f in ("gradient_as_bucket_view", "static_graph"):
        if bool(opts.get(f, False)):
            parts.append(f)
    if float(bucket_cap_mb) != PLAIN_BUCKET_MB:
        parts.append(f"{float(bucket_cap_mb):g} MiB buckets")
    return " + ".join(parts) or "plain DDP"


def options_table(df: pd.DataFrame, tolerance: float = 0.01, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Each data-parallel option of a communication study (hook compression, PowerSGD, gradient
    accumulation, ``gradient_as_bucket_view``, ``static_graph``, bucket size) against plain DDP.

    From :func:`communication_table` (step time with the option's communication, exposed communication
    by the no-op-hook method) and each point's ``final_val_loss`` (median over repeats: every option
    trains on the same samples, so it is the validation loss after the same samples). Plain DDP is the
    same point (group, placement, NCCL algorithm, emulated link) with the timed hook and no option; an
    option that only changes the bucket size is compared with plain DDP at :data:`PLAIN_BUCKET_MB`, any
    other with plain DDP at its own bucket size. Columns: ``option``, ``is_plain``, the point's fields,
    ``step_time_s``, ``exposed_s``, ``overhead_fraction``, ``val_loss``, ``plain_step_time_s``,
    ``plain_exposed_s``, ``plain_val_loss``, ``step_time_ratio``, ``exposed_delta_s``,
    ``val_loss_delta``, ``val_loss_rel_delta`` and ``harms_convergence`` (relative increase above
    ``tolerance``); NaN where plain DDP was not measured at that point (``plain_missing``). Points run
    through an emulated link are the calibration's, not options: they are left out.
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance: must be >= 0, got {tolerance!r}")
    df = df.copy()
    for f, v in OPTION_FIELDS.items():  # records that predate a field ran with its plain value
        if f in df:
            df[f] = df[f].astype(object).where(df[f].notna(), v)
    t = communication_table(df, n_boot=n_boot, seed=seed)
    if t.empty:
        return t
    t = t[(t["emulate_latency_s"] == 0) & (t["emulate_bandwidth_bytes_per_s"] == 0)]
    if t.empty:
        return t
    recs = _placement_cols(df)
    groups = [f for f in t.attrs.get("group_fields", []) if f in t]
    point_fields = list(dict.fromkeys(groups + ["nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo", "comm_hook",
                                                "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]))
    rows = []
    for _, r in t.iterrows():
        key = {f: r[f] for f in point_fields if f in r}
        sel = select_records(recs, key)
        opts = {f: (r[f] if f in r else _constant(recs, f, v)) for f, v in OPTION_FIELDS.items()}
        val = _num(sel, "final_val_loss")
        row = {**r.to_dict(), **opts,
               "option": option_label(opts, r["bucket_cap_mb"], _constant(sel, "powersgd_rank", 1)),
               "step_time_s": r["t_allreduce_s"], "val_loss": float(np.nanmedian(val)) if np.isfinite(val).any()
               else np.nan}
        row["is_plain"] = row["option"] == "plain DDP"
        rows.append(row)
    out = pd.DataFrame(rows)
    # PowerSGD's rank is the option's own parameter, not a difference of the point plain DDP must share
    rest = [f for f in groups if f not in OPTION_FIELDS and f not in ("bucket_cap_mb", "powersgd_rank")]
    same = rest + ["nnodes", "nproc_per_node", "nccl_algo", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]
    plain_cols = ("step_time_s", "t_allreduce_lo", "t_allreduce_hi", "exposed_s", "val_loss")
    for c in plain_cols:
        out[f"plain_{c}"] = np.nan
    for i, r in out.iterrows():
        is_default = all(_hashable(r[f]) == _hashable(v) for f, v in OPTION_FIELDS.items())
        cap = PLAIN_BUCKET_MB if is_default else r["bucket_cap_mb"]
        want = {f: r[f] for f in same if f in out}
        cand = select_records(out, {**want, **OPTION_FIELDS, "bucket_cap_mb": cap})
        if cand.empty and is_default:  # no 25 MiB point: compare with plain DDP at the same bucket size
            cand = select_records(out, {**want, **OPTION_FIELDS, "bucket_cap_mb": r["bucket_cap_mb"]})
        if not cand.empty:
            for c in plain_cols:
                out.at[i, f"plain_{c}"] = cand.iloc[0][c]
    out["plain_missing"] = out["plain_step_time_s"].isna()
    out["step_time_ratio"] = out["step_time_s"] / out["plain_step_time_s"]
    out["exposed_delta_s"] = out["exposed_s"] - out["plain_exposed_s"]
    out["val_loss_delta"] = out["val_loss"] - out["plain_val_loss"]
    out["val_loss_rel_delta"] = out["val_loss_delta"] / out["plain_val_loss"]
    out["harms_convergence"] = out["val_loss_rel_delta"] > tolerance
    out = out.sort_values(["nnodes", "nproc_per_node", "is_plain", "option"], ascending=[True, True, False, True],
                          kind="stable").reset_index(drop=True)
    out.attrs.update(t.attrs)
    out.attrs["tolerance"] = tolerance
    return out


# -- FSDP against DDP ------------------------------------------------------------------------------
def fsdp_table(size: pd.DataFrame, margin: float = 0.05) -> pd.DataFrame:
    """Per model size measured under both DDP and FSDP (rows of :func:`model_size_table` that differ
    only in ``parallelism``): peak memory per process (``peak_mem_ddp``, ``peak_mem_fsdp``, ratio
    ``mem_ratio = fsdp / ddp``), step time (``step_ddp_s``, ``step_fsdp_s``, ``step_ratio``), the analytic
    per-process state (``state_ddp_bytes``: parameters + gradients + optimizer state of the whole model;
    ``state_fsdp_bytes``: that divided by the world size, what sharding keeps per process), the final
    validation losses of both, and ``pays`` = FSDP's measured peak memory below DDP's by more than
    ``margin`` (a relative fraction). Empty when no size has both."""
    if size.empty or "parallelism" not in size or size["parallelism"].nunique() < 2:
        return pd.DataFrame()
    keys = [c for c in size.attrs.get("group_fields", []) if c in size and c != "parallelism"]
    keys = list(dict.fromkeys(keys + [c for c in ("model", "widths", "grid_size", "spline_order", "nnodes",
                                                  "nproc_per_node") if c in size]))
    rows = []
    for key, g in _groupby(size, keys):
        ddp, fsdp = g[g["parallelism"] == "ddp"], g[g["parallelism"] == "fsdp"]
        if ddp.empty or fsdp.empty:
            continue
        a, b = ddp.iloc[0], fsdp.iloc[0]
        w = int(a["world_size"])
        rows.append({**key, "placement": a["placement"], "world_size": w, "n_params": int(a["n_params"]),
                     "peak_mem_ddp": a["peak_mem_bytes"], "peak_mem_fsdp": b["peak_mem_bytes"],
                     "mem_ratio": b["peak_mem_bytes"] / a["peak_mem_bytes"], "step_ddp_s": a["step_time_s"],
                     "step_fsdp_s": b["step_time_s"], "step_ratio": b["step_time_s"] / a["step_time_s"],
                     "state_ddp_bytes": a["model_state_bytes"], "state_fsdp_bytes": a["model_state_bytes"] / w,
                     "val_loss_ddp": a.get("final_val_loss", np.nan), "val_loss_fsdp": b.get("final_val_loss", np.nan),
                     "pays": bool(b["peak_mem_bytes"] < (1 - margin) * a["peak_mem_bytes"])})
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["model", "n_params"], kind="stable").reset_index(drop=True)
    out.attrs["margin"] = margin
    return out


def fsdp_pays_from(table: pd.DataFrame, model: str = "kan") -> int | None:
    """The smallest parameter count of ``model`` from which FSDP pays (:func:`fsdp_table`'s ``pays``) at
    that size and at every larger measured size; None when the data show no such size."""
    t = table[table["model"] == model].sort_values("n_params") if not table.empty else table
    best = None
    for n, pays in zip(reversed(t["n_params"].tolist()), reversed(t["pays"].tolist())):
        if not pays:
            break
        best = int(n)
    return best
