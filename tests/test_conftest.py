"""tests/conftest.py's settings for make test's workers: the files' order under xdist and the threads per worker."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_waiting_files_go_first_then_the_files_with_the_most_tests():
    files = Counter({"tests/test_b.py": 3, "tests/test_a.py": 3, "tests/test_big.py": 40, "tests/test_gap_ray.py": 1})
    order = conftest._file_order(files)
    assert sorted(order, key=order.get) == ["tests/test_gap_ray.py", "tests/test_big.py", "tests/test_a.py",
                                            "tests/test_b.py"]
    assert all((ROOT / f).is_file() for f in conftest.WAIT_FIRST)   # a renamed file would silently lose its place


def test_under_xdist_the_items_go_by_file_order_each_files_own_order_kept(monkeypatch):
    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    ids = ["tests/test_a.py::x", "tests/test_gap_ray.py::only", "tests/test_a.py::y", "tests/test_c.py::p[2]",
           "tests/test_c.py::p[1]", "tests/test_c.py::q"]
    items = [Item(i) for i in ids]
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ids                   # alone, pytest's order is untouched
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/test_gap_ray.py::only", "tests/test_c.py::p[2]",
                                         "tests/test_c.py::p[1]", "tests/test_c.py::q", "tests/test_a.py::x",
                                         "tests/test_a.py::y"]


def test_threads_per_worker_split_the_cores_between_the_workers(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert conftest._threads_per_worker() is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert conftest._threads_per_worker() == 8
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert conftest._threads_per_worker() == 1
