"""The installed package's import graph: no cycle, and every module where its name says.

The graph is built by grimp from the source of the installed `workwarden`,
found as the import system finds it (the editable install maps
`workwarden.statemachine` to `statemachine/`, `workwarden.storage` to
`storage/` and `workwarden.specs` to `specs/`), without running any of it: a
cycle is listed even when it stops the package from importing. Every import
counts, those under `if TYPE_CHECKING:` and those inside functions too: a
cycle hidden there is still a cycle, and one edit away from a failing import.

`from workwarden.statemachine import errors` is an edge to the submodule
`errors` only, as grimp records it. Python runs the package's `__init__`
first, but the importer does not depend on what the `__init__` defines; and
since that `__init__` imports most of its submodules, an edge to it from each
of them would make the whole package one cycle. A module that takes a name
the `__init__` defines (`from workwarden.statemachine import Spec`) gets an
edge to the package, and that cycle is real.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grimp
import pytest

# grimp finds a package's modules by walking its one folder, which misses the
# folders the install maps elsewhere and the folders without an `__init__.py`
# inside a package (check/, conformance/, properties/). Its finders are its
# extension points: the two below give it each installed package's own folder.
from grimp.application.config import settings
from grimp.application.ports.filesystem import AbstractFileSystem
from grimp.application.ports.modulefinder import AbstractModuleFinder, FoundPackage, ModuleFile
from grimp.application.ports.packagefinder import AbstractPackageFinder
from grimp.domain.valueobjects import Module

ROOT = Path(__file__).resolve().parent.parent

#: What the install holds: the packages `pyproject.toml` gives setuptools.
PACKAGES: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "setuptools"
]["packages"]

#: Packages whose folder sits at the repository's top level, not under workwarden/.
TOP_LEVEL_FOLDERS = {"statemachine", "storage", "specs"}


def _installed_folders() -> dict[str, list[Path]]:
    """The folders each package is imported from, found as the import system finds them.

    Nothing is imported: a top-level package is found by `find_spec` (which
    runs nothing for a name without a parent); a sub-package is its parent's
    subfolder of its name or, where the install maps it elsewhere, what the
    import system's finders answer given the parent's folders.
    """
    folders: dict[str, list[Path]] = {}
    for name in sorted(PACKAGES, key=lambda package: package.count(".")):
        parent, _, last = name.rpartition(".")
        if not parent:
            spec = importlib.util.find_spec(name)
        else:
            inside = [folder / last for folder in folders[parent] if (folder / last).is_dir()]
            if inside:
                folders[name] = inside
                continue
            parent_path = [str(folder) for folder in folders[parent]]
            spec = next(
                (
                    found
                    for finder in sys.meta_path
                    if hasattr(finder, "find_spec")
                    and (found := finder.find_spec(name, parent_path)) is not None
                ),
                None,
            )
        assert spec is not None, f"{name} is not installed: pip install -e '.[test]'"
        assert spec.submodule_search_locations, f"{name} is installed as a module, not a package"
        folders[name] = [Path(location) for location in spec.submodule_search_locations]
    return folders


@dataclass
class Installed:
    """The graph of the installed package, and the file each of its modules was read from."""

    graph: grimp.ImportGraph
    files: dict[str, Path]
    folders: dict[str, list[Path]]

    def imports(self, module: str) -> set[str]:
        """The modules `module` imports directly."""
        return self.graph.find_modules_directly_imported_by(module)


class _PackageFolders(AbstractPackageFinder):
    def __init__(self, folders: dict[str, list[Path]]) -> None:
        self.folders = folders

    def determine_package_directories(
        self, package_name: str, file_system: AbstractFileSystem
    ) -> set[str]:
        return {str(folder) for folder in self.folders[package_name]}


class _OwnModules(AbstractModuleFinder):
    """A package's modules: the Python files of its own folder (each sub-package is listed)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_package(
        self, package_name: str, package_directory: str, file_system: AbstractFileSystem
    ) -> FoundPackage:
        found = []
        for path in sorted(Path(package_directory).glob("*.py")):
            name = package_name if path.stem == "__init__" else f"{package_name}.{path.stem}"
            self.files[name] = path
            found.append(ModuleFile(module=Module(name), mtime=path.stat().st_mtime))
        return FoundPackage(
            name=package_name, directory=package_directory, module_files=frozenset(found)
        )


@contextmanager
def _finders(
    package_finder: AbstractPackageFinder, module_finder: AbstractModuleFinder
) -> Iterator[None]:
    before = {"PACKAGE_FINDER": settings.PACKAGE_FINDER, "MODULE_FINDER": settings.MODULE_FINDER}
    settings.configure(PACKAGE_FINDER=package_finder, MODULE_FINDER=module_finder)
    try:
        yield
    finally:
        settings.configure(**before)


@pytest.fixture(scope="module")
def installed() -> Installed:
    folders = _installed_folders()
    files: dict[str, Path] = {}
    with _finders(_PackageFolders(folders), _OwnModules(files)):
        graph = grimp.build_graph(
            *PACKAGES,
            include_external_packages=False,
            # The default: imports under `if TYPE_CHECKING:` are edges too.
            exclude_type_checking_imports=False,
            # No .grimp_cache folder in the working tree; the graph is cheap.
            cache_dir=None,
        )
    return Installed(graph=graph, files=files, folders=folders)


def strongly_connected(installed: Installed) -> list[list[str]]:
    """Every group of two or more modules that import each other, directly or not (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> Iterator[str]:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        return iter(sorted(installed.imports(module)))

    for root in sorted(installed.graph.modules):
        if root in index:
            continue
        work = [(root, visit(root))]
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    work.append((other, visit(other)))
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return sorted(groups)


def _shortest_cycle(installed: Installed, group: list[str]) -> list[str]:
    """A shortest chain of imports from the group's first module back to it."""
    start = group[0]
    members = set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for other in sorted(installed.imports(module) & members):
                if other == start:
                    chain = [module]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [*reversed(chain), start]
                if other not in came_from:
                    came_from[other] = module
                    following.append(other)
        frontier = following
    raise AssertionError(f"{group} is not a cycle")


def _shown(path: Path) -> Path:
    """A path relative to the repository when it is inside it."""
    file = path.resolve()
    return file.relative_to(ROOT) if file.is_relative_to(ROOT) else file


def _describe(installed: Installed, group: list[str]) -> str:
    """A cycle's shortest chain, then every import between its modules, by file and line."""
    lines = [" -> ".join(_shortest_cycle(installed, group))]
    for importer in group:
        where = _shown(installed.files[importer])
        for imported in sorted(installed.imports(importer) & set(group)):
            for detail in installed.graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"    {where}:{detail['line_number']}: {detail['line_contents']}")
    return "\n".join(lines)


def test_the_installed_package_has_no_import_cycle(installed: Installed) -> None:
    groups = strongly_connected(installed)
    assert not groups, f"{len(groups)} import cycle(s):\n" + "\n".join(
        _describe(installed, group) for group in groups
    )


def _imported_modules(installed: Installed, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules of the package an import statement names, as grimp resolves them."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == "workwarden")
        return
    if node.level or node.module is None or node.module.split(".")[0] != "workwarden":
        return
    for alias in node.names:
        submodule = f"{node.module}.{alias.name}"
        yield submodule if submodule in installed.graph.modules else node.module


def test_every_import_in_the_source_is_an_edge_of_the_graph(installed: Installed) -> None:
    """Imports under `if TYPE_CHECKING:` and inside functions included: cycles hide there."""
    missing = []
    for module in sorted(installed.graph.modules):
        path = installed.files[module]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for imported in _imported_modules(installed, node):
                if imported in installed.graph.modules and installed.graph.direct_import_exists(
                    importer=module, imported=imported
                ):
                    continue
                missing.append(f"{_shown(path)}:{node.lineno}: {module} -> {imported}")
    assert not missing, "imports the graph lacks:\n" + "\n".join(missing)


def _expected_path(module: str, is_package: bool) -> Path:
    """Where a module's file sits in the repository, by its import name."""
    parts = module.split(".")[1:]
    path = Path(*parts) if parts and parts[0] in TOP_LEVEL_FOLDERS else Path("workwarden", *parts)
    return path / "__init__.py" if is_package else path.with_suffix(".py")


def test_every_module_lives_in_the_folder_its_name_says(installed: Installed) -> None:
    misplaced = []
    for module, path in sorted(installed.files.items()):
        file = path.resolve()
        expected = _expected_path(module, file.name == "__init__.py")
        if not file.is_relative_to(ROOT):
            misplaced.append(f"{module}: {file} is outside {ROOT} (install with pip install -e)")
        elif file.relative_to(ROOT) != expected:
            misplaced.append(f"{module}: {file.relative_to(ROOT)}, expected {expected}")
    assert not misplaced, "\n".join(misplaced)


def test_every_python_file_of_the_package_folders_is_in_the_graph(installed: Installed) -> None:
    """A folder missing from pyproject.toml's packages would be left out of the wheel."""
    read = {path.resolve() for path in installed.files.values()}
    unread = sorted(
        str(_shown(path))
        for folders in installed.folders.values()
        for folder in folders
        for path in folder.rglob("*.py")
        if path.resolve() not in read
    )
    assert not unread, "Python files in no installed package:\n" + "\n".join(unread)


#: The modules a user imports first: each package, each store backend, the command line.
FIRST_IMPORTS = (
    "workwarden",
    "workwarden.statemachine",
    "workwarden.statemachine.errors",
    "workwarden.storage",
    "workwarden.storage.base",
    "workwarden.storage.memory",
    "workwarden.storage.sqlite",
    "workwarden.storage.postgres",
    "workwarden.storage.urls",
    "workwarden.storage.testing",
    "workwarden.runtime",
    "workwarden.fence",
    "workwarden.service",
    "workwarden.service.client",
    "workwarden.testing",
    "workwarden.migrate",
    "workwarden.periodic",
    "workwarden.adapter",
    "workwarden.cli",
    "workwarden._launch",
)


@pytest.mark.parametrize("module", FIRST_IMPORTS)
def test_each_module_a_user_imports_first_imports_in_a_fresh_interpreter(module: str) -> None:
    # The import order inside one test process hides a module that only imports after
    # another: `import workwarden.storage` on its own once failed on a partial module.
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parent.parent.parent,
    )
    assert done.returncode == 0, done.stderr
