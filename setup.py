"""Package layout (metadata is in pyproject.toml).

The hardware profiles and the paper's scenarios live once, at the top of the repository
(`hwprofiles/`, `scenarios/`), where people edit them. The build maps those folders into
the package as `simcluster/hwprofiles/` and `simcluster/scenarios/`, so a wheel carries them
as package data (read with `importlib.resources`, see `simcluster.config.profiles`) without
a second copy in the tree. Here rather than in pyproject.toml because the mapped folders
must be added to the packages `find_packages` discovers (pyproject takes one or the other).
"""

from setuptools import find_packages, setup

# folder in the repository -> package in the wheel; each subfolder of yaml files is a package
DATA_PACKAGES = {
    "simcluster.hwprofiles": "hwprofiles",
    "simcluster.scenarios": "scenarios",
    "simcluster.scenarios.paper": "scenarios/paper",
}

setup(
    packages=[*find_packages(include=["simcluster", "simcluster.*"]), *DATA_PACKAGES],
    package_dir=DATA_PACKAGES,
    package_data={
        "simcluster": ["py.typed", "data/*.yaml"],
        **{package: ["*.yaml"] for package in DATA_PACKAGES},
    },
)
