#!/usr/bin/env bash
# Sinew set-up for Debian 12 (bookworm).
#
#   1. installs the Debian packages Sinew builds and runs with;
#   2. builds Open MPI 5 with ULFM (fault tolerance) from Debian's own source package
#      into a cached prefix outside the checkout, and reuses it when it is already there.
#
# Idempotent: a second run checks what is there and does nothing else.
#
# Environment:
#   SINEW_MPI_PREFIX   where the ULFM Open MPI lives (default /opt/sinew/openmpi-ulfm)
#   SINEW_SKIP_ULFM=1  do not build Open MPI 5; Sinew then builds against Debian's Open MPI 4
#                      (no in-place recovery, see docs/architecture.md)
#   SINEW_TORCH_VENV   where Torch, torchvision and pybind11 from PyPI live (default /opt/sinew/torch-venv)
#   SINEW_SKIP_TORCH=1 do not install them (Sinew then builds without its PyTorch integration)
#   SINEW_WITH_TORCH=1 also install Debian's python3-torch 1.13 (the fallback when PyPI is out of reach)
#   SINEW_JOBS         parallel make jobs (default: nproc)
set -euo pipefail

prefix=${SINEW_MPI_PREFIX:-/opt/sinew/openmpi-ulfm}
ompi_version=5.0.7
jobs=${SINEW_JOBS:-$(nproc)}

say() { printf '[sinew-setup] %s\n' "$*"; }
die() { printf '[sinew-setup] error: %s\n' "$*" >&2; exit 1; }

# --- where are we ------------------------------------------------------------------------------
if [ -r /etc/os-release ]; then
  . /etc/os-release
else
  ID=unknown VERSION_ID=unknown
fi
if [ "${ID:-}" != debian ] || [ "${VERSION_ID:-}" != 12 ]; then
  die "this script supports Debian 12 (bookworm); found ${PRETTY_NAME:-an unknown system}.
  On another system install by hand: a C++20 compiler, CMake >= 3.20, HDF5 (serial), Boost.Program_options,
  Eigen 3, GoogleTest, spdlog, fmt, nlohmann-json, zlib, and an MPI; for in-place recovery Open MPI >= 5
  configured with --with-ft=ulfm. Then configure with -DMPI_HOME=<that MPI's prefix>."
fi
sudo=
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    die "installing Debian packages needs root. Run it as root, or with password-less sudo,
  or ask an administrator to run: $0"
  fi
fi

# --- Debian packages -----------------------------------------------------------------------------
packages=(
  build-essential cmake pkg-config git ca-certificates dpkg-dev
  libhdf5-dev hdf5-tools zlib1g-dev
  libisal-dev  # ISA-L: the hardware (PCLMUL) CRC32 of checkpoint files, zlib-compatible
  libboost-program-options-dev libeigen3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev
  dataset-fashion-mnist
  openmpi-bin libopenmpi-dev
  libhwloc-dev libevent-dev flex perl
  python3 python3-numpy python3-matplotlib
  python3-venv python3-dev  # the virtual environment of Torch from PyPI; Python.h for the sinew package
  python3-h5py  # the test that reads a checkpoint with h5py and numpy alone
  clang libclang-rt-14-dev
  iproute2  # ip and tc: the shaped test bed (hpc/net/) of the benchmarks and the net.* tests
  slurm-wlm munge  # the local Slurm cluster (hpc/slurm/local-slurm.sh) of the slurm.* tests
  lmod  # `module load sinew` (the installed modulefile), tested by the install test
  glusterfs-server glusterfs-client  # the GlusterFS volume (hpc/pfs/glusterfs.sh) of the pfs.* tests
  # distillation: the teacher service (gRPC), its registry (etcd, reached through libcurl)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libcurl4-openssl-dev
  etcd-server etcd-client
  libsimgrid-dev  # the scale model (hpc/sim/, SimGrid's S4U) and its sim.calibration test
  libjemalloc-dev  # sinew-sim's allocator: SimGrid allocates per activity, glibc's malloc costs it 20-30 %
)
if [ "${SINEW_WITH_TORCH:-0}" = 1 ]; then
  packages+=(python3-torch libopenblas0)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "Debian packages: all present"
fi

# --- Torch, torchvision and pybind11 from PyPI -------------------------------------------------------
# Into a virtual environment in a cached prefix (as Open MPI below), made from Debian's python3 with the
# system packages visible (numpy, h5py and matplotlib stay Debian's). PyPI's Linux wheel of Torch is a CUDA
# build (about 5 GB with its nvidia-* wheels) that runs on the CPU as well. Measured on a fresh machine:
# see the README. Without PyPI, Debian's python3-torch 1.13 (SINEW_WITH_TORCH=1) is too old for the
# integration (it needs >= 2.1); Sinew then builds without it.
torch_venv=${SINEW_TORCH_VENV:-/opt/sinew/torch-venv}
torch_spec=${SINEW_TORCH_SPEC:-"torch>=2.1 torchvision pybind11>=2.12"}
torch_ok() {
  [ -x "$torch_venv/bin/python" ] && [ -e "$torch_venv/.sinew-complete" ] &&
    "$torch_venv/bin/python" -c "import torch, torchvision, pybind11
assert tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]) >= (2, 1)" 2>/dev/null
}
if [ "${SINEW_SKIP_TORCH:-0}" = 1 ]; then
  say "SINEW_SKIP_TORCH=1: no Torch (the PyTorch integration is not built)"
elif torch_ok; then
  say "Torch $("$torch_venv/bin/python" -c 'import torch; print(torch.__version__)'): present in $torch_venv"
else
  say "installing $torch_spec from PyPI into $torch_venv (about 5 GB)"
  start=$(date +%s)
  # The marker file is written last, so an interrupted install never looks complete (torch_ok).
  $sudo rm -rf "$torch_venv"
  $sudo mkdir -p "$(dirname "$torch_venv")"
  $sudo /usr/bin/python3 -m venv --system-site-packages "$torch_venv"
  # shellcheck disable=SC2086  # the spec is a list of requirements
  if $sudo "$torch_venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
       $torch_spec; then
    $sudo touch "$torch_venv/.sinew-complete"
    torch_ok || die "Torch was installed into $torch_venv but cannot be imported"
    say "Torch $("$torch_venv/bin/python" -c 'import torch; print(torch.__version__)') ready in $torch_venv" \
        "($(( $(date +%s) - start )) s, $(du -sh "$torch_venv" | cut -f1))"
  else
    $sudo rm -rf "$torch_venv"
    say "warning: PyPI could not be reached or refused the install; building without the PyTorch" \
        "integration (set SINEW_SKIP_TORCH=1 to silence this)"
  fi
fi

# --- Open MPI 5 with ULFM ------------------------------------------------------------------------
# A usable prefix: Open MPI 5.x whose ompi_info reports ULFM ("FT MPI support: yes").
ulfm_ok() {
  [ -x "$prefix/bin/ompi_info" ] || return 1
  "$prefix/bin/ompi_info" --parsable 2>/dev/null | grep -q '^ompi:version:full:5\.' || return 1
  "$prefix/bin/ompi_info" 2>/dev/null | grep -q -E 'FT MPI support: yes' || return 1
}

if [ "${SINEW_SKIP_ULFM:-0}" = 1 ]; then
  say "SINEW_SKIP_ULFM=1: using Debian's Open MPI $(mpirun --version 2>/dev/null | head -n1 | awk '{print $NF}') (no in-place recovery)"
  exit 0
fi
if ulfm_ok; then
  say "Open MPI $("$prefix/bin/ompi_info" --parsable | sed -n 's/^ompi:version:full://p') with ULFM: present in $prefix"
  exit 0
fi

say "building Open MPI $ompi_version with ULFM into $prefix (about 15 min on 2 cores)"
work=$(mktemp -d "${TMPDIR:-/tmp}/sinew-ompi.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Debian's source package comes from trixie; a private apt configuration keeps /etc/apt untouched.
# The mirror is the one this machine already uses.
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
         | grep -v -- '-security' | head -n1 || true)
if [ -z "$mirror" ] && [ -r /etc/apt/sources.list ]; then
  mirror=$(awk '$1=="deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || die "could not find a Debian mirror in /etc/apt; set one in /etc/apt/sources.list.d/debian.sources"
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$work/apt/sources.list"
aptopts=(-o APT::Sandbox::User=root -o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=-"
         -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -qq)
say "fetching Debian's openmpi source package (trixie) from $mirror"
apt-get "${aptopts[@]}" update
( cd "$work/src" && apt-get "${aptopts[@]}" source --download-only "openmpi=$ompi_version*" >/dev/null 2>&1 ) \
  || ( cd "$work/src" && apt-get "${aptopts[@]}" source --download-only openmpi >/dev/null )
orig=$(ls "$work"/src/openmpi_*.orig.tar.* 2>/dev/null | head -n1)
[ -n "$orig" ] || die "no openmpi source tarball was downloaded"
say "unpacking $(basename "$orig")"
tar -C "$work/src" -xf "$orig"
srcdir=$(find "$work/src" -maxdepth 1 -type d -name 'openmpi-*' | head -n1)
[ -n "$srcdir" ] || die "unexpected layout of $(basename "$orig")"
got=$(sed -n 's/^major=//p;s/^minor=//p;s/^release=//p' "$srcdir/VERSION" | paste -sd.)
[ "$got" = "$ompi_version" ] || say "note: Debian ships Open MPI $got (expected $ompi_version); building it"
ompi_version=$got

say "configuring (log: $work/configure.log)"
( cd "$srcdir" && ./configure --prefix="$prefix" \
    --with-ft=ulfm --with-pmix=internal --with-prrte=internal \
    --with-hwloc=external --with-libevent=external \
    --disable-mpi-fortran --disable-oshmem --disable-io-romio --disable-mpi-java \
    --without-ucx --without-ofi --without-verbs --without-psm2 --without-cuda --disable-sphinx \
    --enable-shared --disable-static >"$work/configure.log" 2>&1 ) \
  || { tail -n 40 "$work/configure.log" >&2; die "Open MPI configure failed"; }
say "compiling with $jobs jobs (log: $work/make.log)"
start=$(date +%s)
( cd "$srcdir" && make -j"$jobs" >"$work/make.log" 2>&1 ) &
mk=$!
while kill -0 $mk 2>/dev/null; do
  sleep 60
  kill -0 $mk 2>/dev/null && say "  still compiling ($(( ($(date +%s) - start) / 60 )) min, $(grep -c '^  CC' "$work/make.log" || true) files)"
done
wait $mk || { tail -n 40 "$work/make.log" >&2; die "Open MPI build failed"; }
say "installing into $prefix"
$sudo mkdir -p "$(dirname "$prefix")"
# Install into a staging prefix first and move it into place, so an interrupted install never looks complete.
rm -rf "$prefix.partial"
( cd "$srcdir" && $sudo make install DESTDIR="$prefix.partial" >"$work/install.log" 2>&1 ) \
  || { tail -n 20 "$work/install.log" >&2; die "Open MPI install failed"; }
$sudo rm -rf "$prefix"
$sudo mv "$prefix.partial$prefix" "$prefix"
$sudo rm -rf "$prefix.partial"
ompi_version=$("$prefix/bin/ompi_info" --parsable | sed -n 's/^ompi:version:full://p')
ulfm_ok || die "the built Open MPI in $prefix does not report FT support; see $work/configure.log"
say "Open MPI $ompi_version with ULFM ready in $prefix ($(( ($(date +%s) - start) / 60 )) min)"
