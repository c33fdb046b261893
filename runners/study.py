"""The study driver: ``make study`` is ``python -m runners.study OUT [--params-set NAME] [--jobs N] [-- PARAMS...]``,
a loop over the registry's run order (:func:`kanlib.studies.run_order`).

1. The parameter set, ``notebooks/params/<NAME>/`` (default ``study``; ``--params-set ''`` runs the notebooks' own
   defaults), is checked before anything is written: a set that does not exist is refused naming the sets that do
   (a mistyped name must not run the tiny defaults), and so is a file in it that names no notebook.
2. A set whose ``launch.yaml`` says ``launcher: slurm``, outside an allocation, goes to
   :func:`runners.slurm.study_allocation`: one batch job that runs ``make study`` on its first node, where this
   driver runs again inside the allocation and every sweep's worker groups are job steps.
3. A look at the machine (``python -m runners.preflight OUT``, kept in ``OUT/preflight/``).
4. Each notebook through papermill, ``-p out_dir OUT``, then ``-f launch.yaml`` (launch notebooks) and
   ``-f <notebook>.yaml`` where the set has them, then PARAMS (extra papermill arguments for every notebook): the
   launch notebooks one after the other, their output streamed as it comes; then the analyses JOBS at a time (they
   time nothing), each started :data:`STAGGER_S` after the one before, their output shown whole and in order once
   their batch ends; one whose kernel did not start runs once more (two kernels starting at once can pick the same
   free port: jupyter_client chooses ports before the kernel binds them); then the guidelines, which write the
   report. A failure ends the study once its batch has ended.
5. The analyses and the guidelines exported to offline HTML beside their executed notebooks, and the guidelines'
   one-screen summary (``python -m kanlib.guidelines --summary OUT``).

OUT is made absolute (it may hold spaces). ``--dry-run`` prints the commands and writes nothing; ``--only A,B``
runs those notebooks of the run order (in its order); ``--papermill CMD`` replaces the papermill command.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
import time

from runners import notebook

REPO = notebook.REPO
PARAMS_ROOT = os.path.join("notebooks", "params")
"""Where the parameter sets live (relative to the checkout, where every command runs)."""
BUILD = os.path.relpath(notebook.BUILD_DIR, REPO)
PAPERMILL = (sys.executable, "-m", "papermill", "--cwd", "notebooks", "--log-output", "--progress-bar")
STAGGER_S = 3.0  # between the starts of two analyses of one batch: their kernels do not start at the same instant
KERNEL_RACE = "Kernel died before replying to kernel_info"
"""What papermill says when its kernel did not start (its port taken by the kernel starting beside it)."""


class StudyError(ValueError):
    """Bad input to the driver (a parameter set, a count, a notebook name), refused before anything is written."""


def jobs_count(text: str) -> int:
    """``--jobs`` (make study's JOBS): how many analysis notebooks run at once, a whole number >= 1."""
    if not str(text).isdigit() or int(text) < 1:
        raise StudyError(f"JOBS is how many analysis notebooks run at once, a whole number >= 1; got {text!r}")
    return int(text)


def parameter_set(name: str) -> tuple[str | None, dict]:
    """The folder of parameter set ``name`` (relative to the checkout) and its ``launch.yaml`` values; ``(None,
    {})`` for ``''`` (the notebooks' own defaults). A set that does not exist is a :class:`StudyError` naming the
    sets that do, and so is a file in it that no notebook reads (``<notebook>.yaml`` and ``launch.yaml`` only)."""
    import yaml

    from kanlib.config import ConfigError
    from runners import slurm

    if not name:
        return None, {}
    folder = os.path.join(PARAMS_ROOT, name)
    if not os.path.isdir(os.path.join(REPO, folder)):
        sets = sorted(d for d in os.listdir(os.path.join(REPO, PARAMS_ROOT))
                      if os.path.isdir(os.path.join(REPO, PARAMS_ROOT, d)))
        raise StudyError(f"PARAMS_SET {name!r}: no folder {folder}; the sets: {', '.join(sets)} (PARAMS_SET= runs "
                         f"the notebooks' own defaults)")
    try:
        launch, _ = slurm.params_set(os.path.join(REPO, folder))
    except (ConfigError, OSError, yaml.YAMLError) as e:  # a set's YAML that does not parse, or an unreadable file
        raise StudyError(f"PARAMS_SET {name!r}: {e}") from None
    known = {nb for nb, _ in _order()}
    read = {"launch.yaml"} | {f"{nb}.yaml" for nb in known}
    stray = [f for f in sorted(os.listdir(os.path.join(REPO, folder))) if f.endswith((".yaml", ".yml"))
             and f not in read]
    if stray:
        raise StudyError(f"PARAMS_SET {name!r}: {', '.join(stray)} in {folder} names no notebook, so nothing would "
                         f"read it; a set holds launch.yaml and <notebook>.yaml of: {', '.join(sorted(known))}")
    return folder, launch


def _order() -> list[tuple[str, str]]:
    from kanlib import studies

    return studies.run_order()


def select(only: str | None) -> list[tuple[str, str]]:
    """The run order, or the notebooks named in ``only`` (comma-separated) in its order; an unknown name is a
    :class:`StudyError`."""
    order = _order()
    if not only:
        return order
    names = [n.strip().removesuffix(".ipynb").removesuffix(".py") for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in {nb for nb, _ in order}]
    if unknown:
        raise StudyError(f"--only: {', '.join(unknown)} not a notebook of the study; its notebooks in order: "
                         f"{', '.join(nb for nb, _ in order)}")
    return [(nb, kind) for nb, kind in order if nb in names]


def batches(order: list[tuple[str, str]], jobs: int) -> list[list[tuple[str, str]]]:
    """The notebooks as steps, each run to its end before the next starts: a launch notebook or the guidelines
    alone, analyses ``jobs`` at a time (an analysis never runs beside a launch notebook, whose runs are timed)."""
    from kanlib.studies import ANALYSIS

    steps, batch = [], []
    for nb, kind in order:
        if kind == ANALYSIS:
            batch.append((nb, kind))
            if len(batch) >= jobs:
                steps, batch = steps + [batch], []
            continue
        steps, batch = steps + ([batch] if batch else []) + [[(nb, kind)]], []
    return steps + ([batch] if batch else [])


def papermill_command(nb: str, kind: str, out: str, folder: str | None, params: list[str],
                      papermill: list[str] | tuple[str, ...] = PAPERMILL) -> list[str]:
    """The papermill command of notebook ``nb`` (run in the checkout): ``-p out_dir OUT``, the set's
    ``launch.yaml`` (launch notebooks) and ``<nb>.yaml`` where they exist, then ``params``; the generated
    ``.ipynb`` in, ``OUT/notebooks/<nb>.ipynb`` out."""
    from kanlib.studies import LAUNCH

    files = []
    if folder:
        files = [os.path.join(folder, f) for f in (["launch.yaml"] if kind == LAUNCH else []) + [f"{nb}.yaml"]
                 if os.path.isfile(os.path.join(REPO, folder, f))]
    return [*papermill, "-p", "out_dir", out, *[a for f in files for a in ("-f", f)], *params,
            os.path.join(BUILD, f"{nb}.ipynb"), os.path.join(out, "notebooks", f"{nb}.ipynb")]


def _say(text: str) -> None:
    print(text, flush=True)


def _run(cmd: list[str], log: str | None = None) -> int:
    if log is None:
        return subprocess.run(cmd, cwd=REPO).returncode
    with open(log, "a") as f:
        return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode


def _run_analysis(nb: str, cmd: list[str], log: str, delay_s: float, rc: dict) -> None:
    time.sleep(delay_s)
    code = _run(cmd, log)
    if code != 0:
        with open(log, errors="replace") as f:
            raced = KERNEL_RACE in f.read()
        if raced:
            with open(log, "a") as f:
                f.write(f"== {nb}: its kernel did not start (a port taken by the kernel starting beside it); "
                        f"running it again\n")
            code = _run(cmd, log)
    rc[nb] = code


def run_batch(batch: list[tuple[str, str]], commands: dict[str, list[str]], out: str) -> bool:
    """Run a batch of analyses at once (each :data:`STAGGER_S` after the one before), then print each one's output
    under its name in order; True when every one succeeded."""
    rc, threads = {}, []
    for i, (nb, _) in enumerate(batch):
        log = os.path.join(out, "notebooks", f"{nb}.log")
        if os.path.exists(log):
            os.remove(log)  # a log left by an interrupted study: this run's alone is shown
        t = threading.Thread(target=_run_analysis, args=(nb, commands[nb], log, i * STAGGER_S, rc))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    for nb, _ in batch:
        log = os.path.join(out, "notebooks", f"{nb}.log")
        _say(f"== {nb}")
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                sys.stdout.write(f.read())
            sys.stdout.flush()
            os.remove(log)
    return all(rc.get(nb) == 0 for nb, _ in batch)


def study(out: str, *, params_set: str = "study", jobs: int = 2, params: list[str] = (), only: str | None = None,
          papermill: list[str] | tuple[str, ...] = PAPERMILL, dry_run: bool = False) -> int:
    """Run a study under ``out`` (see the module's docstring); returns the exit status (0: every notebook ran and
    the summary was printed; 1: a step failed; 2: bad input, refused before anything ran)."""
    from kanlib.studies import ANALYSIS, GUIDELINES

    out = os.path.abspath(out)
    params = list(params)
    try:
        jobs = jobs_count(str(jobs))
        order = select(only)
        folder, launch = parameter_set(params_set)
    except StudyError as e:
        print(f"make study: {e}", file=sys.stderr)
        return 2
    if folder and launch.get("launcher") == "slurm" and not os.environ.get("SLURM_JOB_ID"):
        from runners import slurm

        # the venv this driver runs in is make study's $(VENV) ($(VENV)/bin/python runs it)
        make_args = ["study", f"PARAMS_SET={params_set}", f"OUT={out}", f"JOBS={jobs}",
                     f"VENV={os.path.dirname(os.path.dirname(sys.executable))}"]
        make_args += [f"PARAMS={shlex.join(params)}"] if params else []
        make_args += [f"STUDY_ARGS=--only {shlex.quote(only)}"] if only else []
        return slurm.study_allocation(os.path.join(REPO, folder), out, make_args, dry_run=dry_run)
    commands = {nb: papermill_command(nb, kind, out, folder, params, papermill) for nb, kind in order}
    preflight = [sys.executable, "-m", "runners.preflight", out]
    summary = [sys.executable, "-m", "kanlib.guidelines", "--summary", out]
    exported = [os.path.join(out, "notebooks", f"{nb}.ipynb") for nb, kind in order if kind in (ANALYSIS, GUIDELINES)]
    steps = batches(order, jobs)
    if dry_run:
        _say(f"$ {shlex.join(preflight)}")
        for step in steps:
            if len(step) > 1:
                _say(f"# at once, {STAGGER_S:g} s apart:")
            for nb, _ in step:
                _say(f"$ {shlex.join(commands[nb])}")
        _say(f"# offline HTML of {', '.join(os.path.basename(p) for p in exported) or 'none'}")
        _say(f"$ {shlex.join(summary)}")
        return 0
    os.makedirs(os.path.join(out, "notebooks"), exist_ok=True)
    if _run(preflight) != 0:
        return 1
    for nb, _ in order:
        notebook.to_ipynb(nb)  # rewritten only when its source changed (make notebooks writes them too)
    for step in steps:
        if step[0][1] == ANALYSIS:
            if not run_batch(step, commands, out):
                return 1
            continue
        _say(f"== {step[0][0]}")
        if _run(commands[step[0][0]]) != 0:
            return 1
    for path in exported:
        notebook.export_html(path)
    _say(f"Study written under {out}/: records per study, figures in {out}/figures/, executed notebooks and their "
         f"HTML in {out}/notebooks/")
    _say(f"Report: {out}/report.html")
    _say("")
    return _run(summary)


def main(argv: list[str] | None = None) -> int:
    """``python -m runners.study OUT [--params-set NAME] [--jobs N] [--only A,B] [--papermill CMD] [--dry-run]
    [-- PARAMS...]`` (what ``make study`` runs)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    params = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m runners.study", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the study's folder (records, figures, notebooks, report); made absolute")
    p.add_argument("--params-set", default="study",
                   help="a folder of notebooks/params/ ('' runs the notebooks' own defaults; default: study)")
    p.add_argument("--jobs", default="2", help="analysis notebooks run at once (default 2)")
    p.add_argument("--only", default=None, help="comma-separated notebooks of the run order to run (default: all)")
    p.add_argument("--papermill", default=None, help="the papermill command (default: this Python's papermill "
                                                     "with --cwd notebooks --log-output --progress-bar)")
    p.add_argument("--dry-run", action="store_true", help="print the commands; run and write nothing")
    a = p.parse_args(argv)
    return study(a.out, params_set=a.params_set, jobs=a.jobs, params=params, only=a.only,
                 papermill=shlex.split(a.papermill) if a.papermill else PAPERMILL, dry_run=a.dry_run)


if __name__ == "__main__":
    sys.exit(main())
