"""cupy.cuda.driver of the stand-in: the error a bad kernel launch raises."""

CUDA_ERROR_INVALID_VALUE = 1


class CUDADriverError(RuntimeError):
    """A CUDA driver error (CuPy's message format: ``CUDA_ERROR_NAME: description``)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)
