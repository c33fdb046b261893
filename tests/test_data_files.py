"""Real data from CSV and NPZ files: one parse for the pre-launch check and the full read, the seeded
split and scaling, and bad files refused with errors naming the file, row, line and column."""


import numpy as np
import pytest
import torch

from kanlib.config import ConfigError, RunConfig
from kanlib.data import FileRegression, make_dataset
from kanlib.datafiles import csv_header, npz_shape, read_table


def write_csv(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0, 10, n), rng.uniform(-5, 5, n)
    price = 3 * a - b ** 2 + rng.normal(0, 0.1, n)
    with open(path, "w") as f:
        f.write("rooms,age,price\n")
        for row in zip(a, b, price):
            f.write(",".join(f"{v:.6f}" for v in row) + "\n")
    return a, b, price


def test_csv_split_scaling_and_determinism(tmp_path):
    path = str(tmp_path / "houses.csv")
    write_csv(path)
    d = FileRegression(path, "price", n_train=1000, n_val=50, seed=3)
    assert d.feature_names == ["rooms", "age"] and d.in_dim == 2
    assert (d.n_train, d.n_val) == (250, 50)
    assert d.x_train.min().item() == pytest.approx(-1) and d.x_train.max().item() == pytest.approx(1)
    assert d.y_train.mean().item() == pytest.approx(0, abs=1e-6) and d.y_train.std().item() == pytest.approx(1, rel=1e-5)
    again = FileRegression(path, "price", n_train=1000, n_val=50, seed=3)
    assert torch.equal(d.x_val, again.x_val)
    other = FileRegression(path, "price", n_train=1000, n_val=50, seed=4)
    assert not torch.equal(d.x_val, other.x_val)
    capped = FileRegression(path, "", n_train=100, n_val=50, seed=3)  # default target: last column
    assert capped.n_train == 100 and torch.equal(capped.y_val.argsort(0), d.y_val.argsort(0))  # same rows
    # shards are disjoint slices of each global batch, as for synthetic data
    parts = [d.shard(2, 64, r, 2)[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), d.x_train[d.global_indices(2, 64)])


def test_scaling_uses_training_rows_only(tmp_path):
    path = tmp_path / "s.csv"
    # one extreme row; whichever split it lands in, only the training rows set the scale
    rows = [(float(i), 2.0 * i) for i in range(40)] + [(1000.0, 5.0)]
    path.write_text("a,y\n" + "".join(f"{a},{y}\n" for a, y in rows))
    d = FileRegression(str(path), "y", 1000, 10, seed=1)
    x, y, _ = read_table(str(path), "y")
    perm = torch.randperm(41, generator=torch.Generator().manual_seed(1))
    tr = perm[:31]
    lo, hi = x[tr].min(), x[tr].max()
    assert torch.allclose(d.x_train[:, 0], ((x[tr, 0] - lo) / (hi - lo) * 2 - 1).float())
    assert d.y_mean == pytest.approx(float(y[tr].mean())) and d.y_std == pytest.approx(float(y[tr].std()))


def test_header_with_spaces_is_one_parse_for_check_and_read(tmp_path):
    path = tmp_path / "sp.csv"
    path.write_text("a, b, y\n1, 2, 3\n4, 5, 6\n7, 8, 9\n")
    assert csv_header(str(path)) == ["a", "b", "y"]
    cfg = RunConfig(task="file", data_path=str(path), target="y", widths=(2, 4, 1), n_val=1, global_batch=2)
    d = make_dataset(cfg)  # the check and the read agree: 'y' is a column for both
    assert d.feature_names == ["a", "b"] and d.n_train == 2
    x, y, names = read_table(str(path), "y")
    assert names == ["a", "b"] and x.tolist() == [[1, 2], [4, 5], [7, 8]] and y[:, 0].tolist() == [3, 6, 9]


def test_quoted_header_is_counted_by_columns_not_commas(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('"size, m2","age (years)",price\n50,3,100\n70,10,"120"\n90,1,200\n')
    assert csv_header(str(path)) == ["size, m2", "age (years)", "price"]
    RunConfig(task="file", data_path=str(path), widths=(2, 4, 1), n_val=1, global_batch=2)
    with pytest.raises(ConfigError, match=r"^widths: .*q.csv has 2 features \(size, m2, age \(years\)\), but "
                                          r"widths\[0\]=3$"):
        RunConfig(task="file", data_path=str(path), widths=(3, 4, 1), n_val=1, global_batch=2)
    x, y, names = read_table(str(path), "price")
    assert names == ["size, m2", "age (years)"] and y[:, 0].tolist() == [100, 120, 200]


def test_byte_order_mark_is_not_part_of_the_first_name(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("a,y\n1,2\n3,4\n".encode("utf-8-sig"))
    assert csv_header(str(path)) == ["a", "y"]
    assert read_table(str(path), "a")[2] == ["y"]


@pytest.mark.parametrize("body, message", [
    ("a,b,y\n1,2,3\n4,inf,6\n", r"bad.csv: data row 2 \(line 3 of the file\), column 'b': 'inf' is not a finite number"),
    ("a,b,y\n1,2,3\n4,5,-inf\n", r"bad.csv: data row 2 \(line 3 of the file\), column 'y': '-inf' is not a finite"),
    ("a,b,y\n1,NaN,3\n", r"bad.csv: data row 1 \(line 2 of the file\), column 'b': 'NaN' is not a finite number"),
    ("a,b,y\n1,2,3\n4,,6\n", r"bad.csv: data row 2 \(line 3 of the file\), column 'b': empty value"),
    ("a,b,y\n1,2,3\n4,oops,6\n", r"bad.csv: data row 2 \(line 3 of the file\), column 'b': 'oops' is not a number"),
    ("a,b,y\n1,2,3\n4,5\n", r"bad.csv: data row 2 \(line 3 of the file\) has 2 values, but the header has 3 "
                            r"columns \(a, b, y\)"),
    ("a,b,y\n1,2,3,4\n", r"bad.csv: data row 1 \(line 2 of the file\) has 4 values, but the header has 3"),
    # a blank line is skipped, yet the line number still counts it
    ("a,b,y\n1,2,3\n\n4,x,6\n", r"bad.csv: data row 2 \(line 4 of the file\), column 'b': 'x' is not a number"),
    ("a,b,y\n", r"bad.csv: no data rows after the header"),
    ("a,a,y\n1,2,3\n", r"bad.csv: duplicate column name\(s\) 'a' in the header"),
    ("a,,y\n1,2,3\n", r"bad.csv: header column 2 has no name"),
    ("y\n1\n", r"bad.csv: only the target column 'y'"),
])
def test_bad_csv_rows_are_refused_naming_file_row_line_and_column(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        FileRegression(str(path), "y", 10, 1, 0)


def test_the_pre_launch_check_reads_only_the_header(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text("a,b,y\n" + "1,2,3\n" * 50 + "4,inf,6\n")
    cfg = RunConfig(task="file", data_path=str(path), widths=(2, 4, 1), n_val=5, global_batch=8)  # passes
    with pytest.raises(ValueError, match=r"late.csv: data row 51 \(line 52 of the file\), column 'b': 'inf'"):
        make_dataset(cfg)  # the full read, when the run starts, finds it


def test_the_check_sees_a_changed_file(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("a,b,y\n1,2,3\n4,5,6\n")
    RunConfig(task="file", data_path=str(path), widths=(2, 4, 1), n_val=1, global_batch=1)
    path.write_text("a,b,c,y\n1,2,3,4\n4,5,6,7\n")
    with pytest.raises(ConfigError, match=r"^widths: .*c.csv has 3 features \(a, b, c\)"):
        RunConfig(task="file", data_path=str(path), widths=(2, 4, 1), n_val=1, global_batch=1)


def test_npz_files(tmp_path):
    npz = str(tmp_path / "d.npz")
    np.savez(npz, x=np.arange(40.0).reshape(20, 2), y=np.arange(20.0))
    assert npz_shape(npz) == (20, 2)
    assert FileRegression(npz, "", n_train=100, n_val=5, seed=0).n_train == 15
    with pytest.raises(ValueError, match="^n_val: 20 validation rows leave none"):
        FileRegression(npz, "", 10, 20, 0)
    packed = str(tmp_path / "z.npz")
    np.savez_compressed(packed, x=np.ones((7, 3), dtype=np.float32), y=np.zeros((7, 1)))
    assert npz_shape(packed) == (7, 3)  # headers read through the compression too
    # the rows are known from the headers: the pre-launch check refuses what cannot fit
    with pytest.raises(ConfigError, match=r"^global_batch: 16 exceeds the 15 training rows of .*d.npz$"):
        RunConfig(task="file", data_path=npz, widths=(2, 4, 1), n_val=5, global_batch=16)
    with pytest.raises(ConfigError, match=r"^n_val: .*d.npz has 20 rows; n_val=20 leaves none to train on"):
        RunConfig(task="file", data_path=npz, widths=(2, 4, 1), n_val=20, global_batch=1)
    with pytest.raises(ConfigError, match=r"^target: names a CSV column; an .npz file's target is its array 'y'"):
        RunConfig(task="file", data_path=npz, target="price", widths=(2, 4, 1), n_val=5, global_batch=1)


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.ones((6, 3)), "y": np.ones(6)}, None),
    ({"x": np.where(np.arange(18).reshape(6, 3) == 10, np.nan, 1.0), "y": np.ones(6)},
     r"bad.npz: data row 4, column 2 \(x1\): nan is not a finite number \(array x\[3, 1\]\)"),
    ({"x": np.ones((6, 3)), "y": np.array([1, 2, np.inf, 4, 5, 6])},
     r"bad.npz: data row 3, the target: inf is not a finite number \(array y\[2\]\)"),
    ({"x": np.ones((6, 3)), "y": np.ones((6, 1)) * -np.inf},
     r"bad.npz: data row 1, the target: -inf is not a finite number"),
    ({"x": np.ones((6, 3, 1)), "y": np.ones(6)}, r"bad.npz: array 'x' must be 2-D \(rows, features\), got shape"),
    ({"x": np.ones((6, 3)), "y": np.ones(5)}, r"bad.npz: x has 6 rows but y has 5"),
    ({"x": np.ones((6, 3)), "y": np.ones((6, 2))}, r"bad.npz: array 'y' must have shape \(rows,\) or \(rows, 1\)"),
    ({"x": np.ones((6, 3))}, r"bad.npz: an .npz data file needs arrays 'x' and 'y', has \['x'\]"),
    ({"x": np.array([["a"] * 3] * 6), "y": np.ones(6)}, r"bad.npz: array 'x' must be numeric, got dtype <U1"),
])
def test_bad_npz_files_are_refused(tmp_path, arrays, message):
    path = str(tmp_path / "bad.npz")
    np.savez(path, **arrays)
    if message is None:
        assert read_table(path)[0].shape == (6, 3)
        return
    with pytest.raises(ValueError, match=message):
        FileRegression(path, "", 10, 1, 0)


def test_file_task_config_errors_name_the_field(tmp_path):
    path = str(tmp_path / "h.csv")
    write_csv(path)
    with pytest.raises(ConfigError, match="^data_path: task 'file' needs"):
        RunConfig(task="file")
    with pytest.raises(ConfigError, match="^data_path: no such file"):
        RunConfig(task="file", data_path=str(tmp_path / "missing.csv"))
    with pytest.raises(ConfigError, match="^data_path: expected a .csv or .npz file"):
        open(tmp_path / "h.txt", "w").close()
        RunConfig(task="file", data_path=str(tmp_path / "h.txt"))
    with pytest.raises(ConfigError, match="^data_path: only task 'file'"):
        RunConfig(data_path=path)
    with pytest.raises(ConfigError, match="^target: only task 'file'"):
        RunConfig(target="price")
    with pytest.raises(ConfigError, match=r"^widths: .*h.csv has 2 features \(rooms, age\), but widths\[0\]=3"):
        RunConfig(task="file", data_path=path, widths=(3, 4, 1), n_val=50)
    with pytest.raises(ConfigError, match=r"^widths: .*h.csv has 1 output \(regression\), so widths\[-1\] must be 1"):
        RunConfig(task="file", data_path=path, widths=(2, 4, 3), n_val=50)
    with pytest.raises(ConfigError, match=r"^target: .*h.csv: no target column 'cost' \(columns: rooms, age, price\)"):
        RunConfig(task="file", data_path=path, target="cost", widths=(2, 4, 1))
    bad_header = tmp_path / "e.csv"
    bad_header.write_text("\n1,2\n")
    with pytest.raises(ConfigError, match="^data_path: .*e.csv: the first line must be a header row"):
        RunConfig(task="file", data_path=str(bad_header), widths=(2, 4, 1))
    # a CSV's rows are counted when the run reads it
    with pytest.raises(ValueError, match="^global_batch: 512 exceeds the 250 training rows"):
        make_dataset(RunConfig(task="file", data_path=path, n_val=50, global_batch=512, widths=(2, 4, 1)))


def test_training_on_a_file_learns(tmp_path):
    from kanlib.train import train

    path = str(tmp_path / "h.csv")
    write_csv(path, n=2000)
    cfg = RunConfig(task="file", data_path=path, target="price", widths=(2, 8, 1), n_val=200, global_batch=128,
                    steps=150, warmup_steps=5, lr=1e-2, optimizer="adam", kan_impl="fast", out_dir=str(tmp_path / "out"))
    rec = train(cfg).to_dict()
    assert rec["task"] == "file" and rec["data_path"] == path
    assert rec["final_val_loss"] < 0.05  # standardised target: 1.0 is the mean predictor


def _with_outlier(tmp_path, column: int, value: str, validation: bool, n_val: int = 40) -> tuple[str, int]:
    """houses.csv (300 rows) with ``value`` in ``column`` of a row the seed-0 split validates (or trains on); the file
    and the outlier's data row (1-based)."""
    path = str(tmp_path / "houses.csv")
    write_csv(path)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(0))
    row = int(perm[-1] if validation else perm[0])  # _split: the last n_val rows of the shuffle validate
    with open(path) as f:
        lines = f.read().splitlines()
    cells = lines[row + 1].split(",")
    cells[column] = value
    lines[row + 1] = ",".join(cells)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, row + 1


@pytest.mark.parametrize("column,name,validation,precision,why", [
    (1, "age", True, "fp32", r"1e\+308 is beyond float32's range"),
    (1, "age", False, "fp32", r"1e\+308 is beyond float32's range"),
    (2, "price", False, "fp64", r"1e\+308 makes the training rows' mean or standard deviation overflow"),
    (2, "price", True, "fp32", r"1e\+308 is beyond float32's range"),
])
def test_a_finite_outlier_is_named_by_row_and_column_at_load_time(tmp_path, column, name, validation, precision,
                                                                   why):
    """Issue 34 item 9: 1e308 passes the file's float64 check, then overflowed in float32 (or in the target's
    standardisation) and the run ended in "it did not train"; the load names the file, row, line and column."""
    path, row = _with_outlier(tmp_path, column, "1e308", validation)
    cfg = RunConfig(task="file", data_path=path, widths=(2, 4, 1), n_val=40, precision=precision)
    with pytest.raises(ValueError, match=rf"^{path}: data row {row} \(line {row + 1} of the file\), column "
                                         rf"'{name}': {why}"):
        make_dataset(cfg)


def test_an_outlier_that_scales_beyond_float32_is_named_and_fits_float64(tmp_path):
    """-1e30 fits float32, but a validation row scaled by the training rows' range (about 10) is -2e29, whose square
    overflows float32: refused under fp32 (naming row and column), trained on under fp64."""
    path, row = _with_outlier(tmp_path, 0, "-1e30", validation=True)
    with pytest.raises(ValueError, match=rf"^{path}: data row {row} \(line {row + 1} of the file\), column 'rooms': "
                                         r"-1e\+30 scaled to the training rows' range \[-1, 1\] is -2.\d+e\+29, beyond "
                                         r"what training in float32 holds"):
        make_dataset(RunConfig(task="file", data_path=path, widths=(2, 4, 1), n_val=40))
    data = make_dataset(RunConfig(task="file", data_path=path, widths=(2, 4, 1), n_val=40, precision="fp64"))
    assert data.x_val.dtype == torch.float64 and float(data.x_val.min()) < -1e29


def test_a_run_on_a_file_with_an_outlier_names_it_not_the_training(tmp_path):
    """The command line as a user runs it: the error names the cell, and the run never starts training."""
    import os
    import subprocess
    import sys

    path, row = _with_outlier(tmp_path, 1, "1e308", validation=True)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "kanlib.train", "--task=file", f"--data_path={path}", "--widths=2,4,1",
                          "--n_val=40", "--global_batch=64", "--steps=3", "--warmup_steps=1", "--kan_impl=fast",
                          f"--out_dir={tmp_path / 'out'}"], cwd=repo, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=repo))
    assert out.returncode != 0
    assert f"{path}: data row {row} (line {row + 1} of the file), column 'age': 1e+308 is beyond float32" in out.stderr
    assert "did not train" not in out.stderr
