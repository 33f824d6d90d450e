"""The cuSOLVER error of the stand-in (CuPy's is ``cupy_backends.cuda.libs.cusolver.CUSOLVERError``)."""

CUSOLVER_STATUS_INVALID_VALUE = 3


class CUSOLVERError(RuntimeError):
    """A cuSOLVER status other than success, with CuPy's message (the status name)."""

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        names = {CUSOLVER_STATUS_INVALID_VALUE: "CUSOLVER_STATUS_INVALID_VALUE"}
        super().__init__(names.get(status, f"CUSOLVER_STATUS_{status}") + (f" ({detail})" if detail else ""))


CUSOLVERError.__module__ = "cupy_backends.cuda.libs.cusolver"
