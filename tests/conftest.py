"""Shared fixtures. ``slurm_cluster``: a real SLURM on localhost (tests/slurm_cluster.py);
``no_process_left``: a test of real processes leaves none behind."""

import os
import signal
import time

import pytest

import runhelp


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
