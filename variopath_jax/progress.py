"""Progress of long work, on stderr, for the command line.

Library code wraps anything that can take more than a moment (catalog builds and loads, LP
bounds, MILP solves, planning, simulation, gap studies, bench suites) in :func:`task`. Nothing is
shown until a caller turns reporting on with :func:`configure`; the ``variopath`` command does so
when stderr is a terminal and ``--json`` is off, or when ``--progress`` asks for it. On a terminal
the tasks are live rich bars (removed when done); elsewhere a task that runs more than a moment
prints a line when it has started, a line now and then while it runs, and a line when it ends.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

# Line mode (not on a terminal): a task is announced after LINE_DELAY_S (quick ones stay quiet),
# then reported every LINE_INTERVAL_S; the watcher looks every WATCH_S.
LINE_DELAY_S = 2.0
LINE_INTERVAL_S = 10.0
WATCH_S = 0.5


class Task:
    """A handle on one running task: :meth:`advance` and :meth:`update` report work done."""

    def advance(self, amount: float = 1, label: str | None = None) -> None:
        """``amount`` more done; ``label`` (optional) replaces what is being done now."""

    def update(self, completed: float, label: str | None = None) -> None:
        """``completed`` done so far."""


class _RichTask(Task):
    def __init__(self, reporter: _RichReporter, task_id: Any) -> None:
        self._reporter, self._id = reporter, task_id

    def advance(self, amount: float = 1, label: str | None = None) -> None:
        self._reporter.bar.update(self._id, advance=amount, **_label(label))

    def update(self, completed: float, label: str | None = None) -> None:
        self._reporter.bar.update(self._id, completed=completed, **_label(label))


def _label(label: str | None) -> dict[str, str]:
    return {} if label is None else {"description": label}


class _RichReporter:
    """Live bars on a terminal: one rich Progress shared by every open task."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=True,
        )
        self.open = 0

    @contextmanager
    def task(self, description: str, total: float | None) -> Iterator[Task]:
        if self.open == 0:
            self.bar.start()
        self.open += 1
        task_id = self.bar.add_task(description, total=total)
        try:
            yield _RichTask(self, task_id)
        finally:
            self.bar.remove_task(task_id)
            self.open -= 1
            if self.open == 0:
                self.bar.stop()


class _LineTask(Task):
    def __init__(self, description: str, total: float | None) -> None:
        self.description, self.total = description, total
        self.completed = 0.0
        self.label = description
        self.start = self.last = time.monotonic()
        self.announced = False

    def advance(self, amount: float = 1, label: str | None = None) -> None:
        self.update(self.completed + amount, label)

    def update(self, completed: float, label: str | None = None) -> None:
        self.completed = completed
        if label is not None:
            self.label = label

    def status(self, now: float) -> str:
        """``description: running for T s``, then how much is done and on what, when known."""
        text = f"{self.description}: running for {now - self.start:.0f} s"
        if self.total is not None or self.completed:
            text += f", {self.count()} done"
        return text if self.label == self.description else f"{text} ({self.label})"

    def count(self) -> str:
        done = f"{self.completed:g}"
        return done if self.total is None else f"{done}/{self.total:g}"


class _LineReporter:
    """Plain lines for logs and pipes. A task is announced once it has run ``LINE_DELAY_S``
    (at once when that is 0), reported every ``LINE_INTERVAL_S`` while it runs, and its end is
    reported if it was announced; a watcher thread keeps the time, so a task that reports
    nothing (one solver call) is still announced."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.open: list[_LineTask] = []
        self.lock = threading.Lock()
        self.watcher: threading.Thread | None = None

    def write(self, text: str) -> None:
        print(f"variopath: {text}", file=self.stream, flush=True)

    def _announce(self, t: _LineTask) -> None:
        t.announced = True
        t.last = time.monotonic()
        self.write(f"{t.description} ...")

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_S)
            with self.lock:
                if not self.open:
                    self.watcher = None
                    return
                now = time.monotonic()
                for t in self.open:
                    if not t.announced and now - t.start >= LINE_DELAY_S:
                        self._announce(t)
                    elif t.announced and now - t.last >= LINE_INTERVAL_S:
                        t.last = now
                        self.write(t.status(now))

    @contextmanager
    def task(self, description: str, total: float | None) -> Iterator[Task]:
        t = _LineTask(description, total)
        with self.lock:
            self.open.append(t)
            if LINE_DELAY_S <= 0:
                self._announce(t)
            elif self.watcher is None:
                self.watcher = threading.Thread(target=self._watch, daemon=True)
                self.watcher.start()
        try:
            yield t
        finally:
            with self.lock:
                self.open.remove(t)
                if t.announced:
                    count = f", {t.count()}" if t.total is not None else ""
                    took = time.monotonic() - t.start
                    self.write(f"{description}: done in {took:.1f} s{count}")


_reporter: _RichReporter | _LineReporter | None = None


def configure(enabled: bool, stream: TextIO | None = None) -> None:
    """Turn reporting on (live bars when ``stream``, default stderr, is a terminal; lines
    otherwise) or off."""
    global _reporter
    if not enabled:
        _reporter = None
        return
    stream = stream or sys.stderr
    _reporter = _RichReporter(stream) if stream.isatty() else _LineReporter(stream)


def enabled() -> bool:
    """Whether progress is being reported."""
    return _reporter is not None


@contextmanager
def task(description: str, total: float | None = None) -> Iterator[Task]:
    """Report ``description`` while the block runs (a bar when ``total`` is known); a no-op
    unless :func:`configure` turned reporting on."""
    if _reporter is None:
        yield Task()
        return
    with _reporter.task(description, total) as t:
        yield t
