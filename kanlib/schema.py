"""``docs/schema.md``, generated from the dataclasses of everything a run writes (``python -m kanlib.schema >
docs/schema.md``; tests/test_records.py keeps the two equal).

The fields and their docstrings are kanlib.records' (a run's record and steps, a benchmark's record) and
kanlib.manifest's (the study's manifest, launches and sweeps); this module lays them out as markdown: the run
folder's files, then one table per file. Change it when the document's layout changes, not for a new field.
"""

from __future__ import annotations

from dataclasses import fields

from kanlib.manifest import LaunchRow, ManifestRow, SweepRow
from kanlib.records import (CONFIG_NAME, LAUNCHES_NAME, MANIFEST_NAME, MODEL_NAME, PREEMPTED_NAME, RECORD_NAME,
                            SCHEMA_VERSION, STEPS_NAME, SWEEPS_NAME, BenchRecord, BenchRow, Provenance, RunRecord,
                            StepRow)


def _type_name(f) -> str:
    t = str(f.type).replace("typing.", "")
    return t.replace("| None", "or null").replace("list", "list").replace("dict", "object").strip()


def _rows(cls, skip=()) -> list[str]:
    out = []
    for f in fields(cls):
        if f.name in skip:
            continue
        out.append(f"| `{f.name}` | {_type_name(f)} | {f.metadata.get('doc', '')} |")
    return out


def _paragraph(cls, first_paragraph: bool = False, join: bool = True) -> str:
    """A record class's docstring as one markdown paragraph (its first only, or its lines kept, when asked)."""
    doc = cls.__doc__.strip()
    doc = doc.split("\n\n")[0] if first_paragraph else doc
    return (doc.replace("\n    ", " ") if join else doc).replace("``", "`")


def _table(cls, head: str = "field", skip: tuple = ()) -> list[str]:
    """A markdown table of a record class's fields: name, type and meaning."""
    return [f"| {head} | type | meaning |", "|---|---|---|", *_rows(cls, skip=skip)]


def schema_markdown() -> str:
    """``docs/schema.md``, generated from kanlib.records' :class:`Provenance`, :class:`RunRecord`, :class:`StepRow`,
    :class:`BenchRecord` and :class:`BenchRow`, and kanlib.manifest's :class:`ManifestRow`, :class:`LaunchRow` and
    :class:`SweepRow` (``python -m kanlib.schema > docs/schema.md``; a test keeps them equal)."""
    lines = [
        f"# Result records (schema version {SCHEMA_VERSION})",
        "",
        "Generated from the dataclasses in `kanlib/records.py` and `kanlib/manifest.py` by",
        "`python -m kanlib.schema > docs/schema.md`; a test fails when this file and the code differ. Units are in",
        "the field names (`_s` seconds, `_bytes` bytes, `_per_s` per second).",
        "",
        "Each run writes one folder, `out_dir/<study>/<run_key>/`, with:",
        "",
        "| file | written | content |",
        "|---|---|---|",
        f"| `{CONFIG_NAME}` | first, by rank 0 | the run's `RunConfig` as JSON |",
        f"| `{STEPS_NAME}` | one row per step, appended and flushed as it comes (rank 0) | `StepRow`, below |",
        "| `launch.log` (`launch-node<i>.log`, `slurm-<job>.log`) | by the runner | the launch command and every "
        "line the run printed |",
        f"| `{MODEL_NAME}` | at the end (rank 0) | the final `state_dict`, on CPU (`torch.load(..., weights_only=True)`) |",
        "| `checkpoints/ckpt-<step>.pt`, `checkpoints/latest` | every `checkpoint_every` steps and on SIGTERM | "
        "resumable state; removed once the record exists ([faults](faults.md)) |",
        f"| `{PREEMPTED_NAME}` | when SIGTERM stopped the run | step, checkpoint, time, attempt |",
        f"| `{RECORD_NAME}` | last, atomically (temporary file, fsync, rename) | `RunRecord`, below; its presence "
        "marks the run complete |",
        "",
        f"## `{RECORD_NAME}`",
        "",
        _paragraph(RunRecord),
        "Every field of `kanlib.config.RunConfig` (see its field docstrings) is there too.",
        "",
        *_table(Provenance),
        *_rows(RunRecord, skip=("provenance", "config")),
        "",
        "Derived quantities (speedup, efficiency, Karp-Flatt serial fraction, exposed communication, bootstrap",
        "intervals) are computed from records by the study modules of `kanlib.studies`, never stored.",
        "`kanlib.analysis.load` refuses records that fail `kanlib.records.check_record` (unknown schema version,",
        "NaN or non-positive step time, non-numeric measurements) and names them.",
        "",
        f"## `{STEPS_NAME}`",
        "",
        _paragraph(StepRow, first_paragraph=True),
        "",
        *_table(StepRow, head="column"),
        "",
        f"## `<study>/{MANIFEST_NAME}`",
        "",
        _paragraph(ManifestRow, join=False),
        "",
        *_table(ManifestRow),
        "",
        f"## `<study>/{LAUNCHES_NAME}`",
        "",
        _paragraph(LaunchRow),
        "Each launch's folder `<study>/launches/<launch_id>/` holds `plan.json` (the runs handed to it, in order),",
        "`events.jsonl` (rank 0's `begin` and `end` of each run) and its logs (`launch.log`, `launch-node<i>.log`,",
        "`srun.log` or `slurm-<job>.log`); each run's part of them is copied into the run's own folder.",
        "",
        *_table(LaunchRow),
        "",
        f"## `<study>/{SWEEPS_NAME}`",
        "",
        _paragraph(SweepRow),
        "",
        *_table(SweepRow),
        "",
        f"## `{RECORD_NAME}` of a collective benchmark",
        "",
        _paragraph(BenchRecord),
        "Every field of `kanlib.collbench.BenchConfig` is there too, and the provenance fields of a training run's",
        "record. `kanlib.records.check_bench_record` refuses a record whose rows are not finite and in range.",
        "",
        *_table(BenchRecord, skip=("provenance", "config")),
        "",
        "Each element of `rows`:",
        "",
        _paragraph(BenchRow),
        "",
        *_table(BenchRow),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown(), end="")
