"""The notebooks: reviewable text sources, thin bodies, parameters coerced or refused, generated
.ipynb, and an executed analysis notebook whose figures carry the plotly mime bundle."""

import ast
import hashlib
import os
import re
import shlex
import subprocess
import sys

import pytest

from runners import notebook
from runners.notebook import ParameterError, check_parameters

sys.path.insert(0, os.path.dirname(__file__))
from synthetic import strong_records, write_new_studies, write_records, write_study  # noqa: E402

SOURCES = notebook.sources()
PARAMS_SETS = ("study", "gpu_cluster")  # notebooks/params/<set>/: launch.yaml for every launch notebook, then its own


@pytest.fixture(autouse=True)
def kernel_imports_this_checkout(monkeypatch):
    """Kernels started by papermill import this checkout's kanlib and runners, whatever is installed."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (notebook.REPO, os.environ.get("PYTHONPATH")) if p))


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_every_notebook_is_a_canonical_jupytext_source_without_outputs():
    import jupytext
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupytext.config import load_jupytext_config

    assert sorted(os.path.basename(p) for p in SOURCES) == sorted([
        "01_strong_scaling.py", "02_weak_scaling.py", "03_communication_overhead.py", "04_model_size_scaling.py",
        "07_time_to_accuracy.py", "08_compounding.py",
        "01_strong_scaling_analysis.py", "02_weak_scaling_analysis.py", "03_communication_overhead_analysis.py",
        "04_model_size_scaling_analysis.py", "05_guidelines.py", "06_extrapolation.py",
        "07_time_to_accuracy_analysis.py", "08_compounding_analysis.py"])
    cfg = load_jupytext_config(SOURCES[0])
    spec = KernelSpecManager().get_kernel_spec("python3")  # ipykernel's, as installed in this environment
    running = {"name": "python3", "display_name": spec.display_name, "language": spec.language}
    for path in SOURCES:
        text = open(path).read()
        nb = jupytext.read(path)
        # what JupyterLab's jupytext writes back on save is byte for byte the file: saving does not dirty git
        assert jupytext.writes(nb, fmt="py:percent", config=cfg) == text, path
        # JupyterLab writes the running kernel's spec into the notebook it saves: it must be the one already there
        saved = nbformat.from_dict({**nb, "metadata": {**nb.metadata, "kernelspec": running}})
        assert jupytext.writes(saved, fmt="py:percent", config=cfg) == text, path
        assert "jupytext_version: " not in text and "outputs" not in text.split("# ---", 2)[1]
        cells = code_cells(nb)
        assert cells[0].metadata.get("tags") == ["parameters"], path
        assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
        assert "notebook.check_parameters(globals())" in cells[1].source, path  # first call after the parameters
        for c in cells:  # thin: calls, no definitions
            tree = ast.parse(c.source)
            assert not [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Lambda))], path
        check_parameters_cell(path, cells[0])


def check_parameters_cell(path, cell):
    """Typed, commented knobs, one statement each; a mapping may span lines. papermill takes a knob's help from the
    comment of its last line only, and groups lines by their '=': none in a comment or a continuation line."""
    from papermill.translators import PythonTranslator

    lines = cell.source.splitlines()
    tree = ast.parse(cell.source)
    for node in tree.body:
        assert isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name), (path, ast.unparse(node))
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        assert re.match(r"^\w+: [\w\[\], ]+ = ", first), (path, first)
        assert re.search(r"  # \S", last) and "=" not in last.split("  # ", 1)[1], (path, last)
        for line in lines[node.lineno:node.end_lineno]:
            assert "=" not in line and (line == last or "#" not in line), (path, line)
    found = PythonTranslator.inspect(cell)
    assert [p.name for p in found] == [n.target.id for n in tree.body] and all(p.help for p in found), path


def test_launch_notebooks_declare_what_they_sweep_and_take_every_other_setting_from_run_config():
    """Issue 35: a RunConfig field is written once, in kanlib/config.py. A launch notebook declares the knobs of its
    sweep, out_dir, and every other setting as mappings of RunConfig fields (base_config: tiny defaults, under
    config); none imports the plans under the name of kanlib.studies."""
    import dataclasses

    import jupytext

    from kanlib.config import RunConfig

    fields = {f.name for f in dataclasses.fields(RunConfig)}
    launch = [p for p in SOURCES if "run_sweep(" in open(p).read()]
    assert len(launch) == 6
    for path in SOURCES:
        assert "plans as studies" not in open(path).read(), path
    for path in launch:
        declared = {n.target.id for n in ast.parse(code_cells(jupytext.read(path))[0].source).body}
        assert {"config", "base_config", "out_dir"} <= declared, path
        # the calibration's emulated link (on its multi-node placements only) bears the RunConfig fields' names
        assert declared & fields <= {"out_dir", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"}, path


def test_every_notebook_of_the_run_order_takes_what_each_parameter_sets_files_set():
    """The registry's run order (kanlib.studies.run_order) names every notebook; every launch notebook declares what
    each set's shared launch file sets, and every notebook what its own file sets (papermill refuses others)."""
    import papermill
    import yaml

    from kanlib import studies

    order = studies.run_order()
    assert [os.path.basename(p)[:-3] for p in SOURCES] == [nb for nb, _ in order]
    launch = [nb for nb, kind in order if kind == "launch"]
    assert launch and all("_analysis" not in n for n in launch) and ("06_extrapolation", "analysis") in order
    for pset in PARAMS_SETS:
        folder = os.path.join(notebook.NOTEBOOK_DIR, "params", pset)
        shared = set(yaml.safe_load(open(os.path.join(folder, "launch.yaml"))))
        for n in launch:
            declared = set(papermill.inspect_notebook(notebook.to_ipynb(n)))
            assert shared <= declared, (pset, n, shared - declared)
        for f in os.listdir(folder):
            if f != "launch.yaml":
                keys = set(yaml.safe_load(open(os.path.join(folder, f))))
                assert keys <= set(papermill.inspect_notebook(notebook.to_ipynb(f[:-5]))), (pset, f)



def planned_configs(name: str, params: dict) -> list:
    """The configs launch notebook ``name`` builds (training runs, then any benchmark runs) with the parameters
    papermill would inject, ``params``, without running them: its parameters cell, the injected cell, then the cell
    that builds its plan."""
    import jupytext
    from papermill.translators import PythonTranslator

    cells = code_cells(jupytext.read(os.path.join(notebook.NOTEBOOK_DIR, name + ".py")))
    injected = "# Parameters\n" + "".join(f"{k} = {PythonTranslator.translate(v)}\n" for k, v in params.items())
    ns = {}
    exec(cells[0].source, ns)
    exec(injected, ns)
    ns["In"] = [cells[0].source, injected]  # what check_parameters reads the injected names from
    exec(cells[1].source, ns)
    return list(ns["configs"]) + list(ns.get("bench") or [])


@pytest.mark.slow
@pytest.mark.parametrize("pset", PARAMS_SETS)
def test_each_parameter_set_builds_every_launch_notebooks_plan_with_its_settings(pset, tmp_path):
    """papermill -f launch.yaml -f <notebook>.yaml, as make study passes them: the later file replaces a key
    wholesale, so the set's shared RunConfig fields are launch.yaml's base_config (replacing the notebook's tiny
    one) and each notebook's own are its config, over them. Every key is a parameter of its notebook and a RunConfig
    field its plan does not set itself, so every plan builds, and with the set's settings."""
    import yaml

    from kanlib.config import RunConfig

    d = os.path.join(notebook.NOTEBOOK_DIR, "params", pset)
    launch = yaml.safe_load(open(os.path.join(d, "launch.yaml")))
    names = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".yaml") and f != "launch.yaml")
    assert names == sorted(os.path.basename(p)[:-3] for p in SOURCES if "run_sweep(" in open(p).read())
    for name in names:
        params = {**launch, **yaml.safe_load(open(os.path.join(d, name + ".yaml"))), "out_dir": str(tmp_path)}
        runs = [c for c in planned_configs(name, params) if isinstance(c, RunConfig)]
        assert runs, name
        settings = {**launch["base_config"], **params.get("config", {})}
        for key, v in settings.items():
            if key not in ("n_train", "widths", "global_batch"):  # a plan may derive these from the setting
                assert {getattr(c, key) for c in runs} == {tuple(v) if isinstance(v, list) else v}, (name, key)
        assert {c.out_dir for c in runs} == {str(tmp_path)}


def test_no_notebook_is_tracked_as_ipynb_and_generated_ones_are_ignored():
    tracked = subprocess.run(["git", "ls-files", "notebooks", "tools"], cwd=notebook.REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked and not [p for p in tracked if p.endswith(".ipynb")]
    assert "tools/make_notebooks.py" not in tracked
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/notebooks/01_strong_scaling.ipynb"],
                             cwd=notebook.REPO)
    assert ignored.returncode == 0


def test_to_ipynb_generates_a_runnable_notebook_once(tmp_path):
    import nbformat
    import papermill

    path = notebook.to_ipynb("01_strong_scaling", str(tmp_path))
    assert path == str(tmp_path / "01_strong_scaling.ipynb")
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec.name == "python3" and "jupytext" not in nb.metadata
    assert all(not c.get("outputs") for c in code_cells(nb))
    params = papermill.inspect_notebook(path)
    assert {"placements", "world_sizes", "launcher", "launcher_opts", "out_dir", "global_batches"} <= set(params)
    assert params["placements"]["inferred_type_name"] == "list[str]"
    before = os.stat(path).st_mtime_ns
    notebook.to_ipynb("01_strong_scaling", str(tmp_path))
    assert os.stat(path).st_mtime_ns == before  # unchanged content is not rewritten
    with pytest.raises(FileNotFoundError, match="notebook 'nope': no .*nope.py"):
        notebook.to_ipynb("nope", str(tmp_path))


def ns(injected: dict | None = None, **declared):
    """A notebook namespace: annotated parameters (name=(type, value)) and a papermill-injected cell."""
    space = {"__annotations__": {k: t for k, (t, _) in declared.items()}, **{k: v for k, (_, v) in declared.items()}}
    history = ["placements: list[str] = ['1x1']"]
    if injected is not None:
        history.append("# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in injected.items()))
        space.update(injected)
    space["In"] = history + ["notebook.check_parameters(globals())"]
    return space


@pytest.mark.parametrize("given, want", [
    (2, [2]), ("2,16,1", [2, 16, 1]), ("[1,3]", [1, 3]), ([1, 3.0], [1, 3]), ("", []), ("[]", [])])
def test_list_parameters_are_coerced(given, want):
    space = ns({"world_sizes": given}, world_sizes=(list[int], [1, 2]))
    assert check_parameters(space) == {"world_sizes": want}
    assert space["world_sizes"] == want


def test_scalars_strings_dicts_and_nested_lists_are_coerced():
    space = ns({"steps": "30", "lr": "1e-3", "with_mlp": "false", "target": 3, "launcher_opts": "{'partition': 'gpu'}",
                "widths_list": "[[2, 8, 1], [2, 16, 1]]", "placements": "1x1,2x1"},
               steps=(int, 25), lr=(float, 1.0), with_mlp=(bool, True), target=(str, ""), launcher_opts=(dict, {}),
               widths_list=(list[list[int]], []), placements=(list[str], ["1x1"]))
    assert check_parameters(space) == {"steps": 30, "lr": 1e-3, "with_mlp": False, "target": "3",
                                       "launcher_opts": {"partition": "gpu"},
                                       "widths_list": [[2, 8, 1], [2, 16, 1]], "placements": ["1x1", "2x1"]}


@pytest.mark.parametrize("name, hint, given, message", [
    ("world_sizes", list[int], "1,a", r"parameter world_sizes: expected an integer, got 'a' \(str\); e\.g\. papermill "
                                      r"-p world_sizes 2 \(in '1,a'\)"),
    ("world_sizes", list[int], "[1,", r"parameter world_sizes: expected a list of integers, got '\[1,' \(str\): not a "
                                      r"list literal"),
    ("steps", int, 2.5, r"parameter steps: expected an integer, got 2\.5 \(float\)"),
    ("steps", int, True, r"parameter steps: expected an integer, got True"),
    ("timeout_s", float, "inf", r"parameter timeout_s: expected a number, got 'inf' \(str\): must be finite"),
    ("with_mlp", bool, "maybe", r"parameter with_mlp: expected true or false, got 'maybe'"),
    ("launcher_opts", dict, "partition=gpu", r"parameter launcher_opts: expected a mapping, got 'partition=gpu'"),
    ("model", str, ["kan"], r"parameter model: expected a string, got \['kan'\] \(list\)"),
])
def test_wrong_types_are_refused_naming_the_parameter(name, hint, given, message):
    with pytest.raises(ParameterError, match="^" + message):
        check_parameters(ns({name: given}, **{name: (hint, None)}))


def test_a_typo_is_an_error_not_a_warning():
    space = ns({"world_size": 2}, world_sizes=(list[int], [1, 2]), repeats=(int, 1))
    with pytest.raises(ParameterError, match=r"^parameter 'world_size' \(did you mean 'world_sizes'\?\): not a parameter "
                                             r"of this notebook; its parameters: world_sizes, repeats$"):
        check_parameters(space)
    # without papermill (JupyterLab, nbval) there is no injected cell and nothing to refuse
    assert check_parameters(ns(None, world_sizes=(list[int], [1, 2]))) == {"world_sizes": [1, 2]}


def test_papermill_refuses_a_typo_and_a_bad_type_before_anything_runs(tmp_path):
    import papermill

    path = notebook.to_ipynb("01_strong_scaling", str(tmp_path))
    with pytest.raises(papermill.PapermillExecutionError,
                       match=r"parameter 'world_size' \(did you mean 'world_sizes'\?\): not a parameter"):
        papermill.execute_notebook(path, str(tmp_path / "out.ipynb"), parameters={"world_size": 2},
                                   cwd=notebook.NOTEBOOK_DIR, progress_bar=False)
    with pytest.raises(papermill.PapermillExecutionError, match=r"parameter repeats: expected an integer, got 'two'"):
        papermill.execute_notebook(path, str(tmp_path / "out.ipynb"), parameters={"repeats": "two"},
                                   cwd=notebook.NOTEBOOK_DIR, progress_bar=False)
    # a RunConfig setting goes in config, checked against RunConfig's fields before anything runs
    with pytest.raises(papermill.PapermillExecutionError,
                       match=r"config: 'stpes' is not a RunConfig field \(did you mean 'steps'\?\)"):
        papermill.execute_notebook(path, str(tmp_path / "out.ipynb"), parameters={"config": {"stpes": 40}},
                                   cwd=notebook.NOTEBOOK_DIR, progress_bar=False)
    assert not os.path.exists(tmp_path / "outputs")  # refused before any run


def executed_analysis(tmp_path):
    """01_strong_scaling_analysis run by papermill on synthetic records; its path and output dir."""
    import papermill

    out = tmp_path / "out"
    write_records(out, strong_records({"1x1": 8.0, "1x2": 4.4, "2x1": 5.0}))
    src = notebook.to_ipynb("01_strong_scaling_analysis", str(tmp_path / "build"))
    done = tmp_path / "01_strong_scaling_analysis.ipynb"
    papermill.execute_notebook(src, str(done), parameters={"out_dir": str(out)}, cwd=notebook.NOTEBOOK_DIR,
                               progress_bar=False)
    return done, out


def test_executed_analysis_notebook_shows_figures_untrusted_and_offline(tmp_path):
    import nbformat

    digest = {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in SOURCES}
    done, out = executed_analysis(tmp_path)
    nb = nbformat.read(str(done), as_version=4)
    outputs = [o for c in code_cells(nb) for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    # the strong-scaling figure (one work size: no work figure) and the explorer's static copy, each with the
    # mime bundle JupyterLab renders in an untrusted notebook, and HTML for exports
    assert len(figures) == 2
    assert figures[1]["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"].startswith(
        "strong_scaling: median step_time_s")
    assert all("text/html" in o["data"] for o in figures)
    html = "".join(o["data"].get("text/html", "") for o in outputs if "data" in o)
    assert not re.search(r"<script[^>]+src=", html) and not re.search(r"mathjax[^'\"]*\.js", html, re.I)
    assert html.count("/**\n* plotly.js v") == 1  # plotly.js embedded once, for the whole notebook
    assert sorted(os.listdir(out / "figures")) == ["strong_scaling_speedup_efficiency.html"]
    assert {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in SOURCES} == digest  # sources untouched
    page = notebook.export_html(str(done), str(tmp_path / "export.html"))
    text = open(page).read()
    assert not re.search(r"<script[^>]+src=", text) and "require.js" not in text and "cdnjs" not in text
    assert text.count("Plotly.newPlot") >= 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["03_communication_overhead_analysis", "06_extrapolation",
                                  "07_time_to_accuracy_analysis", "08_compounding_analysis"])
def test_new_analysis_notebooks_run_on_records(tmp_path, name):
    """The analyses of the calibration, extrapolation, time to accuracy and compounding run end to end in a
    real kernel on synthetic records and draw their figures (mime bundle for JupyterLab, HTML for exports)."""
    import nbformat
    import papermill
    out = write_new_studies(write_study(tmp_path / "out"))
    src = notebook.to_ipynb(name, str(tmp_path / "build"))
    done = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(src, str(done), parameters={"out_dir": str(out)}, cwd=notebook.NOTEBOOK_DIR,
                               progress_bar=False)
    outputs = [o for c in code_cells(nbformat.read(str(done), as_version=4)) for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures and all("text/html" in o["data"] for o in figures)
    assert os.listdir(out / "figures")
    if name == "06_extrapolation":
        import json

        assert json.load(open(out / "extrapolation.json"))["preset_name"] == "h100-ndr"  # kept for the report


FAKE_PAPERMILL = '''
import json, shutil, sys
args = sys.argv[1:]
src, dst = args[-2], args[-1]
shutil.copy(src, dst)
with open(dst + ".args.json", "w") as f:
    json.dump(args, f)
'''


def _make_study(tmp_path, out, *make_args, env=None):
    """make study with a fake papermill (it copies the notebook and keeps its arguments), on this interpreter's venv."""
    fake = tmp_path / "fake_papermill.py"
    fake.write_text(FAKE_PAPERMILL)
    stamp = tmp_path / "stamp"
    stamp.touch()
    venv = os.path.dirname(os.path.dirname(sys.executable))
    papermill = f"{shlex.quote(sys.executable)} {shlex.quote(str(fake))}"
    return subprocess.run(["make", "-C", notebook.REPO, "study", f"VENV={venv}", f"STAMP={stamp}", f"OUT={out}",
                           f"STUDY_ARGS=--papermill={shlex.quote(papermill)} --only=01_strong_scaling,05_guidelines",
                           *make_args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def test_make_study_writes_to_an_absolute_out_even_with_spaces(tmp_path):
    """make study runs the study driver (python -m runners.study) with its OUT, PARAMS_SET, JOBS and PARAMS."""
    out = tmp_path / "my study" / "out"
    write_study(out)  # the fake papermill runs nothing: the records the summary at the end reads
    # inside an allocation (as after salloc) a SLURM parameter set runs here, no batch job
    run = _make_study(tmp_path, out, "PARAMS_SET=gpu_cluster", "JOBS=3", "PARAMS=-p steps 7",
                      env={"SLURM_JOB_ID": "4242"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pre-flight" in run.stdout and (out / "preflight").is_dir()
    import json

    args = json.load(open(out / "notebooks" / "01_strong_scaling.ipynb.args.json"))
    assert args[:2] == ["-p", "out_dir"] and args[2] == str(out)  # absolute, spaces intact, nothing prefixed
    d = os.path.join("notebooks", "params", "gpu_cluster")
    assert args[3:10] == ["-f", f"{d}/launch.yaml", "-f", f"{d}/01_strong_scaling.yaml", "-p", "steps", "7"]
    assert json.load(open(out / "notebooks" / "05_guidelines.ipynb.args.json"))[3:4] == ["-p"]  # no file of its own
    assert (out / "notebooks" / "05_guidelines.html").exists()
    assert f"Report: {out}/report.html" in run.stdout
    # it ends with the one-screen summary (issue 27.3): the decisions and what they rest on
    tail = [t for t in run.stdout[run.stdout.index(f"Report: {out}/report.html"):].splitlines()
            if not t.startswith("make")]
    assert any(t.startswith("! = could change within its intervals") for t in tail[-3:])
    assert any("decisions;" in t for t in tail)
    assert not os.path.exists(os.path.join(notebook.REPO, str(out).lstrip("/")))  # nothing under the repo


def test_make_study_refuses_a_mistyped_params_set_and_a_jobs_that_is_not_a_count(tmp_path):
    """Issue 34.2: make study PARAMS_SET=studdy ran every notebook with only -p out_dir, the notebooks' tiny
    defaults, and said nothing."""
    out = tmp_path / "out"
    run = _make_study(tmp_path, out, "PARAMS_SET=studdy")
    assert run.returncode != 0
    assert "PARAMS_SET 'studdy': no folder notebooks/params/studdy; the sets: gpu_cluster, study" in run.stderr
    assert not out.exists()  # refused before anything ran or was written
    run = _make_study(tmp_path, out, "JOBS=two")
    assert run.returncode != 0 and "JOBS is how many analysis notebooks run at once" in run.stderr
    assert not out.exists()


@pytest.mark.slow
def test_the_papermill_example_of_docs_cluster_runs(tmp_path):
    """Issue 23: docs/cluster.md's papermill example named notebooks/*.ipynb, which are generated into
    build/notebooks/, and its default out_dir worked only with --cwd notebooks. The example's commands, run as
    written from the checkout's root: SLURM's site file swapped for a local one, the output notebook and the
    records put under tmp_path."""
    import glob
    import json
    import shlex

    text = open(os.path.join(notebook.REPO, "docs", "cluster.md")).read()
    block = re.search(r"```sh\n(make notebooks\npapermill .*?)\n```", text, re.S).group(1)
    make, cmd = block.splitlines()
    assert make == "make notebooks"
    notebook.main(["ipynb"])  # what `make notebooks` runs
    args = shlex.split(cmd)
    assert args[:3] == ["papermill", "--cwd", "notebooks"] and os.path.exists(os.path.join(notebook.REPO, args[3]))
    site = tmp_path / "site.yaml"
    site.write_text("launcher_opts: {}\nplacements: ['1x1']\nwidths_list: [[2, 4, 1]]\nglobal_batches: [64]\n"
                    "config: {steps: 4, warmup_steps: 1, n_train: 256, n_val: 64, kan_impl: fast}\ntimeout_s: 120.0\n"
                    f"out_dir: {json.dumps(str(tmp_path / 'outputs'))}\n")
    args = [sys.executable, "-m", *args]
    args = [str(tmp_path / "out.ipynb") if a == "out.ipynb" else str(site) if a == "site.yaml"
            else "local" if a == "slurm" else a for a in args]
    proc = subprocess.run(args, cwd=notebook.REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert glob.glob(str(tmp_path / "outputs" / "strong_scaling" / "*" / "record.json"))
