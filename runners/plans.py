"""The plan of each study: a function returning the list of configs to run (the analysis of each study is
its module in kanlib/studies/).

Every point is repeated ``repeats`` times (separate processes, ``repeat`` = 0..repeats-1); ``base``
carries everything a study does not vary (model, task, steps, out_dir, ...): a RunConfig, or a mapping of
RunConfig fields (what a launch notebook's ``config`` holds, see :func:`settings`), turned into one by the
RunConfig's own defaults and checks. A field the plan sets itself (the study, the placement, what it sweeps) is
refused in such a mapping, naming the parameter that sets it, rather than silently replaced.

Where a study spans process counts it takes ``placements``: ``"NxP"`` strings (N nodes x P processes per
node), so one world size can be measured at several placements (``["1x1", "1x2", "2x1"]``: 2 processes on one
node and on two). The older ``world_sizes`` (+ ``procs_per_node``) form is still accepted and becomes placements.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping

from kanlib.config import ConfigError, RunConfig, parse_placement, parse_text

# What every plan sets itself (the config's field -> the parameter that sets it)
_PLACED = {"study": "the study's plan", "nnodes": "placements", "nproc_per_node": "placements", "repeat": "repeats"}


def check_fields(origin: str, values, cls=RunConfig) -> dict:
    """``values`` (a mapping of ``cls`` fields, as a notebook parameter or a YAML parameter file gives it) as a dict:
    a key that is not a field of ``cls`` is a :class:`ConfigError` naming ``origin`` (the parameter it came from),
    the key and the closest field; a string for a field of another type is read as the command line reads it
    (YAML reads ``1e-3`` as a string). The values are checked when the config is built."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{origin}: expected a mapping of {cls.__name__} fields, e.g. {{'steps': 40}}, "
                          f"got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    out = {}
    for key, v in values.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            raise ConfigError(f"{origin}: {key!r} is not a {cls.__name__} field"
                              + (f" (did you mean {close[0]!r}?)" if close else "")
                              + f"; its fields: {', '.join(names)}")
        out[key] = parse_text(key, v, hints[key]) if isinstance(v, str) and hints[key] is not str else v
    return out


def settings(base_config: Mapping | None = None, config: Mapping | None = None, **fields) -> dict:
    """The RunConfig fields a launch notebook gives its plan: ``base_config`` (the notebook's tiny defaults, or the one
    mapping its parameter set's launch.yaml gives every launch notebook), then ``config`` over it (the notebook's
    own settings: a key in both takes ``config``'s value), then ``fields`` (``out_dir``). Each key is checked by
    :func:`check_fields`, naming the parameter it came from; every field not given takes RunConfig's default when
    the plan builds its base config."""
    out = check_fields("base_config", base_config or {})
    out.update(check_fields("config", config or {}))
    for key, v in fields.items():
        out.update(check_fields(key, {key: v}))
    return out


def _base(base, sets: Mapping[str, str] = (), first: Mapping | None = None) -> RunConfig:
    """``base`` as a RunConfig: itself, RunConfig's defaults for None, or a RunConfig built from a mapping of its
    fields, where a field in ``sets`` (field -> the plan's parameter that sets it) is refused. Such a base takes
    ``first``, the plan's first point's values of the fields it sets, so it is checked as a run of the study (not
    with a default the plan replaces anyway, as a global batch beyond the data or widths that do not fit the task)."""
    if base is None:
        return RunConfig(**(first or {}))
    if isinstance(base, RunConfig):
        return base
    values = check_fields("config", base)
    sets = {**_PLACED, **dict(sets)}
    for key in values:
        if key in sets:
            raise ConfigError(f"config: {key!r} is set by the plan ({sets[key]}); set it there, not in config")
    return RunConfig(**{**(first or {}), **values})


# What the communication plans set: the sweep and the emulated link (on multi-node placements only)
_COMM_SETS = {"bucket_cap_mb": "bucket_caps_mb", "nccl_algo": "nccl_algos", "comm_hook": "comm_hooks",
              "emulate_latency_s": "emulate_latency_s",
              "emulate_bandwidth_bytes_per_s": "emulate_bandwidth_bytes_per_s"}
# The machine settings a calibration's collective benchmark takes from its training runs
BENCH_SHARED = ("out_dir", "backend", "device", "threads", "cpu_affinity", "pg_timeout_s")


def _split(world_size: int, procs_per_node: int | None) -> tuple[int, int]:
    """World size as nodes x processes per node (all on one node unless ``procs_per_node`` > 0)."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world_sizes: {world_size!r} is not a positive integer")
    if not procs_per_node:
        return 1, world_size
    if world_size % procs_per_node and world_size > procs_per_node:
        raise ConfigError(f"procs_per_node: world size {world_size} is not a multiple of {procs_per_node}")
    return max(1, world_size // procs_per_node), min(world_size, procs_per_node)


def placements_of(world_sizes=None, placements=None, procs_per_node: int | None = None) -> list[tuple[int, int]]:
    """The (nodes, processes per node) points of a study: ``placements`` and/or ``world_sizes``, in order,
    each once."""
    if world_sizes is None and placements is None:
        raise ConfigError("placements: give placements (e.g. ['1x1', '1x2', '2x1']) or world_sizes")
    for name, v in (("world_sizes", world_sizes), ("placements", placements)):
        if v is not None and (isinstance(v, (str, bytes, int)) or not hasattr(v, "__iter__")):
            raise ConfigError(f"{name}: expected a list, got {v!r}")
    out = [_split(n, procs_per_node) for n in (world_sizes or [])]
    out += [parse_placement(p) for p in (placements or [])]
    seen, unique = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    if not unique:
        raise ConfigError("placements: the study has no point (empty placements and world_sizes)")
    return unique


def _repeat(cfgs: list, repeats: int) -> list:
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats <= 0:
        raise ConfigError(f"repeats: must be a positive integer, got {repeats!r}")
    return [c.replace(repeat=r) for r in range(repeats) for c in cfgs]


def _unique(cfgs: list) -> list:
    seen, out = set(), []
    for c in cfgs:
        if c.run_key() not in seen:
            seen.add(c.run_key())
            out.append(c)
    return out


def strong_scaling(world_sizes=None, base: RunConfig | Mapping | None = None, repeats: int = 1,
                   procs_per_node: int | None = None, placements=None, global_batches=None, widths_list=None,
                   paired: bool = False):
    """Fixed global batch, growing process count, at each placement. ``global_batches`` and
    ``widths_list`` (optional) add points of more or less work per process: each (widths, batch) is its
    own strong-scaling series, from latency-bound to compute-bound. Every width with every batch, or with
    ``paired`` the i-th widths with the i-th batch (equal lengths)."""
    base = _base(base, {**({"global_batch": "global_batches"} if global_batches else {}),
                        **({"widths": "widths_list"} if widths_list else {})},
                 first={**({"global_batch": int(global_batches[0])} if global_batches else {}),
                        **({"widths": tuple(widths_list[0])} if widths_list else {})})
    batches = [int(b) for b in (global_batches or [base.global_batch])]
    widths = [tuple(w) for w in (widths_list or [base.widths])]
    if paired:
        if len(widths) != len(batches):
            raise ConfigError(f"global_batches: paired with widths_list, they need the same length, got "
                              f"{len(batches)} batches and {len(widths)} widths")
        works = list(zip(widths, batches))
    else:
        works = [(w, b) for w in widths for b in batches]
    cfgs = []
    for w, b in works:
        for nodes, ppn in placements_of(world_sizes, placements, procs_per_node):
            cfgs.append(base.replace(study="strong_scaling", nnodes=nodes, nproc_per_node=ppn,
                                     global_batch=b, widths=w, n_train=max(base.n_train, b)))
    return _repeat(cfgs, repeats)


def weak_scaling(world_sizes=None, base: RunConfig | Mapping | None = None, per_process_batches=(64,),
                 repeats: int = 1, procs_per_node: int | None = None, placements=None):
    """Fixed per-process batch, growing process count (global batch = per-process batch x N). Every point
    trains on the same data set (n_train large enough for the largest global batch)."""
    base = _base(base, {"global_batch": "per_process_batches"},
                 first={"global_batch": int(per_process_batches[0])} if per_process_batches else None)
    points = placements_of(world_sizes, placements, procs_per_node)
    n_train = max([base.n_train] + [int(b) * n * p for b in per_process_batches for n, p in points])
    cfgs = []
    for b in per_process_batches:
        for nodes, ppn in points:
            cfgs.append(base.replace(study="weak_scaling", nnodes=nodes, nproc_per_node=ppn,
                                     global_batch=int(b) * nodes * ppn, n_train=n_train))
    return _repeat(cfgs, repeats)


def communication(world_sizes=None, base: RunConfig | Mapping | None = None, bucket_caps_mb=(25.0,),
                  nccl_algos=("",), repeats: int = 1, procs_per_node: int | None = None, placements=None,
                  comm_hooks=("timed",), emulate_latency_s: float = 0.0, emulate_bandwidth_bytes_per_s: float = 0.0,
                  mlp_bucket_caps_mb=()):
    """For each placement, bucket size, NCCL algorithm and communication hook: one run with that hook
    (timed all-reduce, or bf16/fp16/powersgd) and one with the no-op hook, so exposed communication =
    T_hook - T_noop (kanlib.studies.communication). Single-process placements are skipped (nothing to communicate).
    ``emulate_*`` put an emulated inter-node link under the multi-node placements (kanlib.hooks).

    ``mlp_bucket_caps_mb``: at each of these bucket sizes every placement's KAN also runs beside its
    matched-parameter MLP (:func:`mlp_twin`: the parameter count nearest the KAN's, so the all-reduce carries
    nearly the same gradient bytes), with the same global batch, hooks, no-op twins and repeats: repeat ``r`` of
    both runs in round ``r`` (one worker group per placement and round, runners/sweep.py), so that they are compared
    round by round (kanlib.studies.communication.gradient_structure). A bucket size not in ``bucket_caps_mb`` adds
    the KAN's runs there too."""
    base = _base(base, _COMM_SETS)
    points = placements_of(world_sizes, placements, procs_per_node)
    twin = mlp_twin(base) if mlp_bucket_caps_mb else None
    cfgs = []
    for algo in nccl_algos:
        for cap in (*bucket_caps_mb, *mlp_bucket_caps_mb):
            models = [base] + ([twin] if twin is not None and cap in mlp_bucket_caps_mb else [])
            for nodes, ppn in points:
                if nodes * ppn < 2:
                    continue
                for model in models:
                    for hook in (*comm_hooks, "noop"):
                        emulate = hook != "noop" and nodes > 1
                        cfgs.append(model.replace(
                            study="communication", nnodes=nodes, nproc_per_node=ppn, bucket_cap_mb=float(cap),
                            nccl_algo=algo, comm_hook=hook,
                            emulate_latency_s=float(emulate_latency_s) if emulate else 0.0,
                            emulate_bandwidth_bytes_per_s=float(emulate_bandwidth_bytes_per_s) if emulate else 0.0))
    return _repeat(_unique(cfgs), repeats)


def mlp_twin(base: RunConfig) -> RunConfig:
    """``base`` (a KAN of any kind) with the model replaced by its matched-parameter MLP
    (:func:`kanlib.model.matched_mlp`: the KAN's input and output widths, every hidden width scaled alike, the
    parameter count nearest the KAN's); everything else as it is (batch, data, optimizer, ...). Raises ConfigError
    when ``base`` is already an MLP."""
    from kanlib.model import build_model, matched_mlp

    if base.model == "mlp":
        raise ConfigError("mlp_bucket_caps_mb: the study's model is already the MLP; an MLP twin is matched to a KAN")
    mlp = matched_mlp(build_model(base.replace(kan_impl="reference")))  # the reference layer: nothing compiled here
    return base.replace(model="mlp", widths=tuple(mlp.widths))


def communication_options(base: RunConfig | Mapping | None = None, placements=("1x2",), bucket_caps_mb=(25.0,),
                          comm_hooks=("bf16", "powersgd"), options=(), nccl_algos=("",), repeats: int = 1):
    """Each data-parallel option beside plain DDP (the timed all-reduce), each with its no-op twin: the
    communication hooks in ``comm_hooks`` and the DDP settings in ``options`` (dicts of RunConfig fields, e.g.
    ``{"grad_accum_steps": 2}``, ``{"static_graph": True}``), all after the same samples so their validation
    losses compare. Runs that repeat plain DDP's appear once."""
    base = _base(base, _COMM_SETS)
    for o in options:
        if not isinstance(o, dict) or not o:
            raise ConfigError(f"options: each option is a dict of RunConfig fields, got {o!r}")
    cfgs = communication(base=base, placements=placements, bucket_caps_mb=bucket_caps_mb,
                         comm_hooks=("timed", *comm_hooks), nccl_algos=nccl_algos, repeats=repeats)
    for o in options:
        cfgs += communication(base=base.replace(**o), placements=placements, bucket_caps_mb=bucket_caps_mb,
                              nccl_algos=nccl_algos, repeats=repeats)
    return _unique(cfgs)


def calibration(base: RunConfig | Mapping | None = None, bench_base=None, placements=("2x1",),
                emulate_latency_s: float = 0.005, emulate_bandwidth_bytes_per_s: float = 0.0, bucket_caps_mb=(25.0,),
                bench_placements=("1x2", "2x1"), nccl_algos=("",), repeats: int = 1, bench_repeats: int = 1):
    """The known-signal calibration: DDP runs (timed, and their no-op twins) through an emulated inter-node link at
    the multi-node ``placements``, and the collective benchmark at ``bench_placements`` (the machine's own links)
    and at the same multi-node placements through the same emulated link, so the fitted inter-node constants can
    be compared with what was injected. Returns ``(training configs, benchmark configs)``.

    ``bench_base`` is a BenchConfig, or a mapping of BenchConfig fields (a notebook's ``bench_config``) completed
    with the training runs' machine settings (:data:`BENCH_SHARED`: out_dir, backend, device, threads, ...); None
    is the empty mapping."""
    from kanlib.collbench import BenchConfig

    base = _base(base, _COMM_SETS)
    if not isinstance(bench_base, BenchConfig):
        values = check_fields("bench_config", bench_base or {}, BenchConfig)
        for key in values:
            if key in (*BENCH_SHARED, *_PLACED, "nccl_algo", "nccl_proto", "emulate_latency_s",
                       "emulate_bandwidth_bytes_per_s"):
                raise ConfigError(f"bench_config: {key!r} is set by the plan (the training runs' config, placements, "
                                  f"nccl_algos or the emulated link); set it there")
        bench_base = BenchConfig(**{k: getattr(base, k) for k in BENCH_SHARED}, **values)
    # no emulated placement (the notebooks' CI defaults): only the benchmark of the machine's own links
    runs = communication(base=base, placements=placements, bucket_caps_mb=bucket_caps_mb, nccl_algos=nccl_algos,
                         emulate_latency_s=emulate_latency_s,
                         emulate_bandwidth_bytes_per_s=emulate_bandwidth_bytes_per_s,
                         repeats=repeats) if placements else []
    multi = [p for p in placements if parse_placement(p)[0] > 1]
    bench = collbench(bench_placements, bench_base, algos=nccl_algos, repeats=bench_repeats)
    bench += collbench(multi, bench_base.replace(emulate_latency_s=float(emulate_latency_s),
                                                 emulate_bandwidth_bytes_per_s=float(emulate_bandwidth_bytes_per_s)),
                       algos=nccl_algos, repeats=bench_repeats)
    return runs, bench


def model_size(width_list, base: RunConfig | Mapping | None = None, grid_sizes=(5,), depths=None,
               with_mlp: bool = True, repeats: int = 1, world_size: int = 1, parallelisms=("ddp",), placements=None):
    """A sweep over hidden width, depth and grid size; each KAN beside an MLP with a matched parameter count
    (kanlib.model.matched_mlp), same data and batch; each under every ``parallelisms`` (ddp, fsdp), at each
    of ``placements`` (``"NxP"``; without them, ``world_size`` processes on one node).

    ``width_list``: hidden widths; ``depths``: numbers of hidden layers (default: that of ``base``); the input and
    output widths are those of ``base.widths``.
    """
    from kanlib.model import KAN, matched_mlp

    base = _base(base, {"model": "model_size: a B-spline KAN beside its matched MLP", "grid_size": "grid_sizes",
                        "parallelism": "parallelisms"})
    depths = depths or (len(base.widths) - 2,)
    d_in, d_out = base.widths[0], base.widths[-1]
    points = placements_of([world_size] if placements is None else None, placements)
    cfgs = []
    for par in parallelisms:
        for depth in depths:
            for w in width_list:
                widths = (d_in, *([int(w)] * depth), d_out)
                for g in grid_sizes:
                    for nodes, ppn in points:
                        kan = base.replace(study="model_size", model="kan", widths=widths, grid_size=int(g),
                                           nnodes=nodes, nproc_per_node=ppn, parallelism=par)
                        cfgs.append(kan)
                        if with_mlp:
                            mlp = matched_mlp(KAN(widths, grid_size=int(g), spline_order=base.spline_order,
                                                  impl="reference"))
                            cfgs.append(kan.replace(model="mlp", widths=tuple(mlp.widths), grid_size=base.grid_size))
    # an MLP matched to several grid sizes can repeat: keep each config once
    return _repeat(_unique(cfgs), repeats)


def time_to_accuracy(base: RunConfig | Mapping | None = None, placements=("1x1", "1x2"), mode: str = "strong",
                     per_process_batch: int = 64, lr_rules=("none",), repeats: int = 1):
    """Train each placement until the validation loss reaches ``base.target_val_loss`` (or ``base.steps`` run
    out), evaluating every ``base.eval_every`` steps outside the timed region.

    ``mode='strong'``: the global batch stays ``base.global_batch`` (the time-to-target speedup should
    equal the step speedup); ``mode='weak'``: global batch = ``per_process_batch`` x N, with each of
    ``lr_rules`` (none, linear, sqrt relative to the one-process batch) - what the larger batch costs in
    statistical efficiency.
    """
    base = _base(base, {"lr_rule": "lr_rules", "lr_base_batch": "lr_rules and per_process_batch"})
    if mode not in ("strong", "weak"):
        raise ConfigError(f"mode: unknown value {mode!r}; choose strong or weak")
    if not base.target_val_loss:
        raise ConfigError("target_val_loss: time to accuracy trains to a target validation loss; set it (with "
                          "eval_every), e.g. config {'target_val_loss': 0.05, 'eval_every': 10}")
    points = placements_of(None, placements)
    cfgs = []
    for rule in (lr_rules if mode == "weak" else ("none",)):
        for nodes, ppn in points:
            n = nodes * ppn
            batch = base.global_batch if mode == "strong" else per_process_batch * n
            cfgs.append(base.replace(
                study="time_to_accuracy", nnodes=nodes, nproc_per_node=ppn, global_batch=batch,
                n_train=max(base.n_train, batch), lr_rule=rule,
                lr_base_batch=per_process_batch if rule != "none" else 0))
    return _repeat(cfgs, repeats)


def compounding(base: RunConfig | Mapping | None = None, placements=("1x1", "1x2", "2x1"),
                impls=("reference", "fast", "compiled"), repeats: int = 1):
    """The KAN layer implementation crossed with placement: does a faster kernel's speedup multiply with
    the data-parallel speedup, or does it expose communication and lower the efficiency?"""
    base = _base(base, {"model": "compounding: B-spline KANs", "kan_impl": "impls"})
    cfgs = [base.replace(study="compounding", model="kan", kan_impl=impl, nnodes=nodes, nproc_per_node=ppn)
            for impl in impls for nodes, ppn in placements_of(None, placements)]
    return _repeat(cfgs, repeats)


def collbench(placements=("1x2", "2x1"), base=None, algos=("",), protos=("",), repeats: int = 1):
    """The collective benchmark (kanlib.collbench) at each placement, NCCL algorithm and protocol; ``base``
    is a ``BenchConfig`` (its defaults when None)."""
    from kanlib.collbench import BenchConfig, bench_configs

    return bench_configs(placements, base or BenchConfig(), algos=algos, protos=protos, repeats=repeats)
