"""The parity sweep as pytest items: ``pytest --pyggml-sweep [-n 2]``.

Registered as a pytest plugin (entry point ``pytest11``), so it is there wherever
pyggml is installed. It is a top-level module of its own, as hypothesis's plugin is, so
that loading it imports nothing of pyggml: a pytest session that does not ask for the
sweep neither pays for nor depends on the compiled extension. With ``--pyggml-sweep`` the session's items are the sweep's cases
(one item per case, every pair of its paths compared, as ``pyggml parity`` does)
instead of the collected test files; pytest-xdist's ``-n`` spreads them over processes
or hosts. Each pytest process hands its items to a parity worker of its own
(:class:`pyggml.parity.runner.WorkerPool`, as ``pyggml parity`` does): the worker proves
graphs in itself instead of in a child forked per case, and a case that crashes or hangs
inside ggml is that item's ``crashed`` / ``timeout`` failure while the session goes on.
Where the session registered subjects or paths of its own (a ``conftest.py``), which a
fresh worker would not know, the cases run in the pytest process itself, their graphs
proven in forked children. ``--pyggml-sweep-json F`` writes the same JSON report as
``pyggml parity --json F``, gathered from every worker.

Options: ``--pyggml-sweep-op GLOB`` (repeatable), ``--pyggml-sweep-types F32,F16``,
``--pyggml-sweep-quick``, ``--pyggml-sweep-seed N``, ``--pyggml-sweep-paths ggml,reference``,
``--pyggml-sweep-threads N``, ``--pyggml-sweep-timeout S``.
A case passes when none of its rows is in ``BAD``; one whose every row is refused (a
known upstream defect) or skipped is reported as skipped.
"""

from __future__ import annotations

from typing import Any

import pytest

_ROWS_KEY = "pyggml_parity_rows"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("pyggml", "pyggml parity sweep")
    g.addoption("--pyggml-sweep", action="store_true", help="run the parity sweep's cases as the test items")
    g.addoption("--pyggml-sweep-op", action="append", default=[], metavar="GLOB",
                help="only the subjects whose op or name matches (repeatable)")
    g.addoption("--pyggml-sweep-types", default="", metavar="T,T", help="only cases of these ggml types")
    g.addoption("--pyggml-sweep-paths", default="", metavar="P,P", help="only these paths (at least two)")
    g.addoption("--pyggml-sweep-quick", action="store_true", help="the quick sweep (pyggml parity --quick)")
    g.addoption("--pyggml-sweep-seed", type=int, default=0, metavar="N", help="the sweep's seed")
    g.addoption("--pyggml-sweep-threads", type=int, default=1, metavar="N", help="ggml's threads per computation")
    g.addoption("--pyggml-sweep-timeout", type=float, default=300.0, metavar="S",
                help="seconds before a case is a timeout (as pyggml parity --timeout)")
    g.addoption("--pyggml-sweep-json", default=None, metavar="PATH", help="write the rows as pyggml parity --json")


def _paths(config: pytest.Config) -> list[str] | None:
    s = config.getoption("--pyggml-sweep-paths")
    return [p.strip() for p in s.split(",") if p.strip()] or None


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    # the sweep replaces the test files: do not import them
    return True if config.getoption("--pyggml-sweep") else None


# this process's parity worker (one per pytest process, xdist's workers included), made
# at the first item and closed with the session
_POOL: Any = None


def _own_subjects() -> bool:
    """Whether this session registered subjects or paths, which a fresh worker lacks."""
    from pyggml.parity import subjects
    return bool(subjects._USER or subjects._USER_PATHS)


def _rows(case: Any, paths: list[str] | None, n_threads: int, timeout: float) -> list[Any]:
    global _POOL
    from pyggml.parity import runner

    if _own_subjects():
        return runner.check_case(case, paths, n_threads=n_threads)[0]
    if _POOL is None:
        _POOL = runner.WorkerPool(1, paths, n_threads=n_threads, timeout=timeout, batch=1)
    return _POOL.run([case])[0]


class SweepItem(pytest.Item):
    def __init__(self, *, case: Any, paths: list[str] | None, n_threads: int, timeout: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.case = case
        self.paths = paths
        self.n_threads = n_threads
        self.timeout = timeout

    def runtest(self) -> None:
        from pyggml.parity.model import BAD

        rows = _rows(self.case, self.paths, self.n_threads, self.timeout)
        self.user_properties.append((_ROWS_KEY, [r.as_dict() for r in rows]))
        bad = [r for r in rows if r.verdict in BAD]
        if bad:
            lines = [f"{r.a}~{r.b}: {r.verdict}: {r.detail[:300]}" for r in bad]
            raise SweepFailure("\n".join(lines) + "\nreproducer:\n" + bad[0].repro)
        if rows and all(r.verdict in ("refused", "skipped") for r in rows):
            pytest.skip(f"{rows[0].verdict}: {rows[0].detail[:200]}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, SweepFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.case.subject} [{self.case.label}]"


class SweepFailure(Exception):
    pass


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--pyggml-sweep"):
        return
    from pyggml.parity.runner import select

    types = [t.strip() for t in config.getoption("--pyggml-sweep-types").split(",") if t.strip()]
    cases = select(config.getoption("--pyggml-sweep-op"), types, config.getoption("--pyggml-sweep-quick"),
                   config.getoption("--pyggml-sweep-seed"))
    if not cases:
        raise pytest.UsageError("--pyggml-sweep: no subject matches --pyggml-sweep-op/--pyggml-sweep-types")
    paths = _paths(config)
    n_threads = config.getoption("--pyggml-sweep-threads")
    if n_threads < 1:
        raise pytest.UsageError("--pyggml-sweep-threads must be >= 1")
    timeout = config.getoption("--pyggml-sweep-timeout")
    if not timeout > 0:
        raise pytest.UsageError("--pyggml-sweep-timeout must be > 0")
    items[:] = [SweepItem.from_parent(session, name=c.key, case=c, paths=paths, n_threads=n_threads, timeout=timeout)
                for c in cases]


def pytest_unconfigure(config: pytest.Config) -> None:
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


class _Collector:
    """Gathers the rows of every item, from this process or from xdist's workers."""

    def __init__(self, path: str):
        self.path = path
        self.rows: dict[str, list[dict[str, Any]]] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == _ROWS_KEY:
                self.rows[report.nodeid] = list(value)  # type: ignore[call-overload]

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from pyggml.parity import store
        from pyggml.parity.model import Row
        from pyggml.parity.report import write_json

        ordered = []
        for nodeid in sorted(self.rows):
            for d in self.rows[nodeid]:
                # as_dict spelled inf / nan as strings for JSON
                d = {k: (float(v) if k in ("nmse", "max_abs") and isinstance(v, str) else v) for k, v in d.items()}
                ordered.append(Row(**d))
        write_json(ordered, self.path, {"identity": store.build_identity(), "runner": "pytest"})


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--pyggml-sweep-json", None)
    # only the controlling process writes (xdist's workers have workerinput)
    if path and config.getoption("--pyggml-sweep") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Collector(path), "pyggml-sweep-json")



def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """With --pyggml-sweep: which ops' kernels pyggml's rules were not written against
    (their graphs are proven in a forked child before they compute)."""
    if not config.getoption("--pyggml-sweep", False):
        return None
    from pyggml.parity import store
    untrusted = store.build_identity()["untrusted_kernels"]
    shown = untrusted if isinstance(untrusted, str) else (", ".join(untrusted) or "none")
    return [f"pyggml: kernels not trusted to their rules: {shown}"]
