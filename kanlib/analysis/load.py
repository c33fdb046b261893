"""Reading what runs wrote: every ``record.json`` under a folder in one pass, sorted into training runs and
collective benchmarks; the code-version policy; per-step rows and manifests.

Runtime code never imports this package (a rank imports no pandas); what a run writes is defined in
kanlib.records. Derived quantities are computed by the study modules (kanlib.studies), never stored.

- **One read.** :func:`read` opens each ``record.json`` once and keeps its training runs, its benchmark rows
  and what it could not use (:class:`Records`); everything else selects from that.
- **Code.** Records of different code (``code_version``; schema-1 records, which have none, count as the
  version ``unknown``) are never pooled. By default :meth:`Records.select` keeps, per study, the records of the
  newest code version (:func:`newest_code`: this checkout's own code where the records have it, never a version
  that only finished last) and names what it left out (:attr:`Selection.left_out`); ``code="all"`` keeps every
  version as a group of its own.
- **Disturbed runs.** A run whose machine was busy during its measured steps (:func:`kanlib.disturbance.disturbance`
  non-empty: other processes took its CPUs, a rank waited for a CPU, another process on its GPU) is left out by
  default and named (:attr:`Selection.disturbed`, :attr:`Selection.disturbed_note`); ``disturbed="keep"`` keeps it,
  marked (column ``disturbed``, a group field: the tables show disturbed runs apart, never pooled with clean ones).
- **Bad values.** A record that cannot be read or fails :func:`kanlib.records.check_record` (a NaN, zero or
  negative step time, ...) is skipped, named (:attr:`Records.bad`) and warned about.
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from dataclasses import dataclass, field

import pandas as pd

from kanlib.disturbance import disturbance
from kanlib.manifest import ATTEMPTS_DIR, RERUN_MARK, read_manifest_rows
from kanlib.records import (BENCH_KIND, MANIFEST_NAME, RECORD_NAME, STEP_COLUMNS, STEPS_NAME, RecordError,
                            check_bench_record, check_record, read_steps_rows)


class NoRecordsError(FileNotFoundError):
    """No record was found under the given folder."""


UNKNOWN_CODE = "unknown"
"""The code version of records written before ``code_version`` existed (schema 1)."""

CODE_POLICIES = ("newest", "all")
DISTURBED_POLICIES = ("leave_out", "keep")
"""What an analysis does with disturbed runs: leave them out (default, named) or keep them, shown apart."""


def find_record_files(root: str) -> list[str]:
    """Every run's record below ``root`` (sorted): its ``record.json``, or, for a run whose rerun of a disturbed
    attempt is pending (the sweep that started it was killed while the rerun ran, so the rerun's start removed
    ``record.json`` and no sweep has put it back yet: docs/faults.md, "Disturbed runs"), the set-aside copy that
    ``attempts/rerun-pending`` names: a run's only complete record is never out of the analysis."""
    found = glob.glob(os.path.join(root, "**", RECORD_NAME), recursive=True)
    for mark in glob.glob(os.path.join(root, "**", ATTEMPTS_DIR, RERUN_MARK), recursive=True):
        keep = os.path.dirname(mark)
        if os.path.exists(os.path.join(os.path.dirname(keep), RECORD_NAME)):
            continue
        try:
            with open(mark) as f:
                copy = os.path.join(keep, f"{f.read().strip()}.json")
        except OSError:
            continue
        if os.path.exists(copy):
            found.append(copy)
    return sorted(found)


def read_json(path: str):
    """The parsed JSON of ``path`` (the one place a record file is opened)."""
    with open(path) as f:
        return json.loads(f.read())


@dataclass
class Selection:
    """The training records one analysis uses: ``data`` (one row per run, nested ``env`` flattened as
    ``env.X``, ``code_version`` and ``record_path`` on every row) and what the code policy ``code`` left out
    (dicts of study, code_version, git_sha, n_records)."""

    data: pd.DataFrame
    left_out: list[dict] = field(default_factory=list)
    code: str = "newest"
    disturbed: list[dict] = field(default_factory=list)
    """The disturbed runs of the selection (dicts of study, run, why, kept): left out unless the policy keeps them."""
    disturbed_policy: str = "leave_out"

    @property
    def code_note(self) -> str:
        """One sentence naming the records left out by the code policy ('' when none were)."""
        return code_note(self.left_out)

    @property
    def disturbed_note(self) -> str:
        """One sentence naming the disturbed runs and what was done with them ('' when there is none)."""
        return disturbed_note(self.disturbed, self.disturbed_policy)


@dataclass
class Records:
    """Every record under ``root``, read once: training runs (flattened rows), collective-benchmark rows (one per
    run x message size) and the files that could not be used, as ``(file, line, reason)`` (training records and
    files that are no record at all) and ``(file, reason)`` (benchmark records)."""

    root: str
    runs: list[dict] = field(default_factory=list)
    bench_rows: list[dict] = field(default_factory=list)
    bad: list[tuple] = field(default_factory=list)
    bench_bad: list[tuple] = field(default_factory=list)

    def select(self, study: str | None = None, code: str = "newest", disturbed: str = "leave_out") -> Selection:
        """The training records of ``study`` (every study when None) that the code policy ``code`` keeps:
        ``"newest"`` keeps, per study, the version :func:`newest_code` chooses; ``"all"`` keeps every
        version (the tables then group by ``code_version``); any other string keeps that ``code_version`` only.
        ``disturbed``: ``"leave_out"`` (default) drops the disturbed runs and names them, ``"keep"`` keeps them
        marked (see :func:`split_disturbed`). No record raises :class:`NoRecordsError` saying where it looked."""
        if not isinstance(code, str) or not code:
            raise ValueError(f"code: expected 'newest', 'all' or a code_version string, got {code!r}")
        check_disturbed_policy(disturbed)
        rows = [r for r in self.runs if study is None or r.get("study") == study]
        if not rows:
            what = f" of study {study!r}" if study else ""
            raise NoRecordsError(f"no records{what} under {os.path.abspath(self.root)}"
                                 + (f" ({len(self.bad)} unreadable)" if self.bad else ""))
        df, left_out = select_code(pd.DataFrame(rows), code)
        if df.empty:
            raise NoRecordsError(f"no records of code_version {code!r} under {os.path.abspath(self.root)} "
                                 f"(have: {', '.join(sorted({d['code_version'] for d in left_out}))})")
        df, flagged = split_disturbed(df, disturbed)
        if df.empty:
            raise NoRecordsError(f"no undisturbed records{f' of study {study!r}' if study else ''} under "
                                 f"{os.path.abspath(self.root)}: {disturbed_note(flagged, disturbed)}")
        sort = [c for c in ("study", "world_size", "nnodes", "repeat") if c in df]
        return Selection(df.sort_values(sort, kind="stable").reset_index(drop=True), left_out, code, flagged,
                         disturbed)

    def bench(self) -> pd.DataFrame:
        """The collective-benchmark rows: the run's scalar fields (config, provenance, ``placement``,
        ``backend``/``device`` used, ``run_key``; environment variables as ``env.X``, ``record_path``) and the
        row's (``size_bytes``, ``time_s``, ``algbw_bytes_per_s``, ...). Empty without benchmark records."""
        return pd.DataFrame(self.bench_rows)


def read(root: str, strict: bool = False) -> Records:
    """Read every ``record.json`` under ``root`` once. A file that is not JSON, not an object, or fails
    :func:`kanlib.records.check_record` is skipped and named, with a warning; with ``strict=True`` the first
    training record that cannot be used raises :class:`kanlib.records.RecordError`."""
    out = Records(root)
    seen: dict[str, int] = {}  # run_id -> index in out.runs: a copy of a folder inside root counts once
    copies = []
    for path in find_record_files(root):
        try:
            rec = read_json(path)
            kind = rec.get("record_kind", "train") if isinstance(rec, dict) else "train"
            if kind == BENCH_KIND:
                _add_bench(out, path, rec)
            if kind != "train":
                continue  # a collective benchmark's record, or a kind this version does not analyse
            why = check_record(rec)
            if why:
                raise ValueError(why)
        except (OSError, ValueError) as e:
            line = getattr(e, "lineno", None)
            reason = getattr(e, "msg", None) or str(e)
            if strict:
                raise RecordError(f"{path}" + (f", line {line}" if line else "") + f": {reason}") from e
            out.bad.append((path, line, reason))
            continue
        row = flatten(rec)
        row["code_version"] = row.get("code_version") or UNKNOWN_CODE
        row["record_path"] = path
        run_id = rec.get("run_id")
        if run_id and run_id in seen:
            kept = out.runs[seen[run_id]]
            if _in_own_study(path, rec) and not _in_own_study(kept["record_path"], kept):
                out.runs[seen[run_id]], row = row, kept  # keep the one in <root>/<study>/, not its copy
            copies.append((run_id, row["record_path"], out.runs[seen[run_id]]["record_path"]))
            continue
        if run_id:
            seen[run_id] = len(out.runs)
        out.runs.append(row)
    if copies:
        warnings.warn(f"{len(copies)} record(s) are copies of another with the same run id, counted once: "
                      + "; ".join(f"{c} copies {k} (run id {r})" for r, c, k in copies), stacklevel=2)
    if out.bad:
        warnings.warn(f"skipped {len(out.bad)} unreadable record(s): "
                      + "; ".join(f"{p} line {ln}: {r}" for p, ln, r in out.bad), stacklevel=2)
    if out.bench_bad:
        warnings.warn("skipped unusable collbench record(s): " + "; ".join(f"{p}: {w}" for p, w in out.bench_bad),
                      stacklevel=2)
    return out


def _in_own_study(path: str, rec: dict) -> bool:
    """Whether ``path`` is ``.../<study>/<run folder>/record.json`` of the record's own study."""
    return os.path.basename(os.path.dirname(os.path.dirname(path))) == rec.get("study")


def _add_bench(out: Records, path: str, rec: dict) -> None:
    why = check_bench_record(rec)
    if why:
        out.bench_bad.append((path, why))
        return
    run = {k: v for k, v in rec.items() if k not in ("rows", "env")}
    run.update({f"env.{k}": v for k, v in (rec.get("env") or {}).items()})
    run["record_path"] = path
    out.bench_rows += [{**run, **row} for row in rec["rows"]]


def load_records(root: str, study: str | None = None, strict: bool = False, code: str = "newest",
                 disturbed: str = "leave_out") -> pd.DataFrame:
    """The training records under ``root`` (of ``study``, kept by the code policy ``code`` and the disturbed-run
    policy ``disturbed``) as one row each: ``read(root, strict).select(study, code, disturbed).data`` (see
    :func:`read`, :meth:`Records.select`)."""
    return read(root, strict).select(study, code, disturbed).data


def load_bench(root: str) -> pd.DataFrame:
    """Every collective-benchmark row under ``root`` (:meth:`Records.bench`)."""
    return read(root).bench()


def select_code(df: pd.DataFrame, code: str = "newest") -> tuple[pd.DataFrame, list[dict]]:
    """The rows of ``df`` kept by the code policy ``code`` (see :meth:`Records.select`), and what was left out."""
    if code == "all" or "code_version" not in df:
        return df, []
    keep = pd.Series(False, index=df.index)
    studies = df["study"] if "study" in df else pd.Series("", index=df.index)
    here: list = []  # this checkout's (code_version, commit), worked out once and only when a study needs it
    for s in studies.unique():
        sel = studies == s
        if code == "newest":
            if df.loc[sel, "code_version"].nunique() > 1 and not here:
                here.extend(this_checkout())
            newest = newest_code(df[sel], *(here or ("", "")))
            keep |= sel & (df["code_version"] == newest)
        else:
            keep |= sel & (df["code_version"] == code)
    out = df[~keep]
    left = []
    for (s, cv), g in out.groupby([studies[~keep], out["code_version"]], sort=True):
        shas = sorted({str(v) for v in g.get("git_sha", pd.Series(["unknown"])).fillna("unknown")})
        left.append({"study": s, "code_version": cv, "git_sha": ", ".join(shas), "n_records": int(len(g))})
    return df[keep], left


def this_checkout() -> tuple[str, str]:
    """The code version a run launched from this checkout would record (:func:`kanlib.runkey.code_version`) and the
    commit it runs from (``git rev-parse HEAD`` of the checkout, without ``-dirty``; '' where git cannot say)."""
    from kanlib.runkey import code_version  # torch-free
    from kanlib.records import git_sha

    sha = git_sha()
    return code_version(), "" if sha == "unknown" else sha.removesuffix("-dirty")


def newest_code(df: pd.DataFrame, checkout_version: str = "", checkout_commit: str = "") -> str:
    """The code version the ``"newest"`` policy keeps among the records ``df`` (one study): the first rule that
    picks one decides.

    1. **This checkout's code**: ``checkout_version`` (:func:`this_checkout`), where some record has it: what a
       rerun from here would measure and write.
    2. **This checkout's commit**: the versions whose records' ``git_sha`` is ``checkout_commit`` (edited or not);
       of several, as in rule 3.
    3. **The most records**, then the latest finish (``finished_at``, else ``started_at``) of a version's runs.

    So a record copied in from elsewhere (another checkout, another machine) never wins by finishing last alone:
    it must be this checkout's code or commit, or its version must have as many records as any other."""
    versions = df["code_version"]
    if checkout_version and (versions == checkout_version).any():
        return checkout_version
    if checkout_commit and "git_sha" in df:
        commit = df["git_sha"].fillna("").astype(str).str.removesuffix("-dirty")
        if (commit == checkout_commit).any():
            df, versions = df[commit == checkout_commit], versions[commit == checkout_commit]
    when = df["finished_at"] if "finished_at" in df else pd.Series("", index=df.index)  # schema 1 may lack it
    when = when.fillna("").astype(str)
    if "started_at" in df:
        when = when.where(when != "", df["started_at"].fillna("").astype(str))
    rank = pd.DataFrame({"n": versions.groupby(versions).size(), "last": when.groupby(versions).max()})
    return rank.sort_values(["n", "last"], kind="stable").index[-1]


def check_disturbed_policy(disturbed: str) -> None:
    """Refuse a policy other than :data:`DISTURBED_POLICIES`, naming the field."""
    if disturbed not in DISTURBED_POLICIES:
        raise ValueError(f"disturbed: expected one of {', '.join(DISTURBED_POLICIES)}, got {disturbed!r}")


def mark_disturbed(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` (one row per run) with ``disturbed_why`` (:func:`kanlib.disturbance.disturbance` of the row,
    '' when quiet or unknown) and ``disturbed`` (bool) filled where missing."""
    df = df.copy()
    if "disturbed_why" not in df:
        df["disturbed_why"] = [disturbance({k: (None if _isnan(v) else v) for k, v in r.items()})
                               for r in df.to_dict("records")] if len(df) else pd.Series(dtype=str)
    df["disturbed_why"] = df["disturbed_why"].fillna("").astype(str)
    df["disturbed"] = df["disturbed_why"] != ""
    return df


def _isnan(v) -> bool:
    return isinstance(v, float) and v != v


def split_disturbed(df: pd.DataFrame, disturbed: str = "leave_out") -> tuple[pd.DataFrame, list[dict]]:
    """The rows the policy keeps and every disturbed run as ``{study, run, why, kept}``. ``"leave_out"`` drops
    them; ``"keep"`` keeps them with ``disturbed`` True, a group field of every table (shown apart)."""
    check_disturbed_policy(disturbed)
    df = mark_disturbed(df)
    bad = df[df["disturbed"]]
    flagged = [{"study": r.get("study", ""), "run": _run_name(r.get("record_path", "")), "why": r["disturbed_why"],
                "kept": disturbed == "keep"} for r in bad.to_dict("records")]
    return (df if disturbed == "keep" else df[~df["disturbed"]]), flagged


def _run_name(path) -> str:
    """``study/run_dir`` of a record's path."""
    if not isinstance(path, str) or not path:
        return "?"
    d = os.path.dirname(path)
    return f"{os.path.basename(os.path.dirname(d))}/{os.path.basename(d)}"


def disturbed_note(flagged: list[dict], disturbed: str = "leave_out") -> str:
    """One sentence: how many runs were disturbed, which, why, and whether they were left out or kept apart."""
    if not flagged:
        return ""
    what = ("left out (disturbed='keep' keeps them, shown apart)" if disturbed == "leave_out"
            else "kept, shown apart from the clean runs (disturbed=True)")
    return (f"{len(flagged)} disturbed run(s) {what}: "
            + "; ".join(f"{d['run']} ({d['why']})" for d in flagged) + ".")


def code_note(left_out: list[dict]) -> str:
    """One sentence naming the records left out by the code policy ('' when none were)."""
    if not left_out:
        return ""
    parts = [f"{d['n_records']} {d['study']} record(s) of code_version {d['code_version']} (git {d['git_sha']})"
             for d in left_out]
    return ("Left out records of other code (never pooled with the newest; load with code='all' to see them "
            "as separate groups): " + "; ".join(parts) + ".")


def flatten(rec: dict) -> dict:
    """A record as one flat row: nested objects as ``key.subkey``, lists as tuples (hashable, groupable)."""
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


# -- per-step rows and manifests -----------------------------------------------------------------------
def read_steps(run_dir: str) -> tuple[pd.DataFrame, list[tuple]]:
    """The per-step rows of one run (long format) and the rows that could not be read, as ``(file, line,
    reason)`` (a last line cut short by a crash is dropped and named), with a warning."""
    path = os.path.join(run_dir, STEPS_NAME)
    rows, bad = read_steps_rows(path)
    df = pd.DataFrame(rows, columns=STEP_COLUMNS)
    for c in STEP_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.astype({"step": "int64", "measured": "int64"})
    df["attempt"] = df["attempt"].fillna(0).astype("int64")
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable row(s): "
                      + "; ".join(f"line {ln}: {r}" for _, ln, r in bad), stacklevel=2)
    return df, bad


def load_steps(run_dir: str) -> pd.DataFrame:
    """The per-step rows of one run (:func:`read_steps` without the unreadable rows' names)."""
    return read_steps(run_dir)[0]


def read_manifest(path: str) -> tuple[pd.DataFrame, list[tuple]]:
    """Rows of a manifest (or of ``<dir>/manifest.jsonl``) in the order written, and the lines that are not
    JSON objects (a last line cut short, garbage) as ``(file, line, reason)``, with a warning. A missing file
    gives an empty frame."""
    if os.path.isdir(path):
        path = os.path.join(path, MANIFEST_NAME)
    rows, bad = read_manifest_rows(path)
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable line(s): "
                      + "; ".join(f"line {ln}: {r}" for _, ln, r in bad), stacklevel=2)
    return pd.DataFrame(rows, columns=None if rows else ["run_key", "status"]), bad


def load_manifest(path: str) -> pd.DataFrame:
    """Rows of a manifest (:func:`read_manifest` without the unreadable lines' names)."""
    return read_manifest(path)[0]
