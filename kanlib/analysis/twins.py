"""A KAN beside its matched-parameter twin at equal gradient bytes, compared round by round: the part of the
published attribution of the communication overhead that any machine decides (not KAN's gradient structure, but the
all-reduce and the link). The communication study (kanlib.studies.communication) selects the points and judges the
claim with these."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import fmt, groups, stats


def median_finite(v) -> float:
    """The median of the finite values of ``v``; NaN when there are none."""
    x = np.asarray([float(e) for e in v], dtype=float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


TWIN_MODEL = "mlp"
"""The model of the matched-parameter twins (runners.plans.communication's ``mlp_bucket_caps_mb``): a control run
beside the KAN at equal gradient bytes, not a subject of the overhead claim, the figure or the guidelines."""


PAIR_FIELDS = ("placement", "bucket_cap_mb", "nccl_algo", "comm_hook", "emulate_latency_s",
               "emulate_bandwidth_bytes_per_s")
"""What a KAN point and its MLP twin share besides every group field but the model and its widths."""


DECIDES = ("decides: communication at equal gradient bytes, KAN vs MLP (any hardware); not decided here: algorithm "
           "choice and inter-node latency (needs real nodes)")
"""What the hardware-independent attribution verdict decides, and what it leaves to a cluster."""


def pair_twins(d: pd.DataFrame, keys: list, group_fields: list, n_boot: int = stats.N_BOOT,
               seed: int = stats.SEED) -> pd.DataFrame:
    """The KAN points of ``d`` (plain DDP, timed hook, each row a point with its per-round ``exposed_rounds`` and
    ``comm_total_rounds``) beside their :data:`TWIN_MODEL` twins equal in ``keys``, compared round by round; the
    columns of :func:`kanlib.studies.communication.gradient_structure`. ``group_fields``: the table's group fields
    (the KAN's group label)."""
    rows = []
    for key, g in groups.groupby(d, keys):
        mlp, kans = g[g["model"] == TWIN_MODEL], g[g["model"] != TWIN_MODEL]
        if mlp.empty or kans.empty:
            continue
        m = mlp.iloc[0]
        for _, k in kans.iterrows():
            row = {"group": groups.model_label({f: k[f] for f in group_fields if f != "widths"}), **key,
                   "kan_model": k["model"], "kan_widths": k.get("widths"), "mlp_widths": m.get("widths"),
                   "kan_params": k.get("n_params", np.nan), "mlp_params": m.get("n_params", np.nan),
                   "kan_bytes": k.get("grad_bytes", np.nan), "mlp_bytes": m.get("grad_bytes", np.nan),
                   "margin_s": stats.MARGIN * float(m["t_allreduce_s"])}
            for what, col in (("exposed", "exposed_rounds"), ("total", "comm_total_rounds")):
                a, b = m.get(col) or (), k.get(col) or ()
                both = sorted(set(dict(a)) & set(dict(b)))
                row[f"mlp_{what}_s"] = median_finite([dict(a)[r] for r in both])
                row[f"kan_{what}_s"] = median_finite([dict(b)[r] for r in both])
                med, lo, hi, n = stats.paired_difference(a, b, n_boot, seed)
                row.update({f"{what}_diff_s": med, f"{what}_diff_lo": lo, f"{what}_diff_hi": hi,
                            what: compare_paired(lo, hi, n, row["margin_s"])})
                row["n_rounds"] = min(row.get("n_rounds", n), n)
            rows.append(row)
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["group", "placement", "bucket_cap_mb"], kind="stable",
                              key=lambda c: c.map(groups.placement_key) if c.name == "placement" else c)
    return out.reset_index(drop=True)


def compare_paired(lo: float, hi: float, n_rounds: int, margin_s: float) -> str:
    """How a KAN's communication compares with its MLP twin's, from the 95% interval ``[lo, hi]`` of the median
    within-round difference (KAN minus MLP, seconds) over ``n_rounds`` shared rounds: ``"larger"`` when the whole
    interval lies above ``margin_s`` (clearly larger beyond the decision margin, as
    :func:`kanlib.analysis.stats.clearly_larger` decides); ``"not larger"`` when the whole interval lies at or below
    it (within the margin, or smaller); ``"undecided"`` when it holds the margin; ``"too few rounds"`` below
    :data:`kanlib.analysis.stats.MIN_PAIRS` shared rounds."""
    if n_rounds < stats.MIN_PAIRS or not np.isfinite([lo, hi]).all():
        return "too few rounds"
    if lo > margin_s:
        return "larger"
    return "not larger" if hi <= margin_s else "undecided"


def display(g: pd.DataFrame) -> pd.DataFrame:
    """:func:`kanlib.studies.communication.gradient_structure` as a reader needs it: per point, the two models' widths, parameters and gradient
    bytes, their exposed communication and hook time (ms) and the paired difference with its interval."""
    if g.empty:
        return pd.DataFrame()

    def diff(r, what):
        return f"{_diff_ms(r, what)}: {r[what]}"

    def both(a, b):
        return [f"{fmt.ms(x)} / {fmt.ms(y)}" for x, y in zip(g[a], g[b])]

    return pd.DataFrame({
        "group": g["group"], "placement": g["placement"], "bucket (MiB)": g["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        "KAN / MLP widths": [f"{fmt.value(a)} / {fmt.value(b)}" for a, b in zip(g["kan_widths"], g["mlp_widths"])],
        "gradient bytes KAN / MLP": [f"{_int(a)} / {_int(b)}" for a, b in zip(g["kan_bytes"], g["mlp_bytes"])],
        "rounds": g["n_rounds"],
        "exposed KAN / MLP (ms)": both("kan_exposed_s", "mlp_exposed_s"),
        "exposed KAN - MLP (ms)": [diff(r, "exposed") for _, r in g.iterrows()],
        "hook time KAN / MLP (ms)": both("kan_total_s", "mlp_total_s"),
        "hook time KAN - MLP (ms)": [diff(r, "total") for _, r in g.iterrows()],
        "margin (ms)": g["margin_s"].map(fmt.ms)}).reset_index(drop=True)


def _signed(v) -> str:
    return f"{v:+.3g}" if np.isfinite(v) else "n/a"


def _diff_ms(r, what: str) -> str:
    """A row's paired difference (KAN minus MLP) of ``what`` in ms with its interval (the value alone when the
    interval is the point: one round)."""
    return fmt.ci_text(*(r[f"{what}_diff{end}"] * 1e3 for end in ("_s", "_lo", "_hi")), _signed)


def _rounds(n) -> str:
    return f"{int(n)} round{'s' if int(n) != 1 else ''}"


def _int(v) -> str:
    return f"{int(v):,}" if np.isfinite(float(v)) else "n/a"


def sentence(g: pd.DataFrame) -> str:
    """One sentence per point of :func:`kanlib.studies.communication.gradient_structure`: the KAN's exposed communication and hook time against
    its matched MLP's, paired by round, with the gradient bytes each all-reduces."""
    parts = []
    for _, r in g.iterrows():
        parts.append(
            f"{r['placement']}, {r['bucket_cap_mb']:g} MiB ({_int(r['kan_bytes'])} against {_int(r['mlp_bytes'])} "
            f"gradient bytes per step, {_rounds(r['n_rounds'])}): exposed {fmt.ms(r['kan_exposed_s'])} against "
            f"{fmt.ms(r['mlp_exposed_s'])} ms, KAN - MLP {_diff_ms(r, 'exposed')} ms ({r['exposed']}); hook time "
            f"{fmt.ms(r['kan_total_s'])} against {fmt.ms(r['mlp_total_s'])} ms, KAN - MLP {_diff_ms(r, 'total')} ms "
            f"({r['total']})")
    return ("KAN against its matched-parameter MLP at equal gradient bytes, paired by round (margin: "
            f"{stats.MARGIN:.0%} of the MLP's step): " + "; ".join(parts) + ".")


def pairs_text(g: pd.DataFrame) -> str:
    """Per point of :func:`kanlib.studies.communication.gradient_structure`, briefly: exposed and hook time, KAN against MLP, with the paired
    difference, its interval and outcome, and the gradient bytes."""
    return "; ".join(
        f"{r['placement']} ({r['bucket_cap_mb']:g} MiB, {_int(r['kan_bytes'])} vs {_int(r['mlp_bytes'])} B, "
        f"{_rounds(r['n_rounds'])}): exposed {fmt.ms(r['kan_exposed_s'])} vs {fmt.ms(r['mlp_exposed_s'])} ms, "
        f"KAN - MLP {_diff_ms(r, 'exposed')} ms ({r['exposed']}); hook time {fmt.ms(r['kan_total_s'])} vs "
        f"{fmt.ms(r['mlp_total_s'])} ms ({r['total']})" for _, r in g.iterrows())


def judge(g: pd.DataFrame) -> dict:
    """The verdict on the hardware-independent part of the published attribution from :func:`pair_twins`' rows
    ``g`` (the rule: :func:`kanlib.studies.communication.judge_gradient_structure`)."""
    if not len(g):
        return {"verdict": "untested", "number": "no matched-parameter MLP beside the KAN",
                "why": f"{DECIDES}; it needs the KAN's MLP twins (03_communication_overhead's mlp_bucket_caps_mb)"}
    num = pairs_text(g)
    few = g[(g["exposed"] == "too few rounds") | (g["total"] == "too few rounds")]
    larger = g[g["exposed"] == "larger"]
    if len(larger):
        where = ", ".join(f"{r['placement']} ({r['bucket_cap_mb']:g} MiB)" for _, r in larger.iterrows())
        return {"verdict": "contradicted", "number": num,
                "why": f"{DECIDES}; at {where} the KAN exposes more communication than the MLP with the same gradient "
                       f"bytes, the whole paired 95% interval beyond the margin ({stats.MARGIN:.0%} of the MLP's "
                       "step); the exposed part also holds the ranks' waiting for each other's compute, longer for "
                       "the KAN, which a busy machine enlarges"}
    if len(few):
        return {"verdict": "untested", "number": num,
                "why": f"{DECIDES}; a paired decision needs {stats.MIN_PAIRS} rounds of both models, "
                       f"{int(few['n_rounds'].min())} here"}
    if (g["exposed"] == "not larger").all() and (g["total"] == "not larger").all():
        return {"verdict": "confirmed", "number": num,
                "why": f"{DECIDES}; on every placement measured the KAN's exposed communication and hook time lie "
                       f"within the margin ({stats.MARGIN:.0%} of the MLP's step) of the MLP's with the same bytes"}
    open_ = [f"{r['placement']} {w}" for _, r in g.iterrows() for w in ("exposed", "total")
             if r[w] != "not larger"]
    hook_only = (g["exposed"] == "not larger").all()
    return {"verdict": "untested", "number": num,
            "why": f"{DECIDES}; undecided: " + ", ".join(open_)
                   + (" (the hook time is larger beyond the margin, but the step does not wait for it: it holds the "
                      "wait for the other rank's longer KAN backward)" if hook_only else
                      " (the paired interval holds the margin: more rounds decide it)")}
