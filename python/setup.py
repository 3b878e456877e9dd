"""pip install of the sinew package from the source tree, without a network:

    pip install --no-build-isolation ./python

(--no-build-isolation: pip would otherwise fetch setuptools into a fresh environment; the one it runs in
has it.) The extension module is Sinew's CMake build's (target sinew_python): taken from $SINEW_BUILD_DIR
(default: the repository's build/) when it is there, built with mpi_scripts/build.sh otherwise. It keeps its
run paths to the ULFM Open MPI and to the Torch it was built against, so install it into the Python that has
that Torch (mpi_scripts/env.sh: $SINEW_TORCH_VENV).
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


BUILD = os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build"))
# setuptools' own files go to the build directory, never into the source tree.
PIP_BUILD = os.path.join(BUILD, "pip")
os.makedirs(PIP_BUILD, exist_ok=True)


def extension():
    build = BUILD
    found = glob.glob(os.path.join(build, "python", "sinew", "_core*.so"))
    if not found:
        env = dict(os.environ, SINEW_BUILD_DIR=build, SINEW_BUILD_TARGETS="sinew_python")
        subprocess.run(["bash", os.path.join(ROOT, "mpi_scripts", "build.sh"), f"-DSINEW_PYTHON={sys.executable}",
                        "-DSINEW_TORCH=ON"], check=True, env=env)
        found = glob.glob(os.path.join(build, "python", "sinew", "_core*.so"))
    if not found:
        raise SystemExit(f"sinew: the extension module was not built in {build}")
    return found[0]


class BuildWithExtension(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "sinew")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(extension(), target)


setup(
    name="sinew",
    version="0.1.0",
    description="Sinew's elastic, fault-tolerant data-parallel runtime for PyTorch models (MPI, ULFM)",
    packages=["sinew"],
    package_dir={"sinew": "sinew"},
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithExtension},
    zip_safe=False,
    options={"build": {"build_base": PIP_BUILD}, "egg_info": {"egg_base": PIP_BUILD}},
)
