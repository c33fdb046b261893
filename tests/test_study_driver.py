"""The study driver (python -m runners.study, what make study runs): the registry's run order, parameter sets checked
before anything is written, analyses JOBS at a time after the launches, the kernel-start retry, a failure that
stops the study, the SLURM hand-off. papermill is replaced by a fake that copies the notebook and says what it saw,
so nothing here trains or times anything."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from kanlib import studies
from runners import study
from runners.notebook import REPO

sys.path.insert(0, os.path.dirname(__file__))
from synthetic import write_study  # noqa: E402

# A fake papermill: notes which notebooks were running when it started (OUT/notebooks/.running holds one file per
# notebook running now), waits for the notebooks named in PARTNERS to have started (so two that run at once are
# seen to, whatever the machine's load: no timing is asserted), fails as FAIL_NOTEBOOK, or fails once with
# papermill's words for a kernel that did not start, as RACE_NOTEBOOK.
FAKE_PAPERMILL = '''
import json, os, shutil, sys, time
args = sys.argv[1:]
src, dst = args[-2], args[-1]
name = os.path.basename(dst)[:-len(".ipynb")]
folder = os.path.dirname(dst)
running, started = os.path.join(folder, ".running"), os.path.join(folder, ".started")
os.makedirs(running, exist_ok=True)
os.makedirs(started, exist_ok=True)
open(os.path.join(running, name), "w").close()
open(os.path.join(started, name), "w").close()
seen = sorted(os.listdir(running))
print("running", name, flush=True)
partners = [p for p in os.environ.get("PARTNERS", "").split(",") if p]
if name in partners:
    end = time.monotonic() + 120
    while time.monotonic() < end and not set(partners) <= set(os.listdir(started)):
        time.sleep(0.05)
    seen = sorted(set(seen) | (set(partners) & set(os.listdir(started))))  # started while this one ran
race = dst + ".kernel-race"
try:
    if name == os.environ.get("FAIL_NOTEBOOK"):
        print("failing", name, file=sys.stderr)
        sys.exit(3)
    if name == os.environ.get("RACE_NOTEBOOK") and not os.path.exists(race):
        open(race, "w").close()
        print("zmq.error.ZMQError: Address already in use", file=sys.stderr)
        print("RuntimeError: Kernel died before replying to kernel_info", file=sys.stderr)
        sys.exit(1)
    shutil.copy(src, dst)
    with open(dst + ".run.json", "w") as f:
        json.dump({"args": args, "seen": seen}, f)
finally:
    os.remove(os.path.join(running, name))
'''

ANALYSES = ["01_strong_scaling_analysis", "02_weak_scaling_analysis", "04_model_size_scaling_analysis"]


def drive(tmp_path, *args, env=None, params_set="", only=("01_strong_scaling", *ANALYSES, "05_guidelines")):
    """Run the driver in a process of its own with the fake papermill, on a folder of synthetic records."""
    fake = tmp_path / "fake_papermill.py"
    fake.write_text(FAKE_PAPERMILL)
    out = tmp_path / "out dir"
    if not out.exists():
        write_study(out)  # the summary at the end reads records; the fake runs nothing
    cmd = [sys.executable, "-m", "runners.study", str(out), f"--params-set={params_set}",
           f"--papermill={shlex.quote(sys.executable)} {shlex.quote(str(fake))}",
           *([f"--only={','.join(only)}"] if only else []), *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": REPO, "SLURM_JOB_ID": "", **(env or {})})
    return run, out


def seen(out, nb):
    return json.load(open(out / "notebooks" / f"{nb}.ipynb.run.json"))


def test_the_run_order_is_the_registrys_and_holds_every_notebook():
    order = studies.run_order()
    names = [nb for nb, _ in order]
    on_disk = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "notebooks")) if f[:2].isdigit()
                     and f.endswith(".py"))
    assert sorted(names) == on_disk and len(set(names)) == len(names)  # every notebook, once
    kinds = [k for _, k in order]
    assert kinds == sorted(kinds, key=["launch", "analysis", "guidelines"].index)  # launches, analyses, guidelines
    assert order[-1] == ("05_guidelines", "guidelines")
    # each study's notebooks are named by one of its modules, and launches follow STUDIES
    assert set(studies.NOTEBOOKS) <= {m.NAME for m in studies.STUDIES}
    assert [nb for nb, k in order if k == "launch"] == [studies.NOTEBOOKS[m.NAME][0] for m in studies.STUDIES
                                                        if studies.NOTEBOOKS.get(m.NAME, (None,))[0]]
    # the analyses come JOBS at a time, never beside a launch notebook or the guidelines
    steps = study.batches(order, 2)
    assert all(len(s) == 1 for s in steps if s[0][1] != "analysis") and max(map(len, steps)) == 2
    assert [nb for s in steps for nb, _ in s] == names


def test_the_analyses_run_two_at_a_time_after_the_launches_and_out_is_absolute_with_spaces(tmp_path):
    run, out = drive(tmp_path, "--jobs=2", params_set="gpu_cluster",
                     env={"SLURM_JOB_ID": "4242",  # inside an allocation (after salloc) a SLURM set runs here
                          "PARTNERS": ",".join(ANALYSES[:2])})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pre-flight" in run.stdout and (out / "preflight").is_dir()
    launch = seen(out, "01_strong_scaling")
    assert launch["seen"] == ["01_strong_scaling"]  # alone
    args = launch["args"]
    assert args[:3] == ["-p", "out_dir", str(out)]  # absolute, spaces intact, nothing prefixed
    d = os.path.join("notebooks", "params", "gpu_cluster")
    assert args[3:7] == ["-f", f"{d}/launch.yaml", "-f", f"{d}/01_strong_scaling.yaml"]
    assert seen(out, ANALYSES[0])["seen"] == seen(out, ANALYSES[1])["seen"] == ANALYSES[:2]  # the first two at once
    assert seen(out, ANALYSES[2])["seen"] == [ANALYSES[2]]  # the third after both: at most JOBS at a time
    assert seen(out, "05_guidelines")["seen"] == ["05_guidelines"]
    assert seen(out, "05_guidelines")["args"][3:4] != ["-f"]  # no file of its own
    # each analysis's output is printed whole, under its name, in the study's order; no log left behind
    at = [run.stdout.index(f"== {nb}\nrunning {nb}") for nb in ANALYSES]
    assert at == sorted(at) and not list((out / "notebooks").glob("*.log"))
    assert (out / "notebooks" / "05_guidelines.html").exists()
    assert (out / "notebooks" / f"{ANALYSES[0]}.html").exists()
    assert not (out / "notebooks" / "01_strong_scaling.html").exists()  # launch notebooks are not exported
    assert f"Report: {out}/report.html" in run.stdout
    # it ends with the one-screen summary (issue 27.3): the decisions and what they rest on
    tail = run.stdout[run.stdout.index(f"Report: {out}/report.html"):].splitlines()
    assert any(t.startswith("! = could change within its intervals") for t in tail[-3:])
    assert any("decisions;" in t for t in tail)


def test_extra_papermill_arguments_reach_every_notebook_after_the_parameter_files(tmp_path):
    run, out = drive(tmp_path, "--", "-p", "steps", "7", params_set="study", only=("01_strong_scaling",
                                                                                    "05_guidelines"))
    assert run.returncode == 0, run.stdout + run.stderr
    d = os.path.join("notebooks", "params", "study")
    assert seen(out, "01_strong_scaling")["args"][3:9] == ["-f", f"{d}/launch.yaml", "-f", f"{d}/01_strong_scaling.yaml",
                                                        "-p", "steps"]
    assert seen(out, "05_guidelines")["args"][3:6] == ["-p", "steps", "7"]


def test_an_analysis_whose_kernel_did_not_start_runs_again(tmp_path):
    """Two kernels starting at once can pick the same free port (seen in a real make study: 'Address already in
    use', then papermill's 'Kernel died before replying to kernel_info'); that notebook runs once more."""
    run, out = drive(tmp_path, env={"RACE_NOTEBOOK": ANALYSES[1]})
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"== {ANALYSES[1]}: its kernel did not start" in run.stdout
    assert run.stdout.count(f"running {ANALYSES[1]}") == 2 and run.stdout.count(f"running {ANALYSES[0]}") == 1
    assert (out / "notebooks" / f"{ANALYSES[1]}.ipynb").exists() and "Report:" in run.stdout


def test_a_failed_analysis_ends_the_study_once_its_partner_has_finished(tmp_path):
    run, out = drive(tmp_path, env={"FAIL_NOTEBOOK": ANALYSES[1]})
    assert run.returncode == 1
    assert f"failing {ANALYSES[1]}" in run.stdout  # its log is shown
    assert "running it again" not in run.stdout  # another failure is not retried
    assert (out / "notebooks" / f"{ANALYSES[0]}.ipynb").exists()  # its partner finished
    assert not (out / "notebooks" / f"{ANALYSES[2]}.ipynb").exists()  # nothing after the failed batch
    assert not (out / "notebooks" / "05_guidelines.ipynb").exists() and "Report:" not in run.stdout


def test_a_failed_launch_notebook_ends_the_study(tmp_path):
    run, out = drive(tmp_path, env={"FAIL_NOTEBOOK": "01_strong_scaling"})
    assert run.returncode == 1 and "failing 01_strong_scaling" in run.stderr
    assert not (out / "notebooks" / f"{ANALYSES[0]}.ipynb").exists()


@pytest.mark.parametrize("args, words", [
    (["--jobs=two"], "JOBS is how many analysis notebooks run at once, a whole number >= 1; got 'two'"),
    (["--jobs=0"], "JOBS is how many analysis notebooks run at once"),
    (["--only=01_strong_scalng"], "--only: 01_strong_scalng not a notebook of the study"),
])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, args, words):
    run, out = drive(tmp_path, *args, only=())
    assert run.returncode == 2 and words in run.stderr, run.stderr
    assert not (out / "notebooks").exists() and not (out / "preflight").exists()


def test_a_mistyped_parameter_set_is_refused_naming_the_sets_there(tmp_path):
    """Issue 34.2: PARAMS_SET=studdy ran every notebook with only -p out_dir (the Makefile skipped a missing file),
    a tiny study that looked like the one asked for."""
    run, out = drive(tmp_path, params_set="studdy", only=())
    assert run.returncode == 2, run.stdout + run.stderr
    assert ("PARAMS_SET 'studdy': no folder notebooks/params/studdy; the sets: gpu_cluster, study (PARAMS_SET= runs "
            "the notebooks' own defaults)") in run.stderr
    assert not (out / "notebooks").exists() and not (out / "preflight").exists() and "running" not in run.stdout


def test_a_parameter_file_that_names_no_notebook_is_refused(tmp_path, monkeypatch):
    sets = tmp_path / "params"
    (sets / "mine").mkdir(parents=True)
    (sets / "mine" / "01_strong_scalng.yaml").write_text("repeats: 5\n")
    monkeypatch.setattr(study, "PARAMS_ROOT", str(sets))
    with pytest.raises(study.StudyError, match=r"PARAMS_SET 'mine': 01_strong_scalng.yaml in .* names no notebook"):
        study.parameter_set("mine")
    with pytest.raises(study.StudyError, match=r"PARAMS_SET 'nope': no folder .*; the sets: mine \("):
        study.parameter_set("nope")
    assert study.parameter_set("") == (None, {})  # PARAMS_SET= : the notebooks' own defaults


def test_the_dry_run_prints_the_commands_and_writes_nothing(tmp_path):
    out = tmp_path / "a b"
    run = subprocess.run([sys.executable, "-m", "runners.study", str(out), "--jobs=3", "--dry-run", "--", "-p",
                          "steps", "3"], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": REPO, "SLURM_JOB_ID": ""})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    papermill = [shlex.split(ln[2:]) for ln in lines if ln.startswith("$ ") and " papermill " in ln]
    assert [c[-1] for c in papermill] == [str(out / "notebooks" / f"{nb}.ipynb") for nb, _ in studies.run_order()]
    first = papermill[0]
    assert first[first.index("-p"):first.index("-p") + 10] == [
        "-p", "out_dir", str(out), "-f", "notebooks/params/study/launch.yaml", "-f",
        "notebooks/params/study/01_strong_scaling.yaml", "-p", "steps", "3"]
    assert lines.count("# at once, 3 s apart:") == 2  # 7 analyses, 3 at a time: 3, 3, then 1 alone
    assert "-m runners.preflight" in lines[0] and "kanlib.guidelines --summary" in lines[-1]
    assert not out.exists()


def test_a_slurm_parameter_set_is_handed_to_one_allocation(tmp_path):
    """Outside an allocation a set whose launch.yaml says launcher: slurm becomes one batch job whose script runs
    make study (dry run: nothing submitted); PARAMS and JOBS go with it."""
    out = tmp_path / "out dir"
    run = subprocess.run([sys.executable, "-m", "runners.study", str(out), "--params-set=gpu_cluster", "--jobs=3",
                          "--dry-run", "--", "-p", "steps", "9"], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": REPO, "SLURM_JOB_ID": ""})
    assert run.returncode == 0, run.stderr
    assert "#SBATCH --nodes=4" in run.stdout.splitlines()
    [make] = [ln for ln in run.stdout.replace("\\\n", " ").splitlines() if ln.startswith("make ")]
    venv = os.path.dirname(os.path.dirname(sys.executable))
    assert shlex.split(make) == ["make", "study", "PARAMS_SET=gpu_cluster", f"OUT={out}", "JOBS=3", f"VENV={venv}",
                                 "PARAMS=-p steps 9"]
    assert not out.exists()
