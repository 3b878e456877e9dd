// Launchers of the device model's kernels (kernels.cu), for device_model.cpp. Kept apart so that nvcc
// compiles only kernels and the CUDA runtime; checks and messages stay in host C++. Each launcher only
// enqueues work on `s` and returns; the caller checks the launch (cuda::check_last_launch). Callers
// guarantee non-empty work (every count >= 1). Matrices are column-major with one column per sample.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sinew::model::cuda::detail {

/// y(r, c) += b(r) for a rows x cols matrix y.
void launch_bias_add(float* y, const float* b, int rows, std::size_t cols, cudaStream_t s);
/// db(r) = sum_c dy(r, c), or db(r) += that sum if `accumulate`.
void launch_bias_grad(const float* dy, int rows, std::size_t cols, float* db, bool accumulate,
                      cudaStream_t s);
/// y = max(x, 0) over `count` elements.
void launch_relu_forward(const float* x, float* y, std::size_t count, cudaStream_t s);
/// dx = dy where y > 0, else 0 (the gradient at 0 is 0, as model::ReLU).
void launch_relu_backward(const float* y, const float* dy, float* dx, std::size_t count, cudaStream_t s);

/// Softmax cross-entropy of the classes x n logits against labels (all in [0, classes)), as
/// model::softmax_cross_entropy: dlogits = (softmax - onehot) * scale (scale = 1 / denominator, rounded to
/// float as the CPU does), sample_loss(c) = -log softmax(z_c)[label_c] in double.
void launch_softmax_xent(const float* logits, const std::int32_t* labels, int classes, std::size_t n,
                         float scale, float* dlogits, double* sample_loss, cudaStream_t s);
/// sample_loss(c) as above, and correct(c) = 1 if argmax(z_c) (first maximum on ties) is the label, else 0.
void launch_loss_and_correct(const float* logits, const std::int32_t* labels, int classes, std::size_t n,
                             double* sample_loss, double* correct, cudaStream_t s);
/// *sum = sum of the n values at v (one block, in double). n may be 0.
void launch_sum(const double* v, std::size_t n, double* sum, cudaStream_t s);

/// SGD, as optim::Sgd::step: variant 0 without momentum (buf unused), 1 momentum, 2 Nesterov.
void launch_sgd(float* p, const float* g, float* buf, std::size_t n, float lr, float momentum,
                float weight_decay, int variant, cudaStream_t s);
/// Adam, as optim::Adam::step, with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t) computed
/// on the host in double as the CPU does.
void launch_adam(float* p, const float* g, float* m, float* v, std::size_t n, float step_size, float bc2_sqrt,
                 float beta1, float beta2, float eps, float weight_decay, cudaStream_t s);

}  // namespace sinew::model::cuda::detail
