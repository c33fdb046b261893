"""Compounding: the kernel speedup beside the data-parallel speedup, grouped by the kernel that ran, and the
guideline naming the fastest kernel x placement."""

import pytest

from synthetic import comp_rec, write_records

from kanlib import guidelines
from kanlib.analysis import load
from kanlib.studies import compounding


def test_compounding_sets_product_beside_measured_and_groups_by_what_ran(tmp_path):
    times = {"reference": {"1x1": 10.0, "1x2": 5.5}, "fast": {"1x1": 4.0, "1x2": 2.5}}
    recs = [comp_rec(k, p, t, repeat=r) for k, ts in times.items() for p, t in ts.items() for r in range(3)]
    # compiled was asked for but fell back to the eager path at every placement
    recs += [comp_rec("compiled", p, t, path="fast", repeat=r) for p, t in {"1x1": 4.1, "1x2": 2.6}.items()
             for r in range(3)]
    write_records(tmp_path, recs)
    tab = compounding.table(load.load_records(str(tmp_path)))
    t = tab.data
    assert tab.groups == ["model"]  # kan_impl is an axis, never a group of its own
    ix = t.set_index(["kan_impl", "placement"])
    fast = ix.loc[("fast", "1x2")]
    assert fast["kernel_speedup"] == pytest.approx(2.5, rel=1e-6)
    assert fast["ddp_speedup"] == pytest.approx(1.6, rel=1e-6)
    assert fast["product"] == pytest.approx(2.5 * 10 / 5.5, rel=1e-6)
    assert fast["measured"] == pytest.approx(4.0, rel=1e-6)
    assert fast["compounding"] == pytest.approx(4.0 / (2.5 * 10 / 5.5), rel=1e-6)  # < 1: communication exposed
    assert fast["efficiency_change"] == pytest.approx(0.8 - 10 / 11, rel=1e-6)
    assert fast["measured_lo"] <= fast["measured"] <= fast["measured_hi"]
    fell = ix.loc[("compiled", "1x2")]
    assert fell["kernel"] == "fast" and bool(fell["fell_back"]) and fell["baseline_kernel"] == "reference"
    assert ix.loc[("reference", "1x2"), "compounding"] == pytest.approx(1.0)
    g = guidelines.from_out_dir(str(tmp_path))
    ans = g.table[g.table["basis"] == "compounding"]["answer"].iloc[0]
    # the compiled request that ran the fast kernel (2.6 s) is within 10% of fast (2.5 s): named together, not picked
    assert ans.startswith("no measurable difference between fast at 1x2, compiled (ran fast) at 1x2: within 10% of "
                          "fast at 1x2: 2.5")
    assert guidelines.decision(ans) == "no measurable difference between fast at 1x2, compiled (ran fast) at 1x2"
