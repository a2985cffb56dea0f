"""Every example in a docstring of the package runs, and shows what it says it shows.

The examples (`>>>` lines) in the installed modules' docstrings are run with
`doctest`, one test per docstring that has any, so the reference site never
shows an example that has stopped working. Indented code that is not written
with `>>>` is prose for the reader, not an example, and is not run.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

#: The packages whose modules are searched (installed names: statemachine/ and
#: storage/ are mapped under `workwarden`, so each is walked from its own path).
PACKAGES = ("workwarden", "workwarden.statemachine", "workwarden.storage")
#: Modules that do something when imported: running the command line.
NOT_IMPORTED = frozenset({"workwarden.__main__"})


def _modules() -> list[ModuleType]:
    names: set[str] = set(PACKAGES)
    for package in PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            names.add(info.name)
    return [importlib.import_module(name) for name in sorted(names - NOT_IMPORTED)]


def _examples() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests: dict[str, doctest.DocTest] = {}
    for module in _modules():
        for test in finder.find(module):
            if test.examples:
                tests.setdefault(test.name, test)
    return [tests[name] for name in sorted(tests)]


EXAMPLES = _examples()


def test_the_package_has_docstring_examples_to_run() -> None:
    names = {test.name for test in EXAMPLES}
    assert "workwarden.statemachine.errors.WorkloadError" in names
    assert "workwarden.statemachine.spec.Spec.check_failure_kind" in names


@pytest.mark.parametrize("example", EXAMPLES, ids=[test.name for test in EXAMPLES])
def test_a_docstring_example_runs_as_shown(example: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    result = runner.run(example, out=out.append, clear_globs=True)
    assert result.failed == 0, "".join(out)
