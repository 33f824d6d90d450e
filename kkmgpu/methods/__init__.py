"""Internal: the clustering methods behind ``kkmgpu.fit(method=...)``, each a module plus its registration.

``registry`` holds the ``Method`` declarations (name, parameters, check, runner, predictor) that ``fit``,
``predict``, the estimator and the command line read.
"""
