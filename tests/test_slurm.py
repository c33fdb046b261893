"""The SLURM launcher: the rendered sbatch script, and real jobs on a SLURM started on localhost
(slurmctld and two slurmd, nodes n1 and n2 with one CPU each; see tests/slurm_cluster.py)."""

import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
import torch

from kanlib import manifest, records
from kanlib.config import ConfigError, RunConfig
from runners.launch import RunFailed, launch_env, read_record, run
from runners.slurm import head_address, run_slurm, sbatch_script, srun_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(tmp_path, **kw) -> RunConfig:
    """A run of a few seconds; one thread per process (each test node has one CPU)."""
    base = dict(study="slurm", widths=(2, 4, 1), grid_size=4, n_train=512, n_val=128,
                global_batch=64, steps=6, warmup_steps=1, threads=1, backend="gloo", device="cpu", kan_impl="fast",
                optimizer="adam", lr=1e-3, out_dir=str(tmp_path))
    base.update(kw)
    return RunConfig(**base)


def srun_tokens(script: str) -> list[str]:
    """The arguments of the script's srun line (continuation lines joined)."""
    joined = script.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.startswith("srun "))
    return shlex.split(line)


@pytest.fixture(scope="module")
def local_two_process(tmp_path_factory):
    """The reference: the tiny config as one local torchrun with 2 processes."""
    return run(tiny(tmp_path_factory.mktemp("local"), nproc_per_node=2), echo=False)


# -- the script (no SLURM needed) ---------------------------------------------------------

def test_dry_run_renders_one_srun_torchrun_per_node(tmp_path):
    cfg = tiny(tmp_path, nnodes=2, nproc_per_node=4, global_batch=64)
    out = io.StringIO()
    assert run_slurm(cfg, dry_run=True, echo=out, partition="gpu", account="proj", gpus_per_node=4,
                     time_limit="01:00:00", modules=["cuda/12.4"], python="/opt/venv/bin/python",
                     env={"NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "WARN"}) is None
    text = out.getvalue()
    assert not os.path.exists(cfg.run_dir()), "a dry run must not write anything"
    run_dir = os.path.abspath(cfg.run_dir())
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --partition=gpu", "#SBATCH --account=proj",
                 "#SBATCH --time=01:00:00", "module load cuda/12.4", "export KANLIB_LAUNCHER=slurm",
                 "export NCCL_SOCKET_IFNAME=ib0", "export NCCL_DEBUG=WARN",
                 # printed as a shell would need it: a checkout at a path with a space is quoted
                 "$ " + shlex.join(["sbatch", "--parsable", f"--output={run_dir}/slurm-%j.log",
                                    f"--chdir={os.getcwd()}", f"{run_dir}/train.sbatch"])):
        assert line in text.splitlines(), f"missing line {line!r} in:\n{text}"
    tokens = srun_tokens(text)
    assert tokens[:6] == ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=4"]
    assert tokens[6:9] == ["/opt/venv/bin/python", "-m", "torch.distributed.run"]
    # the port is picked free on the head node when the job starts (not derived from the job id)
    assert any(ln.startswith("PORT=$(/opt/venv/bin/python -c ") for ln in text.splitlines())
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
            "--rdzv-endpoint=$HEAD_ADDR:$PORT", "--rdzv-id=$SLURM_JOB_ID"} <= set(tokens)
    i = tokens.index("kanlib.train")
    assert RunConfig.from_cli(tokens[i + 1:]) == cfg
    # the script is valid bash, and the rendezvous variables are expanded (double quotes)
    script = text.split("\n", 1)[1].rsplit("\n$ sbatch", 1)[0]
    path = tmp_path / "train.sbatch"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert '"--rdzv-endpoint=$HEAD_ADDR:$PORT"' in script


def test_site_settings_are_checked(tmp_path):
    cfg = tiny(tmp_path, nproc_per_node=4)
    with pytest.raises(ConfigError, match="^nproc_per_node: 4 processes per node but gpus_per_node=2$"):
        sbatch_script(cfg, gpus_per_node=2)
    with pytest.raises(ConfigError, match="^time_limit: expected"):
        sbatch_script(cfg, time_limit="30 minutes")
    with pytest.raises(ConfigError, match="^env: 'BAD-NAME' is not a valid"):
        sbatch_script(cfg, env={"BAD-NAME": "1"})
    assert "--gpus-per-node" not in sbatch_script(cfg)
    with pytest.raises(ConfigError, match="^gpus_per_node: device='cuda' needs gpus_per_node >= 1"):
        sbatch_script(tiny(tmp_path, device="cuda"))


@pytest.mark.parametrize("opts, field", [({"cpus_per_task": "4"}, "cpus_per_task"),
                                         ({"gpus_per_node": "2"}, "gpus_per_node"),
                                         ({"cpus_per_task": 2.5}, "cpus_per_task"),
                                         ({"gpus_per_node": None}, "gpus_per_node")])
def test_slurm_counts_given_as_strings_are_refused_naming_the_setting(tmp_path, opts, field):
    """Issue 23: SLURM ``cpus_per_task``/``gpus_per_node`` given as strings raised raw ValueError/TypeError."""
    with pytest.raises(ConfigError, match=f"^{field}: expected"):
        sbatch_script(tiny(tmp_path), **opts)


def test_srun_command_needs_an_allocation_or_an_endpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cfg = tiny(tmp_path, nnodes=2)
    with pytest.raises(RuntimeError, match="^SLURM_JOB_ID is not set"):
        srun_command(cfg)
    cmd = srun_command(cfg, python="/py", rdzv_endpoint="10.0.0.1:29517", rdzv_id="17")
    assert cmd[:7] == ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=1", "/py"]
    assert "--rdzv-endpoint=10.0.0.1:29517" in cmd and "--rdzv-id=17" in cmd


# -- real jobs ----------------------------------------------------------------------------

@pytest.mark.slurm
def test_two_node_job_matches_a_local_two_process_run(slurm_cluster, local_two_process, tmp_path):
    local = local_two_process
    cfg = tiny(tmp_path, nnodes=2)
    out = io.StringIO()
    rec = run(cfg, launcher="slurm", launcher_opts={"time_limit": "00:05:00"}, timeout_s=120, echo=out)
    assert rec == read_record(cfg)
    assert rec["nnodes"] == 2 and rec["nproc_per_node"] == 1 and rec["world_size"] == 2
    assert rec["launcher"] == "slurm" and local["launcher"] == "local"
    assert rec["slurm_nodelist"] == "n[1-2]" and rec["slurm_job_id"]
    assert rec["final_train_loss"] == pytest.approx(local["final_train_loss"], rel=1e-5)
    assert rec["final_val_loss"] == pytest.approx(local["final_val_loss"], rel=1e-5)
    # the log was streamed and kept in the run folder, next to the script that ran
    log = os.path.join(cfg.run_dir(), f"slurm-{rec['slurm_job_id']}.log")
    assert "rendezvous 127.0.0.1:" in open(log).read()
    assert "rendezvous 127.0.0.1:" in out.getvalue()
    # the script that ran is kept with its launch (the run's worker group, of one run here)
    assert os.path.exists(os.path.join(cfg.out_dir, cfg.study, "launches", rec["launch_id"], "train.sbatch"))


@pytest.mark.slurm
def test_failing_job_raises_with_its_slurm_log(slurm_cluster, tmp_path):
    # Rank 1 (on node n2) raises at step 2: the job fails on the nodes, after submission.
    cfg = tiny(tmp_path, nnodes=2)
    with pytest.raises(RunFailed) as info:
        run(cfg, launcher="slurm", launcher_opts={"env": {"KANLIB_FAULT": "raise@1:2"}}, timeout_s=120, echo=False)
    err = info.value
    # exit code 1 from the rank that raised first, or 143 (SIGTERM) when srun ended it first
    assert re.match(rf"SLURM job {err.job_id} \(run {cfg.run_key()}, 2 nodes x 1\) ended FAILED with "
                    r"exit code \d+:0; first error: kanlib.faults.InjectedFault: KANLIB_FAULT: injected failure on "
                    r"rank 1 at step 2; log: ", str(err)), str(err)
    assert err.returncode not in (0, None)
    assert "srun: error: n" in err.log_tail  # the SLURM log's tail, not only the message
    assert os.path.exists(os.path.join(cfg.run_dir(), f"slurm-{err.job_id}.log"))
    assert read_record(cfg) is None


@pytest.mark.slurm
def test_a_percent_in_out_dir_reaches_sbatch_literally(slurm_cluster, tmp_path):
    """Issue 23: a '%' in out_dir reached ``sbatch --output=``, where SLURM expands ``%j``, so the supervisor
    followed a log that was never written."""
    cfg = tiny(tmp_path / "results %j 100%")
    rec = run(cfg, launcher="slurm", timeout_s=120, echo=False)
    assert rec["status"] == "ok"
    logs = glob.glob(os.path.join(glob.escape(cfg.run_dir()), "slurm-*.log"))
    assert len(logs) == 1 and re.fullmatch(r"slurm-\d+\.log", os.path.basename(logs[0]))
    assert f"kanlib: run {cfg.run_key()} ends" in open(logs[0]).read()  # the log the job wrote, not an empty one


@pytest.mark.slurm
def test_timeout_cancels_the_job(slurm_cluster, tmp_path):
    cfg = tiny(tmp_path, nnodes=2)
    t0 = time.monotonic()
    with pytest.raises(RunFailed, match=r"passed its deadline of 2 s") as info:
        run_slurm(cfg, timeout_s=2, echo=False, sbatch_args=["--begin=now+3600"])
    assert time.monotonic() - t0 < 40
    state = subprocess.run(["scontrol", "show", "job", "-o", info.value.job_id],
                           capture_output=True, text=True)
    assert "JobState=CANCELLED" in state.stdout or "Invalid job id" in state.stderr


@pytest.mark.slurm
def test_sbatch_refusal_is_reported_before_anything_runs(slurm_cluster, tmp_path):
    cfg = tiny(tmp_path, nnodes=2)
    with pytest.raises(RunFailed, match=r"^sbatch refused run .* \(exit 1\): .*invalid partition"):
        run_slurm(cfg, partition="nosuchpartition", echo=False)
    assert read_record(cfg) is None


@pytest.mark.slurm
def test_srun_command_inside_an_allocation(slurm_cluster, tmp_path):
    cfg = tiny(tmp_path, nnodes=2)
    assert head_address("n[1-2]") == "127.0.0.1"
    inner = ("import subprocess, sys; from kanlib.config import RunConfig; "
             "from runners.slurm import srun_command; "
             f"sys.exit(subprocess.run(srun_command(RunConfig.from_cli({cfg.to_cli()!r}))).returncode)")
    proc = subprocess.run(["salloc", "--nodes=2", "--ntasks-per-node=1", "--time=00:05:00",
                           sys.executable, "-c", inner],
                          env=launch_env(cfg, "slurm"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = read_record(cfg)
    assert rec["world_size"] == 2 and rec["launcher"] == "slurm" and rec["slurm_nodelist"] == "n[1-2]"


@pytest.mark.slurm
def test_stopping_a_cluster_leaves_no_process(slurm_cluster):
    """A second, throw-away cluster: stop() must end its daemons and a job still running."""
    from slurm_cluster import LocalSlurm

    other = LocalSlurm(ctld_port=6837, node_ports=(6838, 6839)).start()
    root = other.root
    job = subprocess.run(["sbatch", "--parsable", "--nodes=2", f"--output={root}/sleep-%j.out",
                          "--wrap", "sleep 300"],
                         env=other.env, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    deadline = time.monotonic() + 20
    while "JobState=RUNNING" not in subprocess.run(
            ["scontrol", "show", "job", "-o", job.stdout.strip()], env=other.env,
            capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "the sleep job did not start"
        time.sleep(0.2)
    pids = other.alive()
    assert len(pids) >= 4 + 1  # munged, slurmctld, 2 slurmd, and the job
    other.stop()
    assert other.alive() == []
    left = subprocess.run(["pgrep", "-f", root], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes naming {root} still running: {left}"
    for pid in pids:
        assert not _running(pid), f"pid {pid} of the stopped cluster is still running"
    assert not os.path.exists(root)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


# -- the study notebook on SLURM ------------------------------------------------------------

@pytest.mark.slurm
def test_strong_scaling_notebook_runs_on_slurm(slurm_cluster, tmp_path):
    import papermill

    from runners.notebook import to_ipynb

    NOTEBOOK = to_ipynb("01_strong_scaling")  # generated from notebooks/01_strong_scaling.py

    params = papermill.inspect_notebook(NOTEBOOK)
    for name in ("launcher", "launcher_opts", "out_dir"):
        assert name in params, f"{NOTEBOOK}: the parameters cell has no {name!r}"
    out_dir = tmp_path / "outputs"
    # Each test node has one CPU: several processes of a run share the node's one CPU.
    values = {"launcher": "slurm", "out_dir": str(out_dir),
              "launcher_opts": {"cpus_per_task": 1, "time_limit": "00:05:00"}}
    # Small runs, and world size 2 as 2 nodes x 1 process, where the notebook has those knobs.
    small = {"world_sizes": [1, 2], "procs_per_node": 1, "global_batches": [64], "widths_list": [[2, 8, 1]],
             "repeats": 1, "config": {"steps": 8, "warmup_steps": 2, "threads": 1, "backend": "gloo", "device": "cpu"},
             "timeout_s": 120.0}
    values.update({k: v for k, v in small.items() if k in params})
    papermill.execute_notebook(NOTEBOOK, str(tmp_path / "out.ipynb"), parameters=values,
                               cwd=os.path.dirname(NOTEBOOK), kernel_name="python3",
                               progress_bar=False)
    records = [json.load(open(p)) for p in glob.glob(str(out_dir / "**" / "record.json"), recursive=True)]
    assert records, f"the notebook wrote no record under {out_dir}"
    assert {r["launcher"] for r in records} == {"slurm"}
    assert all(r["slurm_job_id"] for r in records)
    if "procs_per_node" in params:
        assert {(r["nnodes"], r["world_size"]) for r in records} == {(1, 1), (2, 2)}


# -- the same rendezvous without a scheduler (runners/multinode.py) -------------------------

@pytest.mark.slow
def test_multinode_two_torchruns_match_a_local_two_process_run(local_two_process, tmp_path):
    local = local_two_process
    cfg = tiny(tmp_path, nnodes=2)
    out = io.StringIO()
    rec = run(cfg, launcher="multinode", timeout_s=120, echo=out)
    assert rec["nnodes"] == 2 and rec["world_size"] == 2 and rec["launcher"] == "multinode"
    assert rec["final_train_loss"] == pytest.approx(local["final_train_loss"], rel=1e-5)
    assert rec["final_val_loss"] == pytest.approx(local["final_val_loss"], rel=1e-5)
    assert "[node 0] " in out.getvalue() and "[node 1] " in out.getvalue()
    assert all(os.path.exists(os.path.join(cfg.run_dir(), f"launch-node{i}.log")) for i in (0, 1))


@pytest.mark.slow
def test_multinode_timeout_stops_every_node(tmp_path):
    cfg = tiny(tmp_path, nnodes=2, steps=100000, n_train=4096)
    with pytest.raises(RunFailed, match=r"^2 nodes x 1, rendezvous 127\.0\.0\.1:\d+ \(run .*\) "
                                        r"passed its deadline of 3 s; log: "):
        run(cfg, launcher="multinode", timeout_s=3, echo=False)
    left = subprocess.run(["pgrep", "-f", f"--out_dir={tmp_path}"], capture_output=True, text=True)
    assert left.stdout.split() == [], "torchrun or its workers outlived the timeout"


# -- hostile input (no SLURM needed) --------------------------------------------------------

@pytest.mark.parametrize("field, value", [("study", "x\ntouch /tmp/pwned"), ("study", "../../escape"),
                                          ("study", "a b"), ("out_dir", "out\n rm -rf ~")])
def test_fields_that_name_things_refuse_paths_and_control_characters(tmp_path, field, value):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        tiny(tmp_path, **{field: value})


@pytest.mark.parametrize("opts, field", [
    ({"partition": "gpu\n#SBATCH --exclusive"}, "partition"), ({"account": "a;rm -rf /"}, "account"),
    ({"job_name": "x$(id)"}, "job_name"), ({"sbatch_options": ["--mem=1G\nid"]}, "sbatch_options"),
    ({"sbatch_options": ["--comment=$(id)"]}, "sbatch_options"), ({"env": {"A": "1\nid"}}, "env"),
    ({"modules": ["cuda\nid"]}, "modules")])
def test_site_settings_cannot_inject_into_the_script(tmp_path, opts, field):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        sbatch_script(tiny(tmp_path), **opts)


def test_dollar_and_spaces_reach_the_job_literally(tmp_path):
    out = tmp_path / "dir with $HOME and spaces"
    cfg = tiny(out, target="")
    script = sbatch_script(cfg, env={"NOTE": "$HOME; echo hi"})
    path = tmp_path / "s.sbatch"
    path.write_text(script)
    # run the rendered script's srun line with srun replaced by printf: every argument arrives as written
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (fake / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for f in ("srun", "scontrol"):
        os.chmod(fake / f, 0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1",
           "SLURM_NNODES": "1", "HOME": "/should/not/appear"}
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert f"--out_dir={out}" in args and "/should/not/appear" not in proc.stdout.replace("NOTE", "")
    assert "--rdzv-id=5" in args and any(a.startswith("--rdzv-endpoint=127.0.0.1:") for a in args)
    assert "export NOTE='$HOME; echo hi'" in script


# -- one allocation for a sweep (many runs per launch) ------------------------------------------

@pytest.mark.slurm
def test_a_sweep_is_one_allocation_whose_steps_are_the_worker_groups(slurm_cluster, tmp_path):
    from runners.sweep import run_sweep

    configs = [tiny(tmp_path, nnodes=n, nproc_per_node=1, seed=s) for n in (1, 2) for s in (1, 2, 3)]
    res = run_sweep(configs, launcher="slurm", launcher_opts={"time_limit": "00:10:00"}, timeout_s=120,
                    progress=False, rerun_disturbed=False)
    assert res.ok and len(res.records) == 6, res.failures
    assert len({r["slurm_job_id"] for r in res.records}) == 1  # one batch job
    assert {r["slurm_nodelist"] for r in res.records} == {"n[1-2]"}
    launches = manifest.read_jsonl(os.path.join(str(tmp_path), "slurm", records.LAUNCHES_NAME))
    assert sorted(row["placement"] for row in launches) == ["1x1", "2x1"]
    assert all(row["launcher"] == "slurm" and row["n_ok"] == 3 for row in launches)
    for row in launches:  # each worker group was a job step: srun's own log beside its plan
        assert row["logs"] == [os.path.join(os.path.dirname(row["logs"][0]), "srun.log")]
        mine = sorted(r["runs_before_in_launch"] for r in res.records if r["launch_id"] == row["launch_id"])
        assert mine == [0, 1, 2]
    # the allocation's own folder holds its script and log; the sweep ran inside it
    [alloc] = glob.glob(os.path.join(str(tmp_path), "slurm", "allocations", "*"))
    assert os.path.exists(os.path.join(alloc, "allocation.sbatch")) and os.path.exists(os.path.join(alloc, "sweep.json"))
    # a second sweep submits nothing: every run is done
    again = run_sweep(configs, launcher="slurm", launcher_opts={"time_limit": "00:10:00"}, progress=False,
                      rerun_disturbed=False)
    assert again.skipped == 6 and len(glob.glob(os.path.join(str(tmp_path), "slurm", "allocations", "*"))) == 1


def test_make_study_on_a_slurm_parameter_set_is_one_allocation(tmp_path):
    """make study PARAMS_SET=gpu_cluster outside an allocation submits one batch job, sized for the set's largest
    placement, whose script runs make study inside it (dry run: nothing is submitted)."""
    out = subprocess.run([sys.executable, "-m", "runners.slurm", "study", os.path.join(REPO, "notebooks", "params",
                          "gpu_cluster"), str(tmp_path / "out dir"), "--dry-run", "--", "study",
                          "PARAMS_SET=gpu_cluster", f"OUT={tmp_path / 'out dir'}"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for line in ("#SBATCH --nodes=4", "#SBATCH --gpus-per-node=2", "#SBATCH --time=12:00:00", "#SBATCH --partition=gpu",
                 "export NCCL_SOCKET_IFNAME=ib0",
                 "#SBATCH --cpus-per-task=8"):  # 2 GPUs' processes x launch.yaml's base_config threads 4
        assert line in lines, out.stdout
    [make] = [ln for ln in out.stdout.replace("\\\n", " ").splitlines() if ln.startswith("make ")]
    assert shlex.split(make) == ["make", "study", "PARAMS_SET=gpu_cluster", f"OUT={tmp_path / 'out dir'}"]
    assert not os.path.exists(tmp_path / "out dir" / "allocations"), "a dry run writes nothing"
    # make study hands such a set to it (the study driver does; inside an allocation it runs the study there)
    stamp = tmp_path / "stamp"
    stamp.touch()
    plan = subprocess.run(["make", "study", "PARAMS_SET=gpu_cluster", f"OUT={tmp_path / 'out dir'}",
                           f"VENV={os.path.dirname(os.path.dirname(sys.executable))}", f"STAMP={stamp}",
                           "STUDY_ARGS=--dry-run"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "SLURM_JOB_ID": ""})
    assert plan.returncode == 0, plan.stderr
    assert "#SBATCH --nodes=4" in plan.stdout.splitlines() and "\nmake study PARAMS_SET=gpu_cluster" in plan.stdout
    assert subprocess.run([sys.executable, "-m", "runners.slurm", "uses-slurm",
                           os.path.join(REPO, "notebooks", "params", "study")], cwd=REPO).returncode == 1


def test_a_parameter_set_that_does_not_exist_is_refused_naming_the_sets():
    """Issue 34.2: params_set turned a missing folder into {}, so a mistyped gpu_cluster ran the small set."""
    from runners.slurm import params_set

    missing = os.path.join(REPO, "notebooks", "params", "gpu_clustr")
    with pytest.raises(ConfigError, match=r"^parameter set 'gpu_clustr': no folder .*gpu_clustr; the sets in .*"
                                          r"params: gpu_cluster, study$"):
        params_set(missing)
    run = subprocess.run([sys.executable, "-m", "runners.slurm", "uses-slurm", missing], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 2 and "parameter set 'gpu_clustr': no folder" in run.stderr
    launch, nodes = params_set(os.path.join(REPO, "notebooks", "params", "gpu_cluster"))
    assert launch["launcher"] == "slurm" and nodes == 4
