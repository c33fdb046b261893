"""Shared fixtures. ``slurm_cluster``: a real SLURM on localhost (tests/slurm_cluster.py);
``no_process_left``: a test of real processes leaves none behind; ``study_dir``, ``full_study_dir``,
``calibrated``: folders of synthetic records with known answers (tests/synthetic.py)."""

import os
import signal
import time

import pytest

import runhelp
from synthetic import write_calibrated, write_new_studies, write_study


# Tests of more than a few seconds (torch.compile, notebooks, subprocesses, training to an accuracy) in modules
# other work edits now: marked slow here by name, so that ``make test-fast`` leaves them to ``make test``. An entry
# with brackets names one parametrisation, one without names every parametrisation of the test. Measured with
# ``pytest -m "not slow and not slurm" --durations=0``: each took 3 s or more on this 2-core machine at a load of 8.
# The marker belongs on the test itself; move an entry there when its module is free.
SLOW_ELSEWHERE = {
    "test_analysis.py": ["test_a_training_rank_imports_no_analysis_code", "test_the_analysis_imports_no_torch"],
    "test_distributed.py": ["test_a_process_is_left_to_the_os_when_asked_on_cuda_or_when_not_launched",
                            "test_cpus_are_claimed_in_blocks_of_threads_within_what_the_process_may_use",
                            "test_launched_processes_on_one_host_each_get_cpus_of_their_own"],
    "test_fast_kan.py": ["test_reading_compile_time_waits_for_the_background_preparation",
                         "test_compiled_matches_reference", "test_kernel_paths_follow_grid_updates_and_reset",
                         "test_compile_failure_on_one_device_type_leaves_others_compiled",
                         "test_fast_saves_no_basis_for_backward",
                         "test_non_finite_inputs_give_non_finite_outputs[compiled]",
                         "test_fast_matches_reference_in_float64[1-compiled]",
                         "test_fast_matches_reference_in_float64[2-compiled]",
                         "test_fast_matches_reference_in_float64[3-compiled]",
                         "test_bf16_autocast_error_bound[compiled]", "test_fast_without_standalone_scale[compiled]",
                         "test_a_float32_layer_moved_to_float64_keeps_the_fast_path[compiled]",
                         "test_fast_exact_on_knots_and_grid_ends[compiled]"],
    "test_faults.py": ["test_a_run_started_by_hand_takes_the_run_lock", "test_digits_runs_with_the_default_n_val",
                       "test_grad_accum_steps_in_one_process_without_torchrun",
                       "test_help_prints_usage_and_bad_widths_are_refused",
                       "test_two_processes_asked_without_a_launcher_are_refused"],
    "test_grid_update.py": ["test_a_grid_update_before_the_first_step_is_what_hurt_lbfgs"],
    "test_guidelines.py": ["test_the_cli_refuses_missing_empty_and_failed_only_folders_and_a_zero_target"],
    "test_model.py": ["test_gradients_flow_to_every_parameter", "test_kan_fits_a_simple_function",
                      "test_shapes_params_and_grid_buffer"],
    "test_notebooks.py": ["test_an_analysis_whose_kernel_did_not_start_runs_again",
                          "test_executed_analysis_notebook_shows_figures_untrusted_and_offline",
                          "test_make_study_fails_when_an_analysis_run_in_parallel_fails",
                          "test_make_study_refuses_a_jobs_that_is_not_a_count",
                          "test_make_study_runs_the_analysis_notebooks_two_at_a_time_after_the_launches",
                          "test_make_study_writes_to_an_absolute_out_even_with_spaces",
                          "test_papermill_refuses_a_typo_and_a_bad_type_before_anything_runs"],
    "test_report.py": ["test_a_report_build_reads_each_record_once_and_fits_the_link_model_once",
                       "test_front_page_gives_a_verdict_per_published_claim_and_describes_the_machine",
                       "test_readme_results_are_generated_from_the_outputs_and_checked",
                       "test_report_has_the_calibration_published_setup_and_extrapolation"],
    "test_slurm.py": ["test_make_study_on_a_slurm_parameter_set_is_one_allocation"],
    "test_sweep.py": ["test_code_change_changes_the_run_key"],
}


def pytest_collection_modifyitems(config, items):
    """Mark the tests of :data:`SLOW_ELSEWHERE` slow."""
    for item in items:
        names = SLOW_ELSEWHERE.get(item.path.name, ())
        if item.name in names or getattr(item, "originalname", item.name) in names:
            item.add_marker(pytest.mark.slow)


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
    """:func:`synthetic.write_calibrated`: a collective benchmark with an emulated link and DDP runs that follow its
    link model exactly, with single- and two-process strong-scaling runs."""
    return write_calibrated(tmp_path)


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
