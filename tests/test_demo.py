"""kkmgpu demo (kkmgpu/demo.py): its pictures go into ./kkmgpu-demo/ by default or the folder named, never the
working directory, and show the clusters of both parts of the demo."""

import importlib.util

import numpy as np
import pytest

import kkmgpu
from kkmgpu import demo
from kkmgpu.cli import main

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="the pictures need matplotlib")


@needs_matplotlib
def test_default_output_folder_is_kkmgpu_demo(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    expected = ["kkmgpu-demo/circles.png"]
    if "real data set skipped" not in out:
        expected.append("kkmgpu-demo/digits.png")
    assert written == sorted(expected)  # nothing in the working directory itself
    for name in expected:
        assert f"picture: {name}" in out
        import matplotlib.image

        image = matplotlib.image.imread(tmp_path / name)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 600
        assert np.ptp(image[..., :3]) > 0.5  # not a blank canvas


@needs_matplotlib
def test_output_dir_option_is_created(tmp_path, capsys):
    out_dir = tmp_path / "nested" / "pictures"
    assert main(["demo", "--quick", "--device", "cpu", "--output-dir", str(out_dir)]) == 0
    assert (out_dir / "circles.png").stat().st_size > 0
    assert f"picture: {out_dir / 'circles.png'}" in capsys.readouterr().out


@needs_matplotlib
def test_pictures_carry_labels_and_captions(tmp_path, monkeypatch):
    """The figures handed to savefig: axis labels and a caption on the circles, a mean image per cluster."""
    figures = {}

    def keep(figure, output_dir, file_name):
        figures[file_name] = figure
        return f"picture: {output_dir / file_name}"

    monkeypatch.setattr(demo, "_save", keep)
    X, y = kkmgpu.datasets.make_two_circles(200, random_state=1)
    linear = kkmgpu.fit(X, 2, kernel="linear", device="cpu", random_state=0)
    rbf = kkmgpu.fit(X, 2, gamma=5.0, n_init=10, device="cpu", random_state=0)
    demo.save_circles_picture(tmp_path, X, linear, rbf, y)
    circles = figures["circles.png"]
    axes = circles.get_axes()
    assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in axes] == [("x1", "x2")] * 2
    assert "NMI against the true rings = 1.000" in axes[1].get_title()
    assert "straight line" in circles._supxlabel.get_text()

    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, (60, 64))
    labels = np.arange(60) % 3
    result = kkmgpu.fit(images, 3, init=labels, max_iter=1, device="cpu")
    demo.save_digits_picture(tmp_path, "noise", images, labels, [("k-means", result)])
    digits_axes = [ax for ax in figures["digits.png"].get_axes() if ax.get_images()]
    assert len(digits_axes) == 3
    cluster_labels = np.asarray(result.labels)
    for cluster, ax in enumerate(digits_axes):
        np.testing.assert_allclose(ax.get_images()[0].get_array(),
                                   images[cluster_labels == cluster].mean(axis=0).reshape(8, 8))


def test_digits_picture_needs_square_images(tmp_path):
    X = np.zeros((10, 5))
    result = kkmgpu.fit(np.arange(10.0).reshape(-1, 1), 2, kernel="linear", device="cpu", random_state=0)
    message = demo.save_digits_picture(tmp_path, "odd", X, np.zeros(10, np.int64), [("k-means", result)])
    assert message == "digits.png skipped: 5 features are not a square image."
