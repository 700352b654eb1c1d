"""The code's shape holds: the import-linter contracts in pyproject.toml (layers, monitoring's way into inference, no
cycles between siblings) and no import cycle between any two modules of RigDash, imports inside functions and for
type checking included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("inference", "monitoring", "rigdash")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_imports_itself_back():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    """The check above can fail: two modules that import each other (one inside a function) are found."""
    package = tmp_path / "cyclepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclepkg import b\n")
    (package / "b.py").write_text("def f():\n    from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyclepkg", cache_dir=None)) == [["cyclepkg.a", "cyclepkg.b"]]


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_process_knows_the_tasks_the_lower_layers_send_by_name():
    """The queue and the board send Celery tasks by name (they sit below inference.tasks): a web process that never
    imported inference.tasks must still have them, from another thread too (where Channels runs the ORM)."""
    script = (
        "import threading, django; django.setup(); from celery import current_app;"
        "from inference.board.model_admin import MODEL_PULL_TASK; from inference.queue.dispatch import TURNS_RUN_TASK;"
        "found = []; names = (TURNS_RUN_TASK, MODEL_PULL_TASK);"
        "t = threading.Thread(target=lambda: found.extend(n in current_app.tasks for n in names));"
        "t.start(); t.join(); print(found)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rigdash.settings"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "[True, True]"
