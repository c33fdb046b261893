"""A performance model of DDP's gradient all-reduce with intra- and inter-node links, fitted on the
collective benchmark (kanlib.collbench), checked against every DDP run, and used to extrapolate.

One module per reason to change; this package names what the rest of kanlib uses, so ``commmodel.fit_collbench``
and the like read the same wherever the definition lives:

- ``links``: the all-reduce formulas over each link's latency and bandwidth, and their fit on the collective
  benchmark (:func:`fit_collbench`, :class:`LinkModel`);
- ``ddp``: DDP's buckets and their overlap with backward, and the link model checked against each timed DDP run
  (:func:`validate_ddp`, :func:`transfer_waiting`);
- ``parity``: the straggler model of a synchronous step (slowest of W ranks, shared-host contention) and its
  leave-one-out check (:func:`ddp_parity`, :func:`model_validation`);
- ``extrapolate``: compute profiles and the prediction from 1 to thousands of GPUs (:func:`predict_scaling`,
  :func:`extrapolation_table`) and how a prediction is read against a target efficiency.

pandas and numpy only: no torch import.
"""

from kanlib.analysis.commmodel.ddp import (TWIN_KEYS, ddp_buckets, kan_param_bytes, overlap, predict_run,
                                           transfer_waiting, transfer_waiting_by_placement, twins, validate_ddp)
from kanlib.analysis.commmodel.extrapolate import (ComputeProfile, band_efficiencies, calibrated_prediction, extrapolation_table,
                                                   largest_world_size_at, placement_for, powers_of_two,
                                                   predict_scaling, profile_from_records, ring_tree_crossover,
                                                   sizes_above, world_size_band, world_size_reached)
from kanlib.analysis.commmodel.links import (ALGOS, LINKS, MIB, CollFit, Link, LinkModel, allreduce_terms, find_fit,
                                             fit_collbench, fit_points, fit_table, link_name, nnls, recovered_links,
                                             row_algorithm)
from kanlib.analysis.commmodel.parity import (CONTENTION_TERMS, EXPOSED_MARGIN, FAR_OFF, STEP_MARGIN, ModelValidation,
                                              ddp_parity, fitted_contention, judge_median, margin_phrase,
                                              model_validation)

__all__ = [
    "ALGOS", "LINKS", "MIB", "allreduce_terms", "link_name", "row_algorithm", "Link", "LinkModel", "nnls", "CollFit",
    "fit_collbench", "fit_table", "fit_points", "recovered_links", "find_fit",
    "ddp_buckets", "kan_param_bytes", "overlap", "TWIN_KEYS", "twins", "validate_ddp", "predict_run",
    "transfer_waiting", "transfer_waiting_by_placement",
    "STEP_MARGIN", "EXPOSED_MARGIN", "FAR_OFF", "margin_phrase", "ddp_parity", "CONTENTION_TERMS", "fitted_contention", "judge_median",
    "ModelValidation", "model_validation",
    "ComputeProfile", "profile_from_records", "placement_for", "predict_scaling", "extrapolation_table",
    "ring_tree_crossover", "sizes_above", "largest_world_size_at", "band_efficiencies", "world_size_band",
    "world_size_reached", "powers_of_two", "calibrated_prediction",
]
