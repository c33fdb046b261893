"""The report's first screen: the published claims' verdicts (a loop over the registry's ``CLAIMS``), the bottom
line (what machine this was, what its records can and cannot decide), the project's own findings, the machine
described from the records, and the stability of the points the guidelines rest on. kanlib.report lays the page out;
its README block (kanlib.report.readme_results) says the same in Markdown."""

from __future__ import annotations

import html
import os

import numpy as np
import pandas as pd

from kanlib import studies
from kanlib.analysis import claims, fmt, groups, load, stats
from kanlib.analysis.context import Context
from kanlib.analysis.section import StudyAnalysis


def findings(analyses: dict[str, StudyAnalysis]) -> list[dict]:
    """The findings of every study module, in run order: what these records show (with 95% intervals) beside
    the published study's number. Each is ``{"topic", "ours", "published", "study", "module"}``."""
    out = []
    for m in studies.STUDIES:
        a = analyses.get(m.SECTION)
        if a is not None:
            out += [{**f, "module": m.NAME} for f in m.finding(a)]
    return out


def own_findings(found: list[dict]) -> list[dict]:
    """The project's own findings: those of modules that answer no published claim, and FSDP."""
    return [f for f in found if f.get("module") not in published_modules() or f["topic"].startswith("FSDP")]


# -- the front page: verdicts, the project's own findings, the machine, stability -----------------------------
VERDICTS = claims.VERDICTS


def published_claims() -> list:
    """The published study's claims, in run order: every study module's ``CLAIMS``
    (:class:`kanlib.analysis.claims.Claim`), each given one verdict on the front page (:func:`verdicts`)."""
    return [c for m in studies.STUDIES for c in getattr(m, "CLAIMS", ())]


def published_modules() -> set[str]:
    """Study modules whose findings answer a published claim (the verdict table); the others' are the project's
    own."""
    return {m.NAME for m in studies.STUDIES if any(c.study for c in getattr(m, "CLAIMS", ()))}


def machine(all_a: dict[str, StudyAnalysis], out_dir: str = "", disturbed: list | None = None,
            ctx: Context | None = None) -> dict:
    """The machine described from the records (and the study's pre-flight look when kept): hosts, CPUs per run,
    GPU, what a "node" is here, and the interference the runs measured. Keys: ``rows`` (label, text) and the
    facts the verdicts use: ``on_gpu``, ``max_n``, ``real_nodes`` (several hosts), ``hosts``. ``disturbed``: the
    selection's disturbed runs (:attr:`kanlib.analysis.load.Selection.disturbed`)."""
    disturbed = disturbed or []
    frames = [a.records for _, a in with_records(all_a)]
    if ctx is not None and ctx.frame is None:  # every run, the disturbed ones too: they describe the machine best
        try:
            frames = [ctx.records.select(None, ctx.code, "keep").data]
        except load.NoRecordsError:
            pass
    if not frames:
        return {"rows": [("records", "none")], "on_gpu": False, "max_n": 0, "real_nodes": False, "hosts": []}
    r = groups.with_placement(pd.concat(frames, ignore_index=True))
    hosts = sorted({str(h) for h in r.get("hostname", pd.Series(dtype=str)).dropna() if str(h)})
    on_gpu = on_cuda(r)
    max_n = int(r["world_size"].max())
    multi = r[r["nnodes"] > 1]
    real_nodes = len(hosts) > 1 or ("slurm_nodelist" in r and r["slurm_nodelist"].notna().any())
    pre = _preflight(out_dir)
    cpus = pre.get("cpus") if pre else None
    rows = [("hosts", ", ".join(hosts) or "not recorded"),
            ("compute", (fmt.distinct(r, "device_name") + " (GPU)") if on_gpu else
             "CPU only: no GPU" + (f"; {cpus} CPU(s) on the host" if cpus else "") + (f"; rank 0 pinned to CPUs "
                                                                    f"{fmt.distinct(r, 'rank0_cpus')}"
                                                                    if "rank0_cpus" in r else ""))]
    if len(multi):
        what = (f"{int(multi['nnodes'].max())} hosts" if real_nodes else
                f"{int(multi['nnodes'].max())} torchrun launches on this one host, talking over loopback: "
                f"'inter-node' here is a second process group on the same machine, not a network")
        rows.append(("a 'node' (placements NxP)", what))
    else:
        rows.append(("a 'node' (placements NxP)", "one host; no multi-node placement measured"))
    inter = []
    if "foreign_cpu_frac" in r and pd.to_numeric(r["foreign_cpu_frac"], errors="coerce").notna().any():
        f = pd.to_numeric(r["foreign_cpu_frac"], errors="coerce")
        inter.append(f"other processes took a median {f.median():.0%} (max {f.max():.0%}) of the runs' CPUs")
    if "steal_frac" in r and pd.to_numeric(r["steal_frac"], errors="coerce").notna().any():
        st = pd.to_numeric(r["steal_frac"], errors="coerce")
        inter.append(f"hypervisor steal median {st.median():.0%}" + (" (a shared virtual machine)" if st.max() > 0.01
                                                                     else ""))
    if disturbed:
        inter.append(f"{len(disturbed)} run(s) disturbed (" + ("kept apart" if disturbed[0]["kept"] else "left out")
                     + "; named under Stability)")
    else:
        inter.append(f"no run of {len(r)} disturbed")
    if pre:
        busy = pre.get("busy_processes") or []
        inter.append(f"pre-flight: load {', '.join(f'{v:.2f}' for v in pre.get('load_1m_5m_15m', []))}, "
                     f"{len(busy)} other busy process(es)")
    rows.append(("interference", "; ".join(inter) if inter else "not measured by these records"))
    return {"rows": rows, "on_gpu": on_gpu, "max_n": max_n, "real_nodes": real_nodes, "hosts": hosts}


def _preflight(out_dir: str) -> dict:
    """The newest pre-flight look kept under ``out_dir/preflight/`` ({} when none)."""
    import glob
    import json

    files = sorted(glob.glob(os.path.join(out_dir, "preflight", "*.json"))) if out_dir else []
    for path in reversed(files):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            continue
    return {}


def disturbed_runs(ctx: Context | None) -> list:
    """The disturbed runs of the context's folder (what its policy did with them), even when every run was."""
    if ctx is None:
        return []
    try:
        return ctx.runs().disturbed
    except load.NoRecordsError:
        if ctx.frame is not None:
            return []
        try:
            flagged = ctx.records.select(None, ctx.code, "keep").disturbed
        except load.NoRecordsError:
            return []
        return [{**d, "kept": ctx.disturbed == "keep"} for d in flagged]


def verdicts(all_a: dict[str, StudyAnalysis], guidelines=None, out_dir: str = "", ctx: Context | None = None
             ) -> list[dict]:
    """One verdict per published claim (:func:`published_claims`): ``{"claim", "published", "verdict", "number", "why",
    "study"}``, the verdict one of :data:`VERDICTS`: untested without records; not comparable here when this
    machine differs from the paper's in what the claim depends on (GPUs, 8 processes, real nodes); else confirmed
    or contradicted by the one number given."""
    dist = disturbed_runs(ctx)
    m = machine(all_a, out_dir, dist, ctx)
    other = claims.not_here(m)
    out = []
    for c in published_claims():
        a = all_a.get(c.study) if c.study else None
        v = {"claim": c.title, "published": c.published, "study": c.study or "guidelines", "test_with": c.test_with}
        if c.study and (a is None or a.empty or a.table is None or a.table.empty):
            gone = [d for d in dist if d["study"] == c.study and not d["kept"]]
            why = (f"every {c.study} run was disturbed ({len(gone)} left out; disturbed='keep' shows them apart)"
                   if gone else f"no {c.study} records here")
            out.append({**v, "verdict": "untested", "number": "no undisturbed records" if gone else "no records",
                        "why": why})
            continue
        out.append({**v, **c.judge(a, m, other, guidelines, ctx)})
    return out


def _verdict_html(vs: list[dict]) -> str:
    """The verdict per published claim. A number measured on a machine the claim does not carry to is shown as this
    machine's, muted, never in the column beside the paper's as if it compared; each row says what run would test
    the claim where this one cannot, and links the section whose figures decide it."""
    rows = []
    for v in vs:
        nc = v["verdict"] in (claims.NOT_COMPARABLE, "untested")
        here = (f"<span class='muted'>this machine: {html.escape(v['number'])}</span>" if nc and v["number"] else
                html.escape(v["number"]))
        test = html.escape(v.get("test_with") or "") if nc else "decided here"
        rows.append(f"<tr class='verdict v-{v['verdict'].replace(' ', '-')}'><td><a href='#{v['study']}'>"
                    f"{html.escape(v['claim'])}</a></td><td>{html.escape(v['published'])}</td>"
                    f"<td><b>{html.escape(v['verdict'])}</b></td><td>{here}</td><td>{html.escape(v['why'])}</td>"
                    f"<td>{test or 'any machine'}</td></tr>")
    return ("<table id='verdicts' class='verdicts'><tr><th>published claim</th><th>the paper</th><th>verdict</th>"
            "<th>measured</th><th>why</th><th>what would test it</th></tr>" + "".join(rows) + "</table>")


def bottom_line_html(vs: list[dict], m: dict) -> str:
    """The first screen's first paragraph: what machine this was, what its records can and cannot decide, and
    whether kanlib's CUDA/NCCL path has run on a GPU."""
    import kanlib

    here = dict(m["rows"]).get("compute", "not recorded")
    decided = [v["claim"] for v in vs if v["verdict"] in ("confirmed", "contradicted")]
    not_here = [v["claim"] for v in vs if v["verdict"] == claims.NOT_COMPARABLE]
    untested = [v["claim"] for v in vs if v["verdict"] == "untested"]
    why = claims.not_here(m)
    text = [f"<b>Bottom line.</b> These records come from: {html.escape(here)}; up to {m['max_n']} process(es)"
            + ("" if m["real_nodes"] else ", every 'node' on one host") + "."]
    text.append(("They decide: " + "; ".join(f"<b>{html.escape(c)}</b>" for c in decided) + ".") if decided else
                "They decide none of the published claims.")
    if not_here:
        text.append(f"{len(not_here)} claim(s) depend on what this machine is not ({html.escape(why)}): their "
                    f"numbers below are this machine's, not comparable with the paper's; the last column says what "
                    f"run would test each (the cluster run: {html.escape(claims.CLUSTER_HOW)}).")
    if untested:
        text.append(f"Untested here (no records, or too few): {html.escape(', '.join(untested))}.")
    gpu = (f"kanlib's CUDA/NCCL path last ran on a GPU: {html.escape(kanlib.GPU_CHECKED)}." if kanlib.GPU_CHECKED
           else "kanlib's CUDA/NCCL path has not run on a GPU yet: it is written for one and tested on CPU only.")
    if not m["on_gpu"]:
        text.append(gpu)
    text.append("Intervals: a median over runs with its distribution-free 95% interval; with 5 runs that interval "
                "is the runs' [min, max] (about 94% coverage). A decision is flagged (!) only when it could change "
                "within its intervals or rests on disturbed points or too few runs (see the glossary).")
    return "<div id='bottom-line'><p>" + " ".join(text) + "</p></div>"


def _own_html(found: list[dict]) -> str:
    own = own_findings(found)
    if not own:
        return "<p>No findings of the project's own yet.</p>"
    return ("<table id='own-findings' class='findings'><tr><th>the project's own finding</th><th>here</th></tr>"
            + "".join(f"<tr><td><a href='#{f['study']}'>{html.escape(f['topic'])}</a></td>"
                      f"<td>{html.escape(short(f['ours']))}</td></tr>" for f in own) + "</table>")


def short(text: str, n: int = 170) -> str:
    """The front page keeps to one screen: a long finding is cut (in full under "All findings")."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."


def _machine_html(m: dict) -> str:
    return ("<table id='machine' class='kv'>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                                       for k, v in m["rows"]) + "</table>")


def stability_html(ctx: Context) -> str:
    """Every unstable point, with why: disturbed runs, fewer runs than an interval needs; how many are wide (spread
    wider than the decision margin); and the disturbed runs by name."""
    st = ctx.stability()
    if st.empty:
        return "<p>No measured points.</p>"
    bad = st[st["unstable"]]
    head = (f"<p>{len(bad)} of {len(st)} measured points are unstable: a run was disturbed, or they have fewer than "
            f"{stats.MIN_RUNS} runs (an interval needs {stats.MIN_RUNS}); guidelines resting on them are flagged. "
            f"{int(st['wide'].sum())} have runs spread wider than the {stats.MARGIN:.0%} decision margin: their "
            f"intervals are wide, and a guideline resting on them is flagged only where its decision could change "
            f"within them.</p>")
    note = load.disturbed_note(disturbed_runs(ctx), ctx.disturbed)
    if note:
        head += f"<p class='note'>{html.escape(note)}</p>"
    head += f"<p class='note' id='first-run'>{html.escape(first_run_sentence(ctx.first_run_effect()))}</p>"
    if bad.empty:
        return head
    t = pd.DataFrame({"study": bad["study"], "point": bad["point"], "runs": bad["n_runs"],
                      "disturbed runs": bad["n_disturbed"], "median step (ms)": bad["median"].map(fmt.ms),
                      "spread": bad["spread"].map(lambda v: fmt.pct(v) if np.isfinite(v) else "n/a"),
                      "why unstable": bad["why"]})
    return (head + f"<details id='unstable'><summary>the {len(bad)} unstable points</summary>"
            + t.to_html(index=False, classes="table", border=0) + "</details>")


def first_run_sentence(e: dict) -> str:
    """What the records say about a worker group's first run against its later ones (runs_before_in_launch)."""
    if not e["n"]:
        return ("First run of a launch: no point has both a launch's first run and later runs of a launch, so "
                "whether the first run of a worker group differs is not checked here.")
    return (f"First run of a launch against the later runs of its point: step time {e['median']:.2f}x their median "
            f"(range {e['min']:.2f}-{e['max']:.2f}x, {e['n']} first runs); a ratio near 1 says reusing processes "
            f"does not bias the step.")


def front_page_html(all_a: dict[str, StudyAnalysis], guidelines, out_dir: str, ctx: Context) -> str:
    """One screen: the bottom line (the machine, what it can and cannot decide), a verdict per published claim with
    what would test it, then the project's own findings and the machine."""
    vs = verdicts(all_a, guidelines, out_dir, ctx)
    m = machine(all_a, out_dir, disturbed_runs(ctx), ctx)
    mc = ctx.model_check()
    model = "" if mc.usable else f"<p class='warn'>{html.escape(mc.describe()[0].upper() + mc.describe()[1:])}.</p>"
    return (bottom_line_html(vs, m) + _verdict_html(vs) + model + "<div class='two'><div>"
            + _own_html(findings(all_a)) + "</div><div>" + _machine_html(m) + "</div></div>")



def with_records(analyses: dict[str, StudyAnalysis]) -> list[tuple[str, StudyAnalysis]]:
    return [(s, analyses[s]) for s in studies.record_sections() if s in analyses and not analyses[s].empty]


def on_cuda(df: pd.DataFrame) -> bool:
    return "device" in df and df["device"].astype(str).str.startswith("cuda").any()
