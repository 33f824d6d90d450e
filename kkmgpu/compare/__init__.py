"""How kkmgpu compares: its methods next to the clustering methods users know, on labelled data sets.

``kkmgpu compare`` (the command line) and ``bench/compare.py`` (the committed benchmark run) both call
:func:`run_comparison`. Every method clusters the same preprocessed data into the true number of clusters;
every partition is scored by the same metrics (:data:`METRICS`); wall time is the fit call alone.

Methods (:func:`methods`): kkmgpu's exact route, its eigendecomposition route (Algorithm 16), CATS, and,
where they have landed in this kkmgpu, kernel matrix trimming and the Off-the-grid bandwidth search;
scikit-learn's KMeans, AgglomerativeClustering (Ward), SpectralClustering (normalised-Laplacian embedding
then k-means, the Ng-Jordan-Weiss recipe) and GaussianMixture; tslearn's KernelKMeans. A method whose
package is missing, or that this kkmgpu does not have, is skipped with a message saying so.

Every RBF method (kkmgpu's, spectral clustering, tslearn) gets the same gamma per data set, scikit-learn's
"scale" rule gamma = 1 / (d Var(X)) (kkmgpu's default) -- except the bandwidth search, whose point is to
choose it. Data: the five SIPU shape sets, UCI WiFi, scikit-learn's Wine, WDBC and digits, MNIST samples
(pixels / 255); shape and UCI sets are standardised to zero mean and unit variance per feature (as the
Off-the-grid paper does for real data), digits are divided by 16. ``large/birch1.csv`` of the shared data
(100,000 points, k = 100) is left out: it is there for scaling runs past one kernel matrix in memory, and
AgglomerativeClustering, SpectralClustering, tslearn's KernelKMeans and the kernel-objective column all need
O(n^2) memory (80 GB in float64 at n = 100,000).

The thesis (kernel-kmeans-thesis-slides.txt, "Evaluation Strategy") adds two scenarios on synthetic
Gaussian blobs (centres uniform in [-10, 10]^d as in scikit-learn's ``make_blobs``, standard deviation
:data:`BLOB_STD` = 2.5): growing n
at fixed d, and growing d at fixed n, each over several seeds (mean and standard deviation reported).

Outputs (:func:`write_outputs`): ``<prefix>.md`` (tables), ``<prefix>.csv`` (one row per run),
``<prefix>.json`` (rows, configuration, versions, machine, load average) and PNG plots when matplotlib is
installed.
"""

from kkmgpu.compare.cli import add_arguments, run_from_args
from kkmgpu.compare.contestants import Method, methods
from kkmgpu.compare.data import Dataset, load_dataset, make_blobs
from kkmgpu.compare.report import write_outputs
from kkmgpu.compare.runner import run_comparison
from kkmgpu.compare.scoring import METRICS, evaluate

__all__ = ["METRICS", "Dataset", "Method", "add_arguments", "evaluate", "load_dataset", "make_blobs", "methods",
           "run_comparison", "run_from_args", "write_outputs"]
