"""Synthetic records with known answers, for the analysis tests: training records of every study, collective
benchmarks that follow a known link model exactly, and DDP runs that follow it too; and helpers that read
figures."""

import csv
import json
import os
import re
import uuid

import numpy as np
import plotly.graph_objects as go

from kanlib.analysis import commmodel as cm
from kanlib.analysis import load, style
from kanlib.records import STEP_COLUMNS


def rec(**kw):
    """A valid schema-2 record of a run (only the fields the analysis reads)."""
    base = {"schema_version": 2, "code_version": "c0", "git_sha": "abc1234", "study": "strong_scaling",
            "model": "kan", "widths": [2, 8, 1], "grid_size": 5, "spline_order": 3, "kan_impl": "fast", "repeat": 0,
            "nnodes": 1, "comm_hook": "default", "bucket_cap_mb": 25.0, "nccl_algo": "", "n_params": 100,
            "peak_mem_bytes": 1000, "model_state_bytes": 400, "comm_total_s": None, "status": "ok",
            "steps": 30, "emulate_latency_s": 0.0, "emulate_bandwidth_bytes_per_s": 0.0,
            "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00",
            "out_dir": "outputs", "pg_timeout_s": 300.0}
    base.update(kw)
    base["nproc_per_node"] = base.get("nproc_per_node", base["world_size"] // base["nnodes"])
    return base


def write_records(root, recs):
    start = len(load.find_record_files(str(root)))  # several calls add runs, never overwrite
    for i, r in enumerate(recs, start=start):
        d = os.path.join(root, r["study"], f"run{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "record.json"), "w") as f:
            json.dump(r, f)


def strong_records(times: dict, repeats=3, batch=512, **kw):
    """Records at placements ``{"1x2": T, ...}`` (or world sizes ``{2: T}``, one node), ``repeats`` each."""
    out = []
    for p, t in times.items():
        nodes, ppn = (int(v) for v in p.split("x")) if isinstance(p, str) else (1, p)
        out += [rec(world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn, global_batch=batch,
                    step_time_s=t * (1 + 0.01 * r), repeat=r, **kw) for r in range(repeats)]
    return out


def weak_records(model="kan", xs=None, b=64, **kw):
    xs = xs or {1: 1000, 2: 1600, 4: 3200, 8: 6400}
    return [rec(study="weak_scaling", model=model, world_size=n, global_batch=b * n, step_time_s=b * n / x, **kw)
            for n, x in xs.items()]


def comm_records(placement="1x2", caps=None, **kw):
    nodes, ppn = (int(v) for v in placement.split("x"))
    caps = caps or {1.0: (0.012, 0.010, 0.005), 25.0: (0.011, 0.010, 0.004)}
    out = []
    for cap, (ta, tn, ct) in caps.items():
        for r in range(2):
            out.append(rec(study="communication", world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn,
                           bucket_cap_mb=cap, comm_hook="timed", step_time_s=ta * (1 + 0.01 * r), comm_total_s=ct,
                           n_buckets=8 if cap == 1.0 else 1, global_batch=64, repeat=r, **kw))
            out.append(rec(study="communication", world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn,
                           bucket_cap_mb=cap, comm_hook="noop", step_time_s=tn * (1 + 0.01 * r), global_batch=64,
                           repeat=r, **kw))
    return out


# -- guidelines with placements -------------------------------------------------------------------
def guideline_records():
    # strong: 1x2 at 0.909, 2x1 at 0.8, 2x2 at 0.769 (T(1) = 8)
    recs = strong_records({"1x1": 8.0, "1x2": 4.4, "2x1": 5.0, "2x2": 2.6})
    # a second work size: little work per process, 1x2 at 0.5
    recs += strong_records({"1x1": 0.8, "1x2": 0.8}, batch=64)
    # weak, per-process batches 32, 64, 128 at 1x1 and 1x4 (E_w 0.7, 0.825, 0.975) and 2x2 (0.6, 0.7, 0.9)
    for b, xs in {32: (2800, 2400), 64: (3300, 2800), 128: (3900, 3600)}.items():
        recs.append(rec(study="weak_scaling", world_size=1, global_batch=b, step_time_s=b / 1000))
        recs.append(rec(study="weak_scaling", world_size=4, global_batch=4 * b, step_time_s=4 * b / xs[0]))
        recs.append(rec(study="weak_scaling", world_size=4, nnodes=2, global_batch=4 * b, step_time_s=4 * b / xs[1]))
    # communication at 1x4 and 2x2: 2x2 exposes more; 4 MiB is best on one node
    for p, caps in {"1x4": {1.0: (0.013, 0.010, 0.0045), 4.0: (0.011, 0.010, 0.0042), 25.0: (0.012, 0.010, 0.0041)},
                    "2x2": {1.0: (0.020, 0.010, 0.012), 4.0: (0.018, 0.010, 0.011), 25.0: (0.016, 0.010, 0.010)}}.items():
        recs += comm_records(p, caps)
    # KAN: mem = 1e8 + 16 P bytes, time = 1e-3 + 1e-9 P s
    for p in (1e5, 1e6, 1e7):
        recs.append(rec(study="model_size", world_size=1, global_batch=64, widths=[2, int(p), 1], n_params=int(p),
                        peak_mem_bytes=1e8 + 16 * p, model_state_bytes=16 * p, step_time_s=1e-3 + 1e-9 * p))
    return recs


def size_records(sizes=(1_000, 10_000, 100_000), tensor=None, **kw):
    """A KAN and an MLP at each parameter count of ``sizes`` (one process); ``tensor(p)``: the tensor memory of a step
    at ``p`` parameters (``tensor_peak_bytes``; without it the records predate it and hold none)."""
    out = []
    for model, k in (("kan", 1.0), ("mlp", 0.4)):
        for p in sizes:
            more = {"tensor_peak_bytes": tensor(p)} if tensor is not None else {}
            out.append(rec(**{**dict(study="model_size", model=model, world_size=1, global_batch=64,
                                     widths=[2, p // 10, 1], n_params=p, peak_mem_bytes=4e8 + 20 * p,
                                     model_state_bytes=16 * p, step_time_s=k * (1e-3 + 1e-8 * p)), **more, **kw}))
    return out


def write_study(root):
    """Records of the four original studies (strong, weak, communication, model size) under ``root``."""
    recs = strong_records({"1x1": 8.0, "1x2": 4.4, "2x1": 5.0}) + strong_records({"1x1": 0.8, "1x2": 0.8}, batch=64)
    recs += weak_records("kan", {1: 1000, 2: 1600}) + weak_records("mlp", {1: 4000, 2: 7000})
    recs += comm_records("1x2") + comm_records("2x1", {1.0: (0.020, 0.010, 0.012), 25.0: (0.018, 0.010, 0.01)})
    recs += size_records()
    write_records(root, recs)
    return root


def write_new_studies(root):
    """The newer studies under ``root``: time to accuracy, compounding, FSDP, data-parallel options, and a
    collective benchmark with an emulated link and DDP runs that follow it."""
    recs = tta_records() + fsdp_records() + options_records("1x4")
    recs += [comp_rec(k, p, t, repeat=r) for k, ts in {"reference": {"1x1": 10.0, "1x2": 5.5},
                                                      "fast": {"1x1": 4.0, "1x2": 2.5}}.items()
             for p, t in ts.items() for r in range(2)]
    recs += ddp_records()
    write_records(root, recs)
    write_bench(root, "1x2", links())
    write_bench(root, "2x1", links())
    write_bench(root, "2x1", links(INJECTED), emulate_latency_s=INJECTED)
    return root


# -- time to accuracy ----------------------------------------------------------------------------
def tta_rec(placement, batch, steps_to, step_s, lr_rule="none", repeat=0, reached=True, **kw):
    nodes, ppn = (int(v) for v in placement.split("x"))
    return rec(study="time_to_accuracy", world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn, global_batch=batch,
               step_time_s=step_s * (1 + 0.01 * repeat), repeat=repeat, lr_rule=lr_rule,
               lr_base_batch=64 if lr_rule != "none" else 0, target_val_loss=0.02, eval_every=10,
               reached_target=reached, steps_to_target=steps_to if reached else None,
               samples_to_target=steps_to * batch if reached else None,
               time_to_target_s=steps_to * step_s * (1 + 0.01 * repeat) if reached else None,
               final_val_loss=0.019 if reached else 0.05, **kw)


def tta_records():
    out = []
    for r in range(3):
        # strong, global batch 256: the same 100 steps everywhere; steps of 10, 5.5 and 6.25 ms
        out += [tta_rec("1x1", 256, 100, 0.010, repeat=r), tta_rec("1x2", 256, 100, 0.0055, repeat=r),
                tta_rec("2x1", 256, 100, 0.00625, repeat=r)]
        # weak, 64 per process: without lr scaling N=2 needs 75 steps of 128 (9600 samples vs 6400)
        out += [tta_rec("1x1", 64, 100, 0.004, repeat=r), tta_rec("1x2", 128, 75, 0.005, repeat=r)]
        # with the linear rule N=2 needs 50 steps of 128: the same 6400 samples
        out += [tta_rec("1x1", 64, 100, 0.004, "linear", repeat=r), tta_rec("1x2", 128, 50, 0.005, "linear", repeat=r)]
    return out


def write_steps(run_dir, rows):
    with open(os.path.join(run_dir, "steps.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEP_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "" if c not in ("step", "measured", "attempt") else 0) for c in STEP_COLUMNS})


# -- compounding ---------------------------------------------------------------------------------
def comp_rec(impl, placement, t, path=None, repeat=0):
    nodes, ppn = (int(v) for v in placement.split("x"))
    return rec(study="compounding", kan_impl=impl, kan_path=path or impl, world_size=nodes * ppn, nnodes=nodes,
               nproc_per_node=ppn, global_batch=1024, step_time_s=t * (1 + 0.01 * repeat), repeat=repeat)


# -- data-parallel options -------------------------------------------------------------------------
def opt_recs(placement="1x2", hook="timed", t=(0.012, 0.010, 0.004), val=0.100, repeats=2, **kw):
    nodes, ppn = (int(v) for v in placement.split("x"))
    out = []
    for r in range(repeats):
        common = dict(study="communication", world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn, global_batch=64,
                      repeat=r, **kw)
        out.append(rec(comm_hook=hook, step_time_s=t[0] * (1 + 0.01 * r), comm_total_s=t[2], n_buckets=1,
                       final_val_loss=val, **common))
        out.append(rec(comm_hook="noop", step_time_s=t[1] * (1 + 0.01 * r), final_val_loss=val * 3, **common))
    return out


def options_records(placement="1x2"):
    p = placement
    recs = opt_recs(p, val=0.100) + opt_recs(p, hook="bf16", t=(0.011, 0.010, 0.002), val=0.10001)
    recs += opt_recs(p, hook="powersgd", t=(0.0105, 0.010, 0.001), val=0.110, powersgd_rank=1)
    recs += opt_recs(p, grad_accum_steps=2, t=(0.020, 0.019, 0.004), val=0.100)
    recs += opt_recs(p, bucket_cap_mb=0.05, t=(0.015, 0.010, 0.008), val=0.100)
    return recs


# -- FSDP ------------------------------------------------------------------------------------------
def fsdp_records(fsdp_bytes_per_param=8.0):
    out = []
    for par, bpp, slow in (("ddp", 16.0, 1.0), ("fsdp", fsdp_bytes_per_param, 1.3)):
        for p in (10_000, 100_000, 1_000_000, 10_000_000):
            out.append(rec(study="model_size", parallelism=par, world_size=2, nproc_per_node=2, global_batch=64,
                           widths=[2, p // 20, 1], n_params=p, peak_mem_bytes=1e8 + bpp * p, model_state_bytes=16 * p,
                           step_time_s=slow * (1e-3 + 1e-9 * p), final_val_loss=0.1, peak_mem_kind="cuda_max_allocated"))
    return out


SIZES = [8 * 4 ** k for k in range(12)]  # 8 B .. 32 MiB


INTRA = (30e-6, 1e9)


INTER = (100e-6, 2e8)


INJECTED = 0.005


def links(extra_latency=0.0):
    return cm.LinkModel("ring", {"intra": cm.Link.given("intra", *INTRA),
                                 "inter": cm.Link.given("inter", INTER[0] + extra_latency, INTER[1])})


def write_bench(root, placement, model, sizes=SIZES, emulate_latency_s=0.0, name=None):
    n, p = (int(v) for v in placement.split("x"))
    w = n * p
    rows = []
    for s in sizes:
        t = float(model.time_s(s, n, p))
        rows.append({"size_bytes": s, "count": s // 4, "dtype": "float32", "n_iters": 10, "time_s": t,
                     "time_s_p10": t, "time_s_p90": 1.1 * t, "emulated_s": 0.0, "algbw_bytes_per_s": s / t,
                     "busbw_bytes_per_s": s / t * 2 * (w - 1) / w, "nccl_algo_used": None, "nccl_proto_used": None})
    name = name or f"coll-{placement}-{emulate_latency_s:g}"
    d = os.path.join(root, "collbench", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "record.json"), "w") as f:
        json.dump({"schema_version": 2, "record_kind": "collbench", "status": "ok", "study": "collbench", "nnodes": n,
                   "nproc_per_node": p, "world_size": w, "placement": placement, "backend": "gloo", "device": "cpu",
                   "nccl_algo": "", "nccl_proto": "", "emulate_latency_s": emulate_latency_s,
                   "emulate_bandwidth_bytes_per_s": 0.0, "run_key": name, "repeat": 0, "rows": rows}, f)


def ddp_records(backward_s=0.004, compute_s=0.006, waiting_s=0.001):
    """Timed DDP runs and their no-op twins at 1x2 and 2x1, and 2x1 through the emulated link; exposed
    communication as the overlap model gives it for their buckets, hook times with ``waiting_s`` added."""
    out = []
    buckets = [400_000, 800_000, 800_000]
    for (nn, pp), lat in (((1, 2), 0.0), ((2, 1), 0.0), ((2, 1), INJECTED)):
        t = links(lat).time_s(np.asarray(buckets, float), nn, pp)
        ov = cm.overlap(buckets, backward_s, t)
        for r in range(2):
            common = dict(study="communication", world_size=nn * pp, nnodes=nn, nproc_per_node=pp, global_batch=64,
                          bucket_cap_mb=0.5, n_params=500_000, backend="gloo", device="cpu", repeat=r,
                          widths=[2, 8, 1], grid_size=3, final_val_loss=0.1)
            out.append(rec(comm_hook="timed", step_time_s=compute_s + ov["exposed_s"], emulate_latency_s=lat,
                           backward_s=backward_s + ov["exposed_s"], comm_total_s=ov["transfer_s"] + waiting_s,
                           bucket_bytes=buckets, n_buckets=3, run_key=f"timed{nn}{pp}{lat}{r}",
                           emulated_s=3 * 2 * lat if lat else None, **common))
            if not lat:
                out.append(rec(comm_hook="noop", step_time_s=compute_s, backward_s=backward_s,
                               run_key=f"noop{nn}{pp}{r}", **common))
    return out


# -- reading figures ---------------------------------------------------------------------------------
def is_key(t):
    """A legend-key entry: one point at None (draws nothing)."""
    return t.x is not None and len(t.x) == 1 and t.x[0] is None


def without_scripts(text):
    return re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)


def traces_of(fig):
    return style.data_traces(fig)


def n_points(t):
    return sum(v is not None for v in t.x)


def line_traces_have_two_points(fig):
    return all(n_points(t) >= 2 for t in traces_of(fig) if isinstance(t, go.Scatter) and "lines" in (t.mode or ""))


def model_colours(fig):
    """{model: {colours its data traces use}} from the legend group each data trace belongs to."""
    out = {}
    for t in traces_of(fig):
        c = t.line.color if isinstance(t, go.Scatter) and "lines" in (t.mode or "") else t.marker.color
        if isinstance(t, go.Scatter) and t.marker is not None and t.marker.line is not None and t.marker.line.color:
            c = t.marker.line.color if t.marker.color == "white" else c
        out.setdefault(t.legendgroup, set()).add(c)
    return out


def disturbed(recs, foreign=0.85):
    """The runs ``recs`` as disturbed ones: other processes took ``foreign`` of their CPUs over a long enough window
    (kanlib.disturbance.disturbance), each with a run id of its own."""
    return [dict(r, foreign_cpu_frac=foreign, interference_window_s=4.0, run_id=f"hog-{uuid.uuid4().hex}")
            for r in recs]


# -- KAN beside its matched-parameter MLP --------------------------------------------------------------
KAN_PARAMS, MLP_PARAMS = 42880, 43051  # [2, 64, 64, 1] and its matched MLP [2, 205, 205, 1]


def twin_records(kan=(0.008, 0.002, 0.004), mlp=(0.002, 0.002, 0.004), placements=("1x2", "2x1"),
                 drift=(1.0, 1.4, 0.8, 1.2, 0.9), hook_noise=0.0):
    """Communication records of a KAN and its matched-parameter MLP twin at each placement, 25 MiB buckets, one
    round per entry of ``drift`` (a load factor on every run of the round). Per model ``(no-op step, exposed,
    hook time)`` in seconds: the timed run's step is ``(no-op + exposed) x drift``, its hook time ``hook x drift``
    (+ ``hook_noise`` alternating in sign by round); gradient bytes 4 x the parameters, in one bucket."""
    out = []
    for p in placements:
        nodes, ppn = (int(v) for v in p.split("x"))
        for model, widths, n_params, (noop, exposed, hook) in (("kan", [2, 64, 64, 1], KAN_PARAMS, kan),
                                                              ("mlp", [2, 205, 205, 1], MLP_PARAMS, mlp)):
            for r, f in enumerate(drift):
                common = dict(study="communication", model=model, widths=widths, n_params=n_params,
                              world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn, global_batch=256, repeat=r,
                              bucket_cap_mb=25.0)
                out.append(rec(comm_hook="timed", step_time_s=(noop + exposed) * f,
                               comm_total_s=hook * f + hook_noise * (-1) ** r, n_buckets=1,
                               bucket_bytes=[4 * n_params], **common))
                out.append(rec(comm_hook="noop", step_time_s=noop * f, **common))
    return out


def tta_run(placement, steps_to, step_s, first_s=None, repeat=0, warmup=5, compile_s=0.0, slow_step=None,
            attempts=(0,), **kw):
    """A time-to-accuracy record and its ``steps.csv`` rows: ``steps_to`` steps of ``step_s`` (x 1.01^repeat, as
    :func:`tta_rec`), the first ``warmup`` unmeasured; step 0 took ``first_s`` when given (compiling), and
    ``slow_step=(step, s)`` one measured step that long. The record's ``time_to_target_s`` is the sum of every row's
    time, as kanlib.train sums the step walls; ``attempts``: the attempts the rows split into, evenly."""
    times = [step_s * (1 + 0.01 * repeat)] * steps_to
    if first_s is not None:
        times[0] = first_s
    if slow_step is not None:
        times[slow_step[0]] = slow_step[1]
    r = tta_rec(placement, kw.pop("batch", 256), steps_to, step_s, repeat=repeat, compile_s=compile_s, **kw)
    r["time_to_target_s"] = float(sum(times))
    per = -(-steps_to // len(attempts))
    rows = [{"step": s, "measured": int(s >= warmup and attempts[s // per] == attempts[-1]),
             "attempt": attempts[s // per], "step_time_s": t, "val_loss": 0.019 if s == steps_to - 1 else ""}
            for s, t in enumerate(times)]
    return r, rows


def write_tta_runs(root, runs, without_steps=()):
    """Write the records of :func:`tta_run` pairs under ``root`` and each one's ``steps.csv`` (not for the indices
    in ``without_steps``); returns the run folders in order."""
    start = len(load.find_record_files(str(root)))
    write_records(root, [r for r, _ in runs])
    dirs = [os.path.join(root, "time_to_accuracy", f"run{i}") for i in range(start, start + len(runs))]
    for i, (d, (_, rows)) in enumerate(zip(dirs, runs)):
        if i not in without_steps:
            write_steps(d, rows)
    return dirs


# -- one model measured by several studies ---------------------------------------------------------------
def default_study_overlap():
    """What one default study measured of [32, 128, 128, 1] (compiled) at 1x2, by three studies: strong scaling at
    global batch 8192 (76%), weak scaling at 2048 per process (87%) and compounding at global batch 4096 (93%, one
    run), each with its own steps and warm-up; and a model only strong scaling measured ([2, 32, 32, 1])."""
    common = dict(model="kan", widths=[32, 128, 128, 1], grid_size=5, spline_order=3, kan_impl="compiled",
                  kan_path="compiled", precision="fp32", task="highdim")
    out = []
    for r in range(5):
        f = 1 + 0.01 * r
        out += [rec(study="strong_scaling", world_size=1, global_batch=8192, step_time_s=0.800 * f, steps=72,
                    warmup_steps=4, repeat=r, **common),
                rec(study="strong_scaling", world_size=2, global_batch=8192, step_time_s=0.800 / 1.52 * f, steps=72,
                    warmup_steps=4, repeat=r, **common),
                rec(study="weak_scaling", world_size=1, global_batch=2048, step_time_s=0.174 * f, steps=80,
                    warmup_steps=4, repeat=r, **common),
                rec(study="weak_scaling", world_size=2, global_batch=4096, step_time_s=0.200 * f, steps=80,
                    warmup_steps=4, repeat=r, **common),
                rec(study="strong_scaling", world_size=1, global_batch=512, step_time_s=0.010 * f, steps=72,
                    warmup_steps=4, repeat=r, **dict(common, widths=[2, 32, 32, 1])),
                rec(study="strong_scaling", world_size=2, global_batch=512, step_time_s=0.006 * f, steps=72,
                    warmup_steps=4, repeat=r, **dict(common, widths=[2, 32, 32, 1]))]
    for impl, t1, t2 in (("compiled", 0.400, 0.215), ("reference", 1.2, 0.7)):
        out += [rec(study="compounding", world_size=w, global_batch=4096, step_time_s=t, steps=12, warmup_steps=3,
                    **dict(common, kan_impl=impl, kan_path=impl)) for w, t in ((1, t1), (2, t2))]
    return out


def write_calibrated(root, two_process_step_s: float = 0.0056, **kw):
    """A collective benchmark (1x2, 2x1, 2x1 through a 5 ms emulated link) and DDP runs that follow its link model
    exactly, with single- and two-process strong-scaling runs (a compute profile and points to overlay): the
    one-process step 10 ms, the two-process one ``two_process_step_s``; ``kw`` goes to those runs' records."""
    write_bench(root, "1x2", links())
    write_bench(root, "2x1", links())
    write_bench(root, "2x1", links(INJECTED), emulate_latency_s=INJECTED)
    recs = ddp_records()
    for w, t in ((1, 0.010), (2, two_process_step_s)):
        recs += [rec(world_size=w, nproc_per_node=w, global_batch=512, n_params=1_000, widths=[2, 8, 1], grid_size=5,
                     step_time_s=t * (1 + 0.01 * r), backward_s=0.6 * t, repeat=r, **kw) for r in range(3)]
    write_records(root, recs)
    return root
