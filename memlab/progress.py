"""The one progress bar of the package: tqdm where someone watches, plain lines in a log.

In a terminal (stderr is a TTY) or a notebook, `progress_bar` is ``tqdm.auto``'s bar. Anywhere else (stderr
redirected to a file, CI, a job scheduler) tqdm's carriage-return redraws pile up as one unreadable line
(~26 KB per offline run), so it prints instead one line when a stage starts, one about every 10 %, and
one when it ends, with the elapsed time.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where tqdm.auto draws a widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def progress_bar(iterable: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "",
             disable: bool = False, leave: bool = True, file: TextIO | None = None) -> Any:
    """A progress bar over ``iterable`` (or one advanced by ``update()``): tqdm in a terminal or a
    notebook, `LineProgress` when stderr is not a TTY. Same calls either way: iterate, ``update(n)``,
    ``total +=``, ``refresh()``, ``close()``."""
    out = file if file is not None else sys.stderr
    isatty = getattr(out, "isatty", None)
    if in_notebook():
        from tqdm.auto import tqdm
        from tqdm.notebook import tqdm as widget_tqdm

        if issubclass(tqdm, widget_tqdm):  # ipywidgets present: the widget bar
            return notebook_bar_class()(iterable, total=total, desc=desc, disable=disable, leave=leave, file=file)
        return tqdm(iterable, total=total, desc=desc, disable=disable, leave=leave, file=file)
    if isatty is not None and isatty():
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, disable=disable, leave=leave, file=file)
    return LineProgress(iterable, total=total, desc=desc, disable=disable, file=out)


@functools.cache
def notebook_bar_class() -> type:
    """tqdm's notebook widget whose saved output ends as the bar ended. tqdm displays its widget once, and the
    output's plain-text copy (what GitHub, an offline HTML export or a viewer without widgets shows) stays the first
    frame, ``0/1986``, while only the widget state moves on. This bar is displayed with a display id and, when it
    closes, its output is replaced (``update_display_data``, which nbclient applies to the saved notebook) by the
    final frame; a bar with ``leave=False`` is replaced by nothing, as it disappears on screen."""
    from IPython.display import display
    from tqdm.notebook import tqdm as widget_tqdm

    class NotebookBar(widget_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, display=False, **kwargs)
            self._handle = None if self.disable else display(self.container, display_id=True)

        def close(self) -> None:
            handle, self._handle = getattr(self, "_handle", None), None
            super().close()
            if handle is None:
                return
            if self.leave or (self.total and self.n < self.total):  # kept, or stopped early (shown red): final frame
                handle.update(self.container)
            else:
                handle.update({"text/plain": ""}, raw=True)

    return NotebookBar


class LineProgress:
    """A line per stage start, about every ``step`` of the total, and the end: ``desc: 40/100 (40 %), 3.2 s``."""

    def __init__(self, iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
                 disable: bool = False, file: TextIO | None = None, step: float = 0.1):
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        self.desc = desc
        self.disable = disable
        self.file = file
        self.step = step
        self.n = 0
        self._shown = -1  # the last tenth (of ``step``) printed
        self._t0: float | None = None  # set when the first line is printed
        self._born = time.perf_counter()  # work starts when the bar is made: the first chunk's time counts
        self._closed = False

    def _say(self, text: str) -> None:
        if self.disable:
            return
        out = self.file if self.file is not None else sys.stderr
        print(f"{self.desc}: {text}", file=out, flush=True)

    def _start(self) -> None:
        if self._t0 is None:
            self._t0 = self._born
            self._say(f"0/{self.total}" if self.total else "started")
            self._shown = 0

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None, "LineProgress: nothing to iterate (use update())"
        self._start()
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self._start()
        self.n += n
        if self.total and self.n < self.total:
            mark = self.n * round(1 / self.step) // self.total  # integers: 3/10 is the third tenth
            if mark > self._shown:
                self._shown = mark
                self._say(f"{self.n}/{self.total} ({100 * self.n / self.total:.0f} %), "
                          f"{time.perf_counter() - self._t0:.1f} s")  # type: ignore[operator]

    def refresh(self) -> None:
        """Nothing to redraw (a new total shows in the next line)."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._t0 is None:  # never advanced: nothing ran, nothing to say
            return
        end = "done" if not self.total or self.n >= self.total else "stopped"  # (an error or Ctrl-C)
        self._say(f"{self.n}/{self.total or self.n} {end}, {time.perf_counter() - self._t0:.1f} s")

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
