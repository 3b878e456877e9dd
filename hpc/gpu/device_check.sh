#!/usr/bin/env bash
# The GPU checks of Sinew, in two halves, for a GPU machine that cannot build Sinew itself (it lacks Open
# MPI with ULFM, HDF5 and Boost, and reaches no package registry):
#
#   bash hpc/gpu/device_check.sh bundle   here, on the build machine (no GPU needed): builds the GPU tests,
#                                         sinew-train and sinew-bench for Hopper (sm_90) and Ampere (sm_80)
#                                         into build-gpu/, then copies them with every shared library they
#                                         need that is not glibc or libstdc++ into .gpu-bundle/ (< 64 MiB)
#   bash hpc/gpu/device_check.sh run      on the GPU machine, from the repository root with .gpu-bundle/
#                                         beside it: runs the `cuda` tests, prints the single-GPU allreduce
#                                         table (nccl-tests format) next to the CPU path, and the training
#                                         step time on the GPU vs the CPU; RESULT lines sum it up
#
# The GPU machine must have the CUDA driver, cuBLAS 13 and NCCL 2 (libnccl.so.2; the wheel nvidia-nccl-cu13
# of a PyTorch installation will do): `run` looks for them in /usr/local/cuda, /usr/local/nvidia and the
# site-packages of python3. Output also goes to $OUT/device_check.log when OUT is set.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bundle="$root/.gpu-bundle"
mode=${1:-}

if [ "$mode" = bundle ]; then
  set -e
  . "$root/mpi_scripts/env.sh"
  export SINEW_BUILD_DIR="$root/build-gpu"
  # Portable host code (the GPU machine's CPU is not this one), GPU code for sm_80 and sm_90.
  SINEW_BUILD_TARGETS="sinew-train sinew-bench sinew_cuda_tests nccl_gpu_test" \
    bash "$root/mpi_scripts/build.sh" -DSINEW_WITH_CUDA=ON -DSINEW_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    ${SINEW_GPU_CMAKE_ARGS:-}
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/lib"
  for exe in apps/sinew-train apps/sinew-bench tests/cuda/sinew_cuda_tests tests/mpi/nccl_gpu_test; do
    cp "$SINEW_BUILD_DIR/$exe" "$bundle/bin/"
    strip --strip-debug "$bundle/bin/$(basename "$exe")"
  done
  # Every library the programs load, except the C library's own and the C++ runtime (the GPU machine's
  # are newer, and newer ones run older programs).
  for exe in "$bundle"/bin/*; do ldd "$exe"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcublas|libcublasLt|libcudart|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
  # Open MPI's help texts, so that its messages are readable there.
  mkdir -p "$bundle/share" && cp -r "$SINEW_MPI_PREFIX/share/openmpi" "$SINEW_MPI_PREFIX/share/pmix" "$bundle/share/"
  du -sh "$bundle"
  size_mb=$(du -sm "$bundle" | cut -f1)
  [ "$size_mb" -lt 60 ] || { echo "device_check: bundle is ${size_mb} MiB, over the 60 MiB that may travel" >&2; exit 1; }
  echo "device_check: bundle ready in .gpu-bundle ($size_mb MiB)"
  exit 0
fi

if [ "$mode" != run ]; then
  echo "usage: $0 bundle|run (see the comment at the top)" >&2
  exit 2
fi

cd "$root"
bundle=.gpu-bundle  # relative, so that the log names no machine's paths
[ -d "$bundle/bin" ] || { echo "device_check: no .gpu-bundle here; run '$0 bundle' on the build machine first" >&2; exit 2; }
log=${OUT:+$OUT/device_check.log}
log=${log:-/dev/null}
exec > >(tee "$log") 2>&1

# The CUDA and NCCL libraries of this machine.
libdirs="$bundle/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$d" ] && libdirs="$libdirs:$d"
done
for pattern in 'nvidia/nccl/lib' 'nvidia/cublas/lib' 'nvidia/cu13/lib'; do
  for d in $(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    [ -d "$d/$pattern" ] && libdirs="$libdirs:$d/$pattern"
  done
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$bundle" PMIX_PREFIX="$bundle"  # help texts only: the MPI components are built in
export OMPI_MCA_btl=self,vader OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nccl_pip=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl_pip" ] && [ -d "$nccl_pip" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_pip"
nccl=$(for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d"/libnccl.so.2 2>/dev/null; done | head -1)
[ -n "$nccl" ] && export SINEW_NCCL_LIBRARY="$nccl"

failures=0
step() {  # step NAME TIMEOUT_S COMMAND...: runs it, prints RESULT NAME passed|FAILED (rc)
  local name=$1 limit=$2
  shift 2
  echo
  echo "=== $name: $*"
  timeout "$limit" "$@"
  local rc=$?
  if [ $rc -eq 0 ]; then echo "RESULT $name passed"; else echo "RESULT $name FAILED (rc $rc)"; failures=$((failures + 1)); fi
}

echo "=== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "NCCL library: ${nccl:-not found}"
bin="$bundle/bin"
tmp=$(mktemp -d)
step cuda_tests 150 "$bin/sinew_cuda_tests" --gtest_brief=1
step nccl_gpu_test 90 "$bin/nccl_gpu_test"
step allreduce_nccl_vs_cpu 120 "$bin/sinew-bench" allreduce --impl nccl --max-bytes $((256 << 20)) --iters 20
for spec in "mlp 64 200" "mlp:2048,2048 1024 30"; do
  set -- $spec
  for device in cpu cuda; do
    step "train_step_${device}_$1_b$2" 120 "$bin/sinew-bench" train-step --device "$device" --dataset synthetic \
      --model "$1" --batch-size "$2" --steps "$3" --warmup 5
  done
done
# Whole runs: the CPU reference, the GPU with a checkpoint at every 40 steps and the end, a resume of that
# checkpoint for a second epoch (TrainState -> to_device), and ByteGrad's GPU path.
common=(--dataset synthetic --progress false --log-every 1000)
step train_cpu 120 "$bin/sinew-train" --device cpu --epochs 2 "${common[@]}" --metrics "$tmp/cpu.jsonl"
step train_cuda 120 "$bin/sinew-train" --device cuda --epochs 1 "${common[@]}" --metrics "$tmp/cuda.jsonl" \
  --checkpoint-dir "$tmp/ckpt" --checkpoint-every 40
step train_cuda_resume 120 "$bin/sinew-train" --device cuda --epochs 2 "${common[@]}" --metrics "$tmp/cuda.jsonl" \
  --checkpoint-dir "$tmp/ckpt" --resume auto
step train_cuda_bytegrad 120 "$bin/sinew-train" --device cuda --algorithm bytegrad --epochs 1 "${common[@]}" \
  --metrics "$tmp/bytegrad.jsonl"
# Sharded optimiser state on the GPU (docs/sharding.md#on-a-gpu), one rank (NCCL puts no two ranks of a
# communicator on one GPU): the update on the host, the gradients down and the parameters up, the gather and
# (gradients) the reduce-scatter over NCCL in device memory.
step train_cuda_shard_optimizer 120 "$bin/sinew-train" --device cuda --shard optimizer --epochs 1 "${common[@]}" \
  --metrics "$tmp/shard-optimizer.jsonl"
step train_cuda_shard_gradients 120 "$bin/sinew-train" --device cuda --shard gradients --epochs 1 "${common[@]}" \
  --metrics "$tmp/shard-gradients.jsonl"
echo
echo "=== done lines (test accuracy: CPU 2 epochs, GPU 1 epoch + resumed 2nd epoch, ByteGrad on GPU 1 epoch,"
echo "    sharded optimizer and gradients on GPU 1 epoch each)"
grep -h '"event":"done"' "$tmp/cpu.jsonl" "$tmp/cuda.jsonl" "$tmp/bytegrad.jsonl" "$tmp/shard-optimizer.jsonl" \
  "$tmp/shard-gradients.jsonl"
[ -n "${OUT:-}" ] && cp "$tmp"/*.jsonl "$OUT/" 2>/dev/null
echo
echo "device_check: $failures step(s) failed"
[ "$failures" -eq 0 ]
