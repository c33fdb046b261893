"""A published claim and its verdict: what every study module that answers one of the paper's claims declares
(``CLAIMS``, a tuple of :class:`Claim`), and the machine facts a verdict depends on.

The paper's numbers stand once, in :data:`kanlib.analysis.presets.PUBLISHED`; a claim's text and its verdict rule
(``judge``) stand in the study module that measures it. The report's front page is a loop over the registry's
claims (:func:`kanlib.front.verdicts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kanlib.analysis.presets import PUBLISHED

VERDICTS = ("confirmed", "contradicted", "not comparable here", "untested")
"""The verdicts a claim can get: untested without records; not comparable here where this machine differs from
the paper's in what the claim depends on; else confirmed or contradicted by the one number given."""
NOT_COMPARABLE = VERDICTS[2]

PAPER_GPUS = PUBLISHED["world_size"]
PAPER_NODES = PUBLISHED["nnodes"]
CLUSTER_RUN = f"the cluster run: >= {PAPER_GPUS} GPUs over >= 2 nodes"
CLUSTER_HOW = "make study PARAMS_SET=gpu_cluster, submitted under SLURM (docs/cluster.md)"
"""The run that tests a claim measured on the paper's GPU cluster."""


@dataclass(frozen=True)
class Claim:
    """One published claim. ``judge(a, machine, other, guidelines, ctx) -> {"verdict", "number", "why"}``: ``a``
    the study's :class:`kanlib.analysis.section.StudyAnalysis` (with records), ``machine`` the facts of
    :func:`kanlib.front.machine`, ``other`` why this machine differs from the paper's ('' when it does not),
    ``guidelines`` the folder's :class:`kanlib.guidelines.Guidelines` (or None), ``ctx`` its context."""

    title: str
    published: str
    judge: Callable[..., dict]
    study: str = ""
    """The report section whose records the claim is judged on ('' for one judged on the guidelines)."""
    test_with: str = CLUSTER_RUN
    """What run would test the claim where this machine cannot ('' for a claim any machine decides)."""


def not_here(machine: dict) -> str:
    """Why a claim measured on the paper's GPU cluster is not comparable with this machine ('' when it is)."""
    why = []
    if not machine["on_gpu"]:
        why.append("CPU, not GPUs")
    if machine["max_n"] < PAPER_GPUS:
        why.append(f"N <= {machine['max_n']} (paper: {PAPER_GPUS})")
    if not machine["real_nodes"]:
        why.append("'nodes' share one host (loopback)")
    return "; ".join(why)


def verdict(ok: bool, number: str, yes: str, no: str, other: str = "") -> dict:
    """A verdict on one number: not comparable here when ``other`` says why, else confirmed (``yes``) or
    contradicted (``no``)."""
    if other:
        return {"verdict": NOT_COMPARABLE, "number": number, "why": other}
    return {"verdict": "confirmed" if ok else "contradicted", "number": number, "why": yes if ok else no}
