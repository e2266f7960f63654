"""What the built sdist and wheel hold (.ci/run, after ``python -m build --outdir DIR``).

``python .ci/check_dist.py DIR`` checks:

- one wheel and one sdist, named for the package's version (``trioq.__version__``, read from
  the source, not imported);
- the wheel holds every file of the package that git tracks (the migrations' .sql, the
  dashboard's templates and static files, py.typed, every module), nothing outside
  ``trioq/`` and its dist-info, no byte code, and the licence and the ``trioq`` command in
  its dist-info;
- the sdist holds every tracked file but .ci/ and .gitignore (the tests, the docs and
  mkdocs.yml, the example app, the benchmarks, CHANGELOG.md, LICENSE), and nothing
  untracked but what the build writes (PKG-INFO, setup.cfg, trioq.egg-info/).

It prints the listing's sizes, and exits 1 naming what is missing or extra.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Tracked files that the sdist leaves out: CI's own scripts and the git configuration.
NOT_IN_SDIST = (".ci/", ".gitignore")
#: Files the sdist has that git does not track: setuptools writes them.
BUILT = ("PKG-INFO", "setup.cfg", "trioq.egg-info/")


def version() -> str:
    tree = ast.parse((ROOT / "trioq" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "__version__"
        ]:
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise SystemExit("no __version__ in trioq/__init__.py")


def tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    )
    return {path for path in out.stdout.split("\0") if path and (ROOT / path).is_file()}


def problems(dist: Path) -> list[str]:
    found: list[str] = []
    v = version()
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if [w.name for w in wheels] != [f"trioq-{v}-py3-none-any.whl"]:
        found.append(f"wheels {[w.name for w in wheels]}, want trioq-{v}-py3-none-any.whl")
    if [s.name for s in sdists] != [f"trioq-{v}.tar.gz"]:
        found.append(f"sdists {[s.name for s in sdists]}, want trioq-{v}.tar.gz")
    if found:
        return found
    files = tracked()
    package = {path for path in files if path.startswith("trioq/")}

    with zipfile.ZipFile(wheels[0]) as wheel:
        in_wheel = {name for name in wheel.namelist() if not name.endswith("/")}
        info = f"trioq-{v}.dist-info/"
        entry_points = wheel.read(info + "entry_points.txt").decode()
    for path in sorted(package - in_wheel):
        found.append(f"wheel: {path} is missing")
    for path in sorted(in_wheel - package):
        if not path.startswith(info) or path.endswith((".pyc", ".pyo")):
            found.append(f"wheel: {path} should not be in it")
    if info + "licenses/LICENSE" not in in_wheel:
        found.append(f"wheel: no {info}licenses/LICENSE")
    if "trioq = trioq._cli:main" not in entry_points:
        found.append("wheel: no trioq command in entry_points.txt")

    prefix = f"trioq-{v}/"
    with tarfile.open(sdists[0]) as sdist:
        in_sdist = {m.name.removeprefix(prefix) for m in sdist.getmembers() if m.isfile()}
    wanted = {path for path in files if not path.startswith(NOT_IN_SDIST)}
    for path in sorted(wanted - in_sdist):
        found.append(f"sdist: {path} is missing")
    for path in sorted(in_sdist - wanted):
        if not path.startswith(BUILT):
            found.append(f"sdist: {path} is not a tracked file")

    print(
        f"check_dist: wheel {len(in_wheel)} files ({wheels[0].stat().st_size:,} bytes), "
        f"sdist {len(in_sdist)} files ({sdists[0].stat().st_size:,} bytes); "
        f"{len(package)} tracked package files, {len(wanted)} tracked files for the sdist"
    )
    return found


def main() -> int:
    (dist,) = sys.argv[1:]
    found = problems(Path(dist))
    for problem in found:
        print(f"check_dist: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
