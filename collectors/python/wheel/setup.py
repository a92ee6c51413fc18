"""Packs the `rankwatch` package that CMake assembled (the pure Python modules and the pybind11
extension rankwatch/_native*.so, already built) into a wheel. Run by the CMake target
`rankwatch_wheel` from a staging copy (build/wheel-src): `python3 -m build --wheel --no-isolation`.
The extension links the system's librdkafka, protobuf and Abseil dynamically (Debian's)."""
import os

from setuptools import Distribution, setup


class BinaryDistribution(Distribution):
    """A wheel tagged for this interpreter and platform (cp311-cp311-linux_x86_64): the package
    carries a compiled extension, although setuptools does not build it."""

    def has_ext_modules(self):
        return True


setup(
    name="rankwatch",
    version=os.environ["RANKWATCH_VERSION"],
    description="rankwatch collector for PyTorch training jobs: per-step telemetry to rankwatchd",
    packages=["rankwatch"],
    # py.typed (PEP 561): the package's annotations are its types; _native.pyi types the extension.
    package_data={"rankwatch": ["_native*.so", "_native.pyi", "py.typed"]},
    python_requires=">=3.11,<3.12",
    distclass=BinaryDistribution,
    zip_safe=False,
)
