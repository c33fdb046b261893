"""Benchmarks; each module runs with ``python -m benchmarks.<name>``."""


def write_record(out_dir, name: str, stamp: str, record: dict):
    """Write a benchmark's ``record`` as ``out_dir/<name>-<stamp>.json`` (folders made as needed), say where, and
    return the path."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"\nrecord written to {path}")
    return path
