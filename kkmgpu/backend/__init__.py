"""Internal: the device layer (no stability promise; the public API is ``kkmgpu`` and its public modules).

- ``device``: ``Backend`` (a device, its array namespace ``xp`` and its kernel twins ``ops``), ``resolve_device``,
  memory checks and the errors ``DeviceUnavailableError`` and ``InsufficientMemoryError``.
- ``cupy_loader``: the one module that imports CuPy.
"""
