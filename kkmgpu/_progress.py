"""Progress bars for long work: tqdm when it is installed, a plain line printer otherwise.

Every long loop of the library (the bandwidth search, ``compare``, the tiled engine's passes, CATS iterations, the
benchmark tables) reports through :func:`progress_bar`, so one switch turns them on: ``progress=True`` in Python,
on by default in the CLI when stderr is a terminal. tqdm draws the bars in a terminal (or a notebook) when it is
installed (``pip install kkmgpu[progress]``); without it, or when the stream is not a terminal (a log file, CI), the
plain printer writes whole lines: one per tenth of the work, at most one every two seconds, no carriage returns.

A bar opened inside another bar's ``with`` block is nested (``leave=False``): it is gone when done, so one fit shows
one bar however many inner loops report (a graph fit's starts, the tiled engine's passes).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import time

__all__ = ["progress_bar", "check_progress", "scope", "active", "finish", "iterate"]

_ACTIVE = contextvars.ContextVar("kkmgpu_progress", default=False)
_DEPTH = contextvars.ContextVar("kkmgpu_progress_depth", default=0)  # bars whose ``with`` block encloses this code


class _Nesting:
    """Context-manager half of every bar: inside its block, new bars are nested."""

    def __enter__(self):
        self._depth_token = _DEPTH.set(_DEPTH.get() + 1)
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        finally:
            _DEPTH.reset(self._depth_token)
        return False


@contextlib.contextmanager
def scope(enabled: bool):
    """Within the block, :func:`active` is ``enabled``: how ``fit(progress=True)`` reaches its inner loops."""
    token = _ACTIVE.set(bool(enabled))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether the innermost :func:`scope` asked for progress bars (False outside any)."""
    return _ACTIVE.get()


def check_progress(progress) -> bool:
    """``progress`` must be a bool (numpy bools too); anything else is an error, not a silent truthiness test."""
    if isinstance(progress, bool) or type(progress).__name__ == "bool_":
        return bool(progress)
    raise TypeError(f"progress={progress!r} must be True or False.")


class _Silent:
    """The bar when progress is off: every call does nothing (and nests nothing)."""

    n = 0
    total = None
    leave = False

    def update(self, n=1):
        pass

    def set_postfix_str(self, text):
        pass

    def write(self, text):
        """Print a line without breaking the bar (tqdm's ``write``)."""
        print(text, flush=True)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _PlainBar(_Nesting, _Silent):
    """A tqdm-like bar without tqdm: a line at every tenth of ``total`` (at most one per ``min_interval`` s)."""

    MIN_INTERVAL = 2.0  # seconds between lines

    def __init__(self, total, desc, unit, file, min_interval=None, leave=True):
        self.total = None if total is None else int(total)
        self.desc, self.unit, self.file = desc, unit, file
        self.n, self.postfix = 0, ""
        self.start = self._last_print = time.perf_counter()
        self.min_interval = self.MIN_INTERVAL if min_interval is None else min_interval
        self._last_tenth = 0
        self._closed = False
        self.leave = leave

    def _line(self):
        elapsed = time.perf_counter() - self.start
        if self.total:
            done = f"{self.n}/{self.total} {self.unit} ({100.0 * self.n / self.total:3.0f}%)"
        else:
            done = f"{self.n} {self.unit}"
        extra = f", {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {done}, {elapsed:.1f} s{extra}"

    def update(self, n=1):
        self.n += n
        now = time.perf_counter()
        tenth = 10 * self.n // self.total if self.total else self._last_tenth + 1
        if tenth > self._last_tenth and now - self._last_print >= self.min_interval:
            self._last_tenth, self._last_print = tenth, now
            print(self._line(), file=self.file, flush=True)

    def set_postfix_str(self, text):
        self.postfix = str(text)

    def close(self):
        if not self._closed:
            self._closed = True
            if self.leave or self._last_tenth:  # a short bar that is not kept leaves no line at all
                print(self._line(), file=self.file, flush=True)


def _tqdm_class():
    """tqdm's auto class (a notebook widget in Jupyter), nesting like the plain bar; ImportError without tqdm."""
    from tqdm.auto import tqdm

    return _nesting_subclass(tqdm)


@functools.lru_cache(maxsize=None)
def _nesting_subclass(tqdm):
    return type("NestingTqdm", (_Nesting, tqdm), {})


def _draws_in_place(cls, file) -> bool:
    """Whether tqdm's redraws are shown in place: a terminal, or Jupyter's widget (which writes no ``\\r``)."""
    if any(base.__module__ == "tqdm.notebook" for base in cls.__mro__):
        return True
    isatty = getattr(file, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False


def finish(bar):
    """Close ``bar`` as complete where its work ended before ``total``, a cap rather than a count (a search's
    ``max_values``): the total becomes the steps done, so the bar ends at 100%, not at 16/50."""
    total = getattr(bar, "total", None)
    if total is not None and bar.n < total:
        bar.total = bar.n
        if hasattr(bar, "refresh"):
            bar.refresh()
    bar.close()


def progress_bar(total=None, *, desc: str, enabled: bool, unit: str = "it", file=None, leave: bool = True):
    """A progress bar over ``total`` steps (``None``: unknown), or a silent stand-in when not ``enabled``.

    ``leave=False``: the bar disappears when done (tqdm), or prints nothing if it never printed (fallback);
    for inner loops such as one pass of the tiled engine. A bar opened within another bar's ``with`` block is
    nested and always ``leave=False``. tqdm draws it only where its redraws are shown in place (a terminal, a
    notebook); elsewhere the plain printer writes whole lines.

    The object has tqdm's ``update(n=1)``, ``set_postfix_str(text)``, ``write(text)`` and ``close()``, and is a
    context manager.

    Examples
    --------
    >>> with progress_bar(3, desc="demo", enabled=False) as bar:
    ...     for _ in range(3):
    ...         bar.update()
    """
    if not enabled:
        return _Silent()
    file = sys.stderr if file is None else file
    leave = bool(leave) and _DEPTH.get() == 0
    try:
        cls = _tqdm_class()
    except ImportError:
        cls = None
    if cls is None or not _draws_in_place(cls, file):
        return _PlainBar(total, desc, unit, file, leave=leave)
    return cls(total=total, desc=desc, unit=unit, file=file, dynamic_ncols=True, leave=leave)


def iterate(items, *, desc: str, enabled: bool, unit: str = "it"):
    """Yield ``items`` with a bar over them, advanced after each: the loop's body runs inside the bar's block, so the
    bars it opens are nested.

    Examples
    --------
    >>> [x for x in iterate([1, 2], desc="demo", enabled=False)]
    [1, 2]
    """
    items = list(items)
    with progress_bar(len(items), desc=desc, enabled=enabled, unit=unit) as bar:
        for item in items:
            yield item
            bar.update()
