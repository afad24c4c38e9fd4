"""Wheels for a GPU machine that has torch and Lightning but cannot reach a package index.

    python benchmarks/gpu_check_wheels.py --have installed.txt [--python 3.12] [--dest .whl]

``installed.txt`` lists the distributions the GPU machine already has (names separated by
commas, spaces or lines, e.g. from its ``pip list``). This walks hpsearch's requirements
(and Ray Tune's extra) as installed here, downloads, for that machine's Python and x86-64
Linux, the ones it lacks at the versions installed here, and builds hpsearch's own wheel.
Ray's wheel is stripped of parts a search never imports (its Java jars, RLlib, Serve, LLM,
the dashboard's source maps): 79 MB become 43 MB, which is what let the set travel to the
H200 lent on 2026-12-04 under a 64 MiB limit. ``benchmarks/gpu_check.sh`` installs them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

RAY_PARTS_NOT_NEEDED = ("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_installed_here(python_version: str) -> dict[str, str]:
    """Every distribution hpsearch (and ``ray[tune]``) needs, by normalized name, at the
    version installed in this environment."""
    marker_env = {"python_version": python_version, "sys_platform": "linux", "platform_machine": "x86_64",
                  "platform_system": "Linux", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython"}
    found: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def walk(name: str, extras: tuple[str, ...] = ()) -> None:
        if (normalized(name), extras) in seen:
            return
        seen.add((normalized(name), extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            sys.exit(f"{name} is not installed here: run this from hpsearch's environment")
        found[normalized(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**marker_env, "extra": extra})
                                         for extra in ("", *extras)):
                walk(req.name, tuple(sorted(req.extras)))

    walk("hpsearch")
    walk("ray", ("tune",))
    found.pop("hpsearch")
    return found


def strip_ray(wheel: Path) -> None:
    """Rewrite Ray's wheel without the parts a search never imports (RECORD kept consistent)."""
    def dropped(name: str) -> bool:
        return name.startswith(RAY_PARTS_NOT_NEEDED) or (
            name.startswith("ray/dashboard/client/build") and name.endswith(".map"))

    stripped = wheel.with_suffix(".stripped")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(stripped, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for item in source.infolist():
            if dropped(item.filename):
                continue
            data = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines() if not dropped(line.split(",")[0])]
                data = ("\n".join(kept) + "\n").encode()
            out.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    stripped.replace(wheel)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--have", type=Path, required=True, help="the GPU machine's installed distributions")
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python version (major.minor)")
    parser.add_argument("--dest", type=Path, default=Path(".whl"))
    args = parser.parse_args()
    have = {normalized(name) for name in re.split(r"[,\s]+", args.have.read_text()) if name}
    missing = {name: version for name, version in requirements_installed_here(args.python).items()
               if name not in have}
    args.dest.mkdir(parents=True, exist_ok=True)
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    tag = args.python.replace(".", "")
    for name, version in sorted(missing.items()):
        print(f"downloading {name}=={version}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", args.python, "--implementation", "cp", "--abi", f"cp{tag}",
                        "--abi", "abi3", "--abi", "none", *platforms, "-d", str(args.dest), f"{name}=={version}"],
                       check=True)
    for wheel in args.dest.glob("ray-*.whl"):
        strip_ray(wheel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(args.dest), str(Path(__file__).resolve().parents[1])], check=True)
    total = sum(path.stat().st_size for path in args.dest.glob("*.whl"))
    print(f"{len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.0f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
