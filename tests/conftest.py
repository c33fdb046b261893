"""Shared fixtures. ``slurm_cluster``: a real SLURM on localhost (tests/slurm_cluster.py);
``no_process_left``: a test of real processes leaves none behind; ``study_dir``, ``full_study_dir``,
``calibrated``: folders of synthetic records with known answers (tests/synthetic.py)."""

import os
import signal
import time

import pytest

import runhelp
from synthetic import (INJECTED, ddp_records, links, rec, write_bench, write_new_studies, write_records,
                       write_study)


@pytest.fixture(scope="session")
def slurm_cluster():
    """munged + slurmctld + two slurmd (nodes n1, n2 with one CPU each) on this machine, for the
    whole session, with ``SLURM_CONF`` exported; every daemon is stopped by PID afterwards and
    the tear-down fails if any process of the cluster outlives it.

    Installs SLURM with .ci/install-slurm.sh when missing. Skips when that is impossible (no root,
    no apt-get), except under CI or KANLIB_REQUIRE_SLURM=1, where it fails.
    """
    from slurm_cluster import LocalSlurm, ensure_installed

    required = bool(os.environ.get("CI") or os.environ.get("KANLIB_REQUIRE_SLURM"))
    why = ensure_installed()
    if why is None and os.geteuid() != 0:
        why = "the local SLURM test cluster needs root (slurmd runs jobs as their submitter)"
    if why is not None:
        (pytest.fail if required else pytest.skip)(f"no local SLURM: {why}")
    cluster = LocalSlurm().start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", cluster.conf)
            yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def no_process_left(tmp_path):
    """Fail a test that leaves a process of its runs behind (and kill those processes). Modules of
    multi-process runs use it with ``pytestmark = pytest.mark.usefixtures("no_process_left")``."""
    yield
    end = time.monotonic() + 20
    left = runhelp.processes_mentioning(str(tmp_path))
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = runhelp.processes_mentioning(str(tmp_path))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def study_dir(tmp_path):
    """Records of the four original studies (strong, weak, communication, model size)."""
    return write_study(tmp_path)


@pytest.fixture
def full_study_dir(study_dir):
    """``study_dir`` plus the newer studies (:func:`synthetic.write_new_studies`)."""
    return write_new_studies(study_dir)


@pytest.fixture
def calibrated(tmp_path):
    """A collective benchmark (1x2, 2x1, 2x1 through a 5 ms emulated link) and DDP runs that follow its link
    model exactly, with single- and two-process strong-scaling runs (a compute profile and points to overlay)."""
    write_bench(tmp_path, "1x2", links())
    write_bench(tmp_path, "2x1", links())
    write_bench(tmp_path, "2x1", links(INJECTED), emulate_latency_s=INJECTED)
    recs = ddp_records()
    for w, t in ((1, 0.010), (2, 0.0056)):
        recs += [rec(world_size=w, nproc_per_node=w, global_batch=512, n_params=1_000, widths=[2, 8, 1], grid_size=5,
                     step_time_s=t * (1 + 0.01 * r), backward_s=0.6 * t, repeat=r) for r in range(3)]
    write_records(tmp_path, recs)
    return tmp_path


@pytest.fixture
def full_disk(tmp_path):
    """A real 256 KiB filesystem (tmpfs, mounted as root) that the test can fill."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("cannot mount a small tmpfs (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill_disk(folder) -> None:
    """Write a file into ``folder`` until its filesystem is full."""
    fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: the disk is full
        pass
    finally:
        os.close(fd)
