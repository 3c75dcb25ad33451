"""Package layout (metadata is in pyproject.toml).

The hardware profiles and the paper's scenarios live once, at the top of the repository
(`hwprofiles/`, `scenarios/`), where people edit them. The build maps those folders into
the package as `simcluster/hwprofiles/` and `simcluster/scenarios/`, so a wheel carries them
as package data (read with `importlib.resources`, see `simcluster.config.profiles`) without
a second copy in the tree. Here rather than in pyproject.toml because the mapped folders
must be added to the packages `find_packages` discovers (pyproject takes one or the other).
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def _data_packages(folder: str) -> dict[str, str]:
    """`folder` and every subfolder holding yaml files, as packages under `simcluster.`
    (so a new scenario folder ships without editing this file)."""
    found = {f"simcluster.{folder}": folder}
    for sub in sorted((ROOT / folder).rglob("*")):
        if sub.is_dir() and any(sub.glob("*.yaml")):
            relative = sub.relative_to(ROOT).as_posix()
            found["simcluster." + relative.replace("/", ".")] = relative
    return found


# folder in the repository -> package in the wheel; each subfolder of yaml files is a package
DATA_PACKAGES = {**_data_packages("hwprofiles"), **_data_packages("scenarios")}

setup(
    packages=[*find_packages(include=["simcluster", "simcluster.*"]), *DATA_PACKAGES],
    package_dir=DATA_PACKAGES,
    package_data={
        "simcluster": ["py.typed", "data/*.yaml"],
        **{package: ["*.yaml"] for package in DATA_PACKAGES},
    },
)
