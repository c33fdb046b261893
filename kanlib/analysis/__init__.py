"""Shared analysis machinery: what every study module (kanlib.studies) uses, never torch.

- ``load``: read every record under a folder once (training runs and collective benchmarks); the code-version
  policy (records of different code are never pooled); steps and manifests.
- ``context``: one analysis build over one folder: records and benchmark read once, the link model fitted once,
  each derived table computed once.
- ``table``: a derived table beside its metadata (groups, note, design).
- ``groups``: how records split into groups that are never pooled, placements, selecting records.
- ``stats``: medians with bootstrap intervals (scipy.stats.bootstrap), speedup fits, target checks.
- ``fmt``: numbers as a reader wants them (ms, %, x, intervals, bytes).
- ``style``: one visual language for every figure, the renderers, offline files.
- ``explorer``: an ipywidgets panel over the records.
- ``section``: what a study module's analysis gives (figures with captions, tables, sentences), and a
  report section made of them (``StudyAnalysis``).
- ``commmodel``: the all-reduce performance model, fitted on the collective benchmark.
- ``presets``: hardware presets of that model (specifications, not measurements).
- ``claims``: a published claim and its verdict (what a study module's ``CLAIMS`` hold).
- ``advisor``: the quantities that carry to another machine and the deployment advisor's model (kanlib.advise).
- ``twins``: a KAN beside its matched-parameter MLP at equal gradient bytes, compared round by round.
- ``reconcile``: one model measured by several studies at one placement, side by side.
"""
