"""Builds conflux._c10d, the torch backend in C++ (backend.cpp), against the torch installed in
this environment (its headers, its C++ ABI flags), as torch-ccl builds per torch version:

    pip install --no-build-isolation ./crates/conflux-py/csrc

Install the conflux package first (it provides conflux._native, whose C ABI this calls).
Without this module, `conflux.torch` falls back to its Python backend."""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="conflux-torch-backend",
    version="0.1.0",
    description="conflux's torch.distributed backend as a C++ c10d::Backend",
    ext_modules=[CppExtension("conflux._c10d", ["backend.cpp"], extra_compile_args=["-O2", "-Wall"])],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
