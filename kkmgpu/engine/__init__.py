"""Internal: the one Lloyd driver and the operators it runs over.

- ``lloyd``: the driver (assignment, cluster sums, totals, objective, empty clusters, stopping, restarts) and
  initialisation (random partition, k-means++).
- Operators (each supplies the cluster sums S[i, c] = sum over j in c of w_j K_ij): ``dense`` (K on the device),
  ``tiled`` (K recomputed in row tiles), ``sparse`` (a CSR K), ``embedding`` (the rows of an eigen-embedding),
  ``sampled`` (CATS: centroids from sampled points), ``distributed`` (row blocks on Dask workers).
"""
