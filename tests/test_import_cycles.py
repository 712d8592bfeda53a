"""tools/check_import_cycles.py: it finds a circle of imports that run (module level or
inside a function), not one closed only under ``if TYPE_CHECKING:``, and the package has none."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_import_cycles.py"


def write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def check(*package_dirs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, package_dirs)], capture_output=True, text=True,
                          timeout=60)


def test_a_module_level_circle_through_three_modules_is_printed(tmp_path):
    pkg = write_package(tmp_path, {
        "a.py": "from . import b\n",
        "b.py": "import pkg.sub.c\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import something\n",
        "leaf.py": "from .a import x\n",  # imports into the circle, is not part of it
    })
    result = check(pkg)
    assert result.returncode == 1, result
    assert result.stdout.splitlines() == ["import cycle: pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"]


def test_a_function_local_import_closes_a_circle(tmp_path):
    pkg = write_package(tmp_path, {
        "a.py": "from .b import B\n",
        "b.py": "B = 1\n\ndef late():\n    from .a import A\n    return A\n",
    })
    result = check(pkg)
    assert result.returncode == 1, result
    assert "import cycle: pkg.a -> pkg.b -> pkg.a" in result.stdout


def test_a_type_only_circle_is_allowed(tmp_path):
    pkg = write_package(tmp_path, {
        "a.py": "from .b import B\nA = 1\n",
        "b.py": ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from .a import A\nelse:\n    from .c import C\nB = 1\n"),
        "c.py": "C = 1\n",
    })
    result = check(pkg)
    assert (result.returncode, result.stdout) == (0, ""), result


def test_the_else_of_type_checking_runs(tmp_path):
    pkg = write_package(tmp_path, {
        "a.py": "from .b import B\n",
        "b.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from . import a\nB = 1\n",
    })
    assert check(pkg).returncode == 1


def test_importing_a_submodule_runs_its_packages_init(tmp_path):
    pkg = write_package(tmp_path, {
        "sub/__init__.py": "from ..a import A\n",
        "sub/x.py": "X = 1\n",
        "a.py": "from .sub.x import X\nA = 1\n",
    })
    result = check(pkg)
    assert result.returncode == 1, result
    assert "import cycle: pkg.a -> pkg.sub -> pkg.a" in result.stdout


def test_a_module_importing_its_own_package_is_no_circle(tmp_path):
    pkg = write_package(tmp_path, {
        "__init__.py": "from .a import A\n",
        "a.py": "import pkg\nA = 1\n",
    })
    assert check(pkg).returncode == 0


def test_triton_shm_has_no_import_cycle():
    result = check(ROOT / "triton_shm")
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_model_version_is_a_leaf_and_the_schedulers_share_pending_not_each_other():
    """The knot this check was written for stays untied: ModelVersion imports (at run time)
    no scheduler, loader or validator, and sequence.py takes Pending from pending.py."""
    spec = importlib.util.spec_from_file_location("check_import_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = module.import_graph(ROOT / "triton_shm")
    core = "triton_shm.core"
    assert not {t for t in graph[f"{core}.models.version"] if t.startswith((f"{core}.scheduling", f"{core}.models."))
                and t != f"{core}.models.config"}
    assert f"{core}.scheduling.dynamic" not in graph[f"{core}.scheduling.sequence"]
    assert f"{core}.scheduling.pending" in graph[f"{core}.scheduling.sequence"]
