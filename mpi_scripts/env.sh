# Sourced by Sinew's scripts: where things are, and the mpirun flags that Sinew runs with.
# Override with SINEW_MPI_PREFIX, SINEW_BUILD_DIR.
sinew_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SINEW_MPI_PREFIX=${SINEW_MPI_PREFIX:-/opt/sinew/openmpi-ulfm}
SINEW_BUILD_DIR=${SINEW_BUILD_DIR:-$sinew_root/build}
# Torch, torchvision and pybind11 from PyPI (setup.sh); CMake's SINEW_PYTHON defaults to its python.
SINEW_TORCH_VENV=${SINEW_TORCH_VENV:-/opt/sinew/torch-venv}
export SINEW_MPI_PREFIX SINEW_BUILD_DIR SINEW_TORCH_VENV

if [ -x "$SINEW_MPI_PREFIX/bin/mpirun" ] && [ "${SINEW_SKIP_ULFM:-0}" != 1 ]; then
  SINEW_MPIRUN="$SINEW_MPI_PREFIX/bin/mpirun"
  # --with-ft ulfm turns on fault tolerance; async_mpi_finalize avoids hangs in MPI_Finalize after a
  # failure (docs/architecture.md).
  SINEW_MPIRUN_FLAGS=(--with-ft ulfm --mca async_mpi_finalize 1 --oversubscribe --bind-to none)
else
  SINEW_MPIRUN=$(command -v mpirun || true)
  SINEW_MPIRUN_FLAGS=(--oversubscribe --bind-to none)
fi
if [ "$(id -u)" -eq 0 ]; then
  SINEW_MPIRUN_FLAGS+=(--allow-run-as-root)
fi
