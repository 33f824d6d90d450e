"""cupyx.scipy of the CuPy stand-in: ``sparse`` and ``sparse.linalg`` only."""
