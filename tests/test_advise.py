"""The deployment advisor (kanlib.advise, kanlib.analysis.advisor): on records made by a known model it recovers the
known answer; it refuses when its model fails its own leave-one-out check; its command line exits 2 on a folder
without the studies it needs; the what-if with a preset link gives the numbers computed by hand."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kanlib import advise
from kanlib.analysis import advisor, presets
from kanlib.analysis import commmodel as cm
from synthetic import links, rec, write_bench, write_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = {"model": "kan", "widths": (2, 8, 1), "grid_size": 5, "spline_order": 3}
N_PARAMS = 240  # kan_param_bytes([2, 8, 1], 5, 3) / 4
BATCH = 4096
TRUE = cm.ComputeProfile(1e-7, 5e-4, 2.0 / 3.0, "known")  # s per sample-parameter, fixed s per step
HOST = 1.1  # a process's compute at N > 1 over one alone
PLACEMENTS = ((1, 2), (2, 1), (2, 2))


def known_step(nnodes: int, ppn: int, cap: float = 25.0, host: float = HOST) -> float:
    """The DDP step the known model gives (no stragglers)."""
    w = nnodes * ppn
    p = cm.predict_scaling(links(), TRUE, cm.kan_param_bytes(CFG["widths"]), [1, w], ppn, global_batch=BATCH,
                           bucket_cap_mb=cap, host_factor=host)
    return float(p["step_time_s"].iloc[-1])


def write_known_study(root, bad_point: tuple | None = None, bench: bool = True) -> str:
    """Single-process runs at two batches (and a slower kernel's at one), the collective benchmark at 1x2 and 2x1,
    and DDP steps at 1x2, 2x1 and 2x2, all from the known model (``bad_point``: a placement whose measured step is
    1.6x the model's)."""
    common = dict(widths=list(CFG["widths"]), grid_size=5, spline_order=3, n_params=N_PARAMS, backend="gloo",
                  device="cpu", peak_mem_bytes=2_000_000)
    recs = [rec(world_size=1, global_batch=b, step_time_s=float(TRUE.step_s(N_PARAMS, b)), repeat=r, **common)
            for b in (BATCH, BATCH // 8) for r in range(2)]
    # another kernel's single-process runs, 3x slower: never this configuration's compute
    recs += [rec(world_size=1, global_batch=BATCH, step_time_s=3 * float(TRUE.step_s(N_PARAMS, BATCH)), repeat=r,
                 **{**common, "kan_impl": "reference"}) for r in range(2)]
    for nn, pp in PLACEMENTS:
        t = known_step(nn, pp) * (1.6 if (nn, pp) == bad_point else 1.0)
        recs += [rec(world_size=nn * pp, nnodes=nn, nproc_per_node=pp, global_batch=BATCH, step_time_s=t, repeat=r,
                     **common) for r in range(2)]
    write_records(root, recs)
    if bench:
        write_bench(root, "1x2", links())
        write_bench(root, "2x1", links())
    return str(root)


def test_the_advisor_recovers_the_known_model_and_its_answer(tmp_path):
    root = write_known_study(tmp_path)
    adv = advise.advise(root, target=0.8)
    assert adv.ok and adv.check.ok and adv.check.n_points == 3
    assert adv.check.max_abs_err < 1e-3  # each point predicted without its own step, by the model that made it
    assert adv.config == {**CFG, "kan_impl": "fast"} and adv.global_batch == BATCH
    assert adv.loo["own_host_factor"].to_numpy(float) == pytest.approx([HOST] * 3, rel=1e-3)
    # the known answer: the known model on nodes of 2 processes (the benchmark's 1x2), 25 MiB buckets
    truth = cm.predict_scaling(links(), TRUE, cm.kan_param_bytes(CFG["widths"]), cm.powers_of_two(1024), 2,
                               global_batch=BATCH, bucket_cap_mb=25.0, host_factor=HOST)
    n = cm.largest_world_size_at(truth, 0.8)
    assert n == 4 and truth.set_index("world_size").loc[8, "efficiency"] < 0.8
    got = {a.question: a for a in adv.answers}
    world = got["largest world size at the target"]
    assert world.value.startswith(f"{n} (") and f"{n}-{n} within" in world.band
    assert "3 DDP point(s) checked" in world.rests_on
    assert got["batch per process"].value.startswith(f"{BATCH / n:.4g} ")
    assert got["bucket size"].value.startswith("25 MiB")  # one bucket at every size: no difference, the default
    # a ring across nodes waits for its inter-node hops either way: 2x2 and 4x1 alike, the fewer nodes named
    assert got["placement at N=4"].value == "2x2 (no difference within the band from 4x1)"
    text = advise.advice_text(adv)
    assert "Leave one out over 3 DDP point(s)" in text and "REFUSED" not in text


def test_the_quantities_that_carry(tmp_path):
    root = write_known_study(tmp_path)
    from kanlib.analysis.context import Context

    ctx = Context(root)
    q = advisor.carried_quantities(ctx.runs().data, ctx.link_fit().fits)
    assert set(q["kan_impl"]) == {"fast", "reference"}
    q = q[q["kan_impl"] == "fast"].set_index(["placement", "global_batch"])
    r = q.loc[("2x1", BATCH)]
    assert r["samples_per_s_per_process"] == pytest.approx(BATCH / known_step(2, 1) / 2)
    assert r["grad_bytes_per_step"] == 4 * N_PARAMS and r["link"] == "inter"
    assert r["link_latency_s"] == pytest.approx(100e-6, rel=1e-6) and r["link_bandwidth_bytes_per_s"] == \
        pytest.approx(2e8, rel=1e-6)
    transfer = float(links().time_s(4 * N_PARAMS, 2, 1))
    compute = float(TRUE.step_s(N_PARAMS, BATCH / 2))  # no no-op twin: the single-process profile at B/2
    assert r["transfer_s"] == pytest.approx(transfer) and r["step_compute_s"] == pytest.approx(compute)
    assert r["compute_to_comm_ratio"] == pytest.approx(compute / transfer)
    assert r["exposed_comm_s"] == pytest.approx(known_step(2, 1) - compute)
    assert q.loc[("1x2", BATCH), "link_latency_s"] == pytest.approx(30e-6, rel=1e-6)
    one = q.loc[("1x1", BATCH)]
    assert one["exposed_comm_s"] == 0 and one["peak_mem_bytes_per_process"] == 2_000_000


def test_the_advisor_refuses_when_its_model_fails_its_check(tmp_path):
    root = write_known_study(tmp_path, bad_point=(2, 1))
    adv = advise.advise(root, target=0.8)
    assert not adv.check.ok and not adv.ok and not adv.answers
    assert adv.check.max_abs_err > advisor.LOO_POINT_MAX
    assert "failed its own check" in adv.refused[0] and "> 25%" in adv.refused[0]
    r = subprocess.run([sys.executable, "-m", "kanlib.advise", root, "--target", "0.8"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert "REFUSED: its model failed its own check" in r.stdout and "2x1" in r.stdout


def test_the_advisor_refuses_a_model_far_beyond_the_work_it_measured(tmp_path):
    root = write_known_study(tmp_path)
    adv = advise.advise(root, target=0.8, widths=[64, 4096, 4096, 1], global_batch=65536)
    assert not adv.ok and "beyond 4x the single-process work measured" in adv.refused[0]


@pytest.mark.parametrize("what", ["empty", "no benchmark"])
def test_the_command_line_exits_2_on_a_folder_without_the_studies_it_needs(tmp_path, what):
    if what == "no benchmark":
        write_known_study(tmp_path, bench=False)
    r = subprocess.run([sys.executable, "-m", "kanlib.advise", str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    if what == "empty":
        assert r.stderr.startswith("kanlib.advise: no training records under")
    else:
        assert "the advisor needs the collective benchmark (notebook 03" in r.stderr


def test_what_if_with_a_preset_gives_the_numbers_computed_by_hand():
    """a100-hdr, ring: a node of 8 on NVLink (0.6 us per hop, 300 GB/s), beyond on HDR (2.7 us, 25 GB/s), NCCL's
    6.6 us base; 10 MB of gradients in one 25 MiB bucket, ready when backward ends, so all of it is exposed."""
    x, b = 0.05, 1e7
    t8 = 6.6e-6 + 2 * 7 * 0.6e-6 + 2 * 7 / 8 * b / 300e9
    t64 = 6.6e-6 + 2 * 63 * 2.7e-6 + 2 * 63 / 64 * b / 25e9
    t1024 = 6.6e-6 + 2 * 1023 * 2.7e-6 + 2 * 1023 / 1024 * b / 25e9
    pred = advisor.what_if(x, b, presets.preset("a100-hdr").link_model("ring"), [8, 64, 1024], 8)
    assert pred["exposed_s"].to_numpy() == pytest.approx([t8, t64, t1024], rel=1e-9)
    assert pred["efficiency"].to_numpy() == pytest.approx([x / (x + t) for t in (t8, t64, t1024)], rel=1e-9)
    assert [f"{e:.2%}" for e in pred["efficiency"]] == ["99.85%", "97.78%", "88.76%"]
    assert list(zip(pred["nnodes"], pred["nproc_per_node"])) == [(1, 8), (8, 8), (128, 8)]
    # strong scaling: the one-process step split over the devices
    strong = advisor.what_if(x, b, presets.preset("a100-hdr").link_model("ring"), [8], 8, scaling="strong")
    assert strong["compute_s"].iloc[0] == pytest.approx(x / 8)
    r = subprocess.run([sys.executable, "-m", "kanlib.advise", "--what-if", "--step-compute-s", "0.05", "--grad-bytes",
                        "1e7", "--link", "a100-hdr", "--world-sizes", "8,64,1024", "--target", "0.9"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "88.8%" in r.stdout and "largest world size at 90%: 64" in r.stdout


def test_what_if_refuses_what_it_cannot_compute():
    m = presets.preset("a100-hdr").link_model("ring")
    with pytest.raises(ValueError, match="^world_sizes: need positive sizes, multiples of gpus_per_node=8"):
        advisor.what_if(0.05, 1e7, m, [12], 8)
    r = subprocess.run([sys.executable, "-m", "kanlib.advise", "--what-if", "--step-compute-s", "0.05",
                        "--grad-bytes", "1e7"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "needs --link PRESET, or --latency-s and --bandwidth-Bps" in r.stderr


def test_the_report_shows_the_advice_and_what_it_predicts_on_other_links(tmp_path):
    # issue 37.1/3: the report's advisor section holds the answers, the quantities that carry, and predicted
    # efficiency against world size for this machine's links and the presets'; a folder whose model fails its check
    # shows why it refuses instead
    from kanlib import report
    from kanlib.analysis.context import Context

    root = write_known_study(tmp_path / "good")
    body = advise.report_section(Context(root), target=0.8)
    assert "largest world size at the target" in body and "The advisor refuses" not in body
    assert "Quantities that carry to another machine" in body and "Leave-one-out check" in body
    for name in ("this machine's links",) + tuple(f"preset {p} links (ring)" for p in advise.REPORT_PRESETS):
        assert name in body
    assert "predicted strong-scaling efficiency (fraction)" in body and "target 80%" in body
    bad = write_known_study(tmp_path / "bad", bad_point=(2, 1))
    assert "The advisor refuses: its model failed its own check" in advise.report_section(Context(bad), target=0.8)
    (tmp_path / "empty").mkdir()
    assert "the advisor needs" in report.advisor_html(Context(str(tmp_path / "empty"))) or \
        "no training records" in report.advisor_html(Context(str(tmp_path / "empty")))
