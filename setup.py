"""Packaging that pyproject.toml cannot express: the repository's `recipes/` (recipes, base/ and studies/)
ship inside the wheel as `teacli/recipes/`, so that `tea recipes list` and `tea train quickstart` work from a
regular install. `recipes/` stays at the repository root, where users read and edit it; everything else
(metadata, dependencies, package data) is in pyproject.toml. `teacli.config.packaged_recipes_dir()` finds
the recipes in either layout.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["teacli", "teacli.*"]), "teacli.recipes"],
    package_dir={"teacli.recipes": "recipes"},
)
