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
  # failure (docs/architecture.md). coll ^han: the hierarchical collectives (chosen with several ranks on
  # each of several nodes) drop their sub-collectives' errors and return MPI_SUCCESS (open-mpi/ompi#11794):
  # with a node lost, its survivors completed a step without the lost node's gradients (the audit showed
  # its samples missing). The tuned collectives report the failure.
  SINEW_MPIRUN_FLAGS=(--with-ft ulfm --mca async_mpi_finalize 1 --mca coll ^han --oversubscribe --bind-to none)
else
  SINEW_MPIRUN=$(command -v mpirun || true)
  SINEW_MPIRUN_FLAGS=(--oversubscribe --bind-to none)
fi
if [ "$(id -u)" -eq 0 ]; then
  SINEW_MPIRUN_FLAGS+=(--allow-run-as-root)
fi
