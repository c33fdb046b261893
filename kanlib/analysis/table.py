"""A derived table beside what a reader needs to read it: the fields that separate its groups, a note, the
design it came from. Kept in a small typed object, not in ``DataFrame.attrs`` (which pandas drops on most
operations)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Table:
    """A study's derived table: ``data`` holds one row per group and point; ``groups`` names the fields that
    separate records analysed apart (each combination is a row set, a subplot and a guideline of its own);
    ``note`` is what a reader must know (what separates the groups, several sweeps in one folder, records left
    out for a bad value); ``design`` is how the study's records split (:class:`kanlib.analysis.groups.Design`)."""

    data: pd.DataFrame
    groups: list[str] = field(default_factory=list)
    note: str = ""
    design: object = None

    @property
    def empty(self) -> bool:
        return self.data.empty

    def __len__(self) -> int:
        return len(self.data)

    def group_fields(self, drop=()) -> list[str]:
        """The group fields that are columns of the table, less ``drop``."""
        return [f for f in self.groups if f not in drop and f in self.data]

    def with_data(self, data: pd.DataFrame, groups: list[str] | None = None) -> "Table":
        """The same metadata beside other rows (a subset), with ``groups`` when they change."""
        return dataclasses.replace(self, data=data, groups=list(self.groups if groups is None else groups))
