// The device model's kernels. Plain grid-stride loops: these are memory-bound element-wise passes
// (cuBLAS does the matrix products), and one thread per element or per sample keeps them obviously
// correct. Arithmetic follows the CPU code (model/layers.cpp, model/loss.cpp, optim/optimizer.cpp) in
// float, with expf/logf/sqrtf and IEEE division (nvcc's defaults; no fast math).
#include <cuda_runtime.h>

#include <cstdint>

#include "sinew/model/cuda/kernels.hpp"

namespace sinew::model::cuda::detail {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::size_t kMaxBlocks = 65535;  // grid-stride loops cover the rest

unsigned blocks_for(std::size_t work) {
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void bias_add_kernel(float* __restrict__ y, const float* __restrict__ b, int rows,
                                std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride())
    y[i] += b[i % static_cast<std::size_t>(rows)];
}

/// One thread per row, summing the row's entries column by column: neighbouring threads read neighbouring
/// rows of a column, so the reads coalesce.
__global__ void bias_grad_kernel(const float* __restrict__ dy, int rows, std::size_t cols,
                                 float* __restrict__ db, bool accumulate) {
  const auto r_count = static_cast<std::size_t>(rows);
  for (std::size_t r = first_index(); r < r_count; r += grid_stride()) {
    float sum = 0.f;
    for (std::size_t c = 0; c < cols; ++c) sum += dy[c * r_count + r];
    db[r] = accumulate ? db[r] + sum : sum;
  }
}

__global__ void relu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) y[i] = fmaxf(x[i], 0.f);
}

__global__ void relu_backward_kernel(const float* __restrict__ y, const float* __restrict__ dy,
                                     float* __restrict__ dx, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

/// Column maximum, and the first index holding it.
__device__ void column_max(const float* z, int classes, float& zmax, int& best) {
  zmax = z[0];
  best = 0;
  for (int k = 1; k < classes; ++k) {
    if (z[k] > zmax) {
      zmax = z[k];
      best = k;
    }
  }
}

/// One thread per sample, as model::softmax_cross_entropy: exp(z - zmax) in (0, 1] (no overflow), its sum
/// >= 1, loss = log(sum) + zmax - z[label] in double, dlogits = exp(z - zmax) * (scale / sum), minus scale
/// at the label.
__global__ void softmax_xent_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ labels,
                                    int classes, std::size_t n, float scale, float* __restrict__ dlogits,
                                    double* __restrict__ sample_loss) {
  for (std::size_t c = first_index(); c < n; c += grid_stride()) {
    const float* z = logits + c * static_cast<std::size_t>(classes);
    float* d = dlogits + c * static_cast<std::size_t>(classes);
    float zmax = 0.f;
    int best = 0;
    column_max(z, classes, zmax, best);
    float sum = 0.f;
    for (int k = 0; k < classes; ++k) {
      d[k] = expf(z[k] - zmax);
      sum += d[k];
    }
    const int label = labels[c];
    sample_loss[c] =
        static_cast<double>(logf(sum)) + static_cast<double>(zmax) - static_cast<double>(z[label]);
    const float f = scale / sum;
    for (int k = 0; k < classes; ++k) d[k] *= f;
    d[label] -= scale;
  }
}

__global__ void loss_and_correct_kernel(const float* __restrict__ logits,
                                        const std::int32_t* __restrict__ labels, int classes, std::size_t n,
                                        double* __restrict__ sample_loss, double* __restrict__ correct) {
  for (std::size_t c = first_index(); c < n; c += grid_stride()) {
    const float* z = logits + c * static_cast<std::size_t>(classes);
    float zmax = 0.f;
    int best = 0;
    column_max(z, classes, zmax, best);
    float sum = 0.f;
    for (int k = 0; k < classes; ++k) sum += expf(z[k] - zmax);
    const int label = labels[c];
    sample_loss[c] =
        static_cast<double>(logf(sum)) + static_cast<double>(zmax) - static_cast<double>(z[label]);
    correct[c] = best == label ? 1.0 : 0.0;
  }
}

/// One block: per-thread partial sums, then a tree in shared memory. Launched with kThreads threads.
__global__ void sum_kernel(const double* __restrict__ v, std::size_t n, double* __restrict__ sum) {
  __shared__ double partial[kThreads];
  double s = 0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *sum = partial[0];
}

/// optim::Sgd::step, element by element; kVariant 0: no momentum, 1: momentum, 2: Nesterov.
template <int kVariant>
__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf,
                           std::size_t n, float lr, float m, float wd) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    if constexpr (kVariant == 0) {
      p[i] -= lr * (g[i] + wd * p[i]);
    } else if constexpr (kVariant == 2) {
      const float d = g[i] + wd * p[i];
      const float b = m * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * (d + m * b);
    } else {
      const float b = m * buf[i] + (g[i] + wd * p[i]);
      buf[i] = b;
      p[i] -= lr * b;
    }
  }
}

/// optim::Adam::step, element by element, in PyTorch's order of operations.
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, std::size_t n, float step_size, float bc2_sqrt, float b1,
                            float b2, float eps, float wd) {
  const float c1 = 1.f - b1, c2 = 1.f - b2;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float d = g[i] + wd * p[i];
    const float mi = b1 * m[i] + c1 * d;
    const float vi = b2 * v[i] + c2 * d * d;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
  }
}

}  // namespace

void launch_bias_add(float* y, const float* b, int rows, std::size_t cols, cudaStream_t s) {
  const std::size_t count = static_cast<std::size_t>(rows) * cols;
  bias_add_kernel<<<blocks_for(count), kThreads, 0, s>>>(y, b, rows, count);
}

void launch_bias_grad(const float* dy, int rows, std::size_t cols, float* db, bool accumulate,
                      cudaStream_t s) {
  bias_grad_kernel<<<blocks_for(static_cast<std::size_t>(rows)), kThreads, 0, s>>>(dy, rows, cols, db,
                                                                                   accumulate);
}

void launch_relu_forward(const float* x, float* y, std::size_t count, cudaStream_t s) {
  relu_forward_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, y, count);
}

void launch_relu_backward(const float* y, const float* dy, float* dx, std::size_t count, cudaStream_t s) {
  relu_backward_kernel<<<blocks_for(count), kThreads, 0, s>>>(y, dy, dx, count);
}

void launch_softmax_xent(const float* logits, const std::int32_t* labels, int classes, std::size_t n,
                         float scale, float* dlogits, double* sample_loss, cudaStream_t s) {
  softmax_xent_kernel<<<blocks_for(n), kThreads, 0, s>>>(logits, labels, classes, n, scale, dlogits,
                                                         sample_loss);
}

void launch_loss_and_correct(const float* logits, const std::int32_t* labels, int classes, std::size_t n,
                             double* sample_loss, double* correct, cudaStream_t s) {
  loss_and_correct_kernel<<<blocks_for(n), kThreads, 0, s>>>(logits, labels, classes, n, sample_loss,
                                                             correct);
}

void launch_sum(const double* v, std::size_t n, double* sum, cudaStream_t s) {
  sum_kernel<<<1, kThreads, 0, s>>>(v, n, sum);
}

void launch_sgd(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum,
                float weight_decay, int variant, cudaStream_t s) {
  const unsigned blocks = blocks_for(n);
  if (variant == 0) {
    sgd_kernel<0><<<blocks, kThreads, 0, s>>>(p, g, buf, n, lr, momentum, weight_decay);
  } else if (variant == 2) {
    sgd_kernel<2><<<blocks, kThreads, 0, s>>>(p, g, buf, n, lr, momentum, weight_decay);
  } else {
    sgd_kernel<1><<<blocks, kThreads, 0, s>>>(p, g, buf, n, lr, momentum, weight_decay);
  }
}

void launch_adam(float* p, const float* g, float* m, float* v, std::size_t n, float step_size, float bc2_sqrt,
                 float beta1, float beta2, float eps, float weight_decay, cudaStream_t s) {
  adam_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, step_size, bc2_sqrt, beta1, beta2, eps,
                                                 weight_decay);
}

}  // namespace sinew::model::cuda::detail
