#include "sinew/model/layers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sinew/core/error.hpp"

namespace sinew::model {

namespace {

using MatMap = Eigen::Map<Matrix>;
using ConstMatMap = Eigen::Map<const Matrix>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;

std::string shape_str(const Shape& s) { return fmt::format("{}x{}x{}", s.channels, s.height, s.width); }

void check_shape(const Shape& s, const char* layer) {
  if (s.channels < 1 || s.height < 1 || s.width < 1) {
    SINEW_THROW(InvalidArgument, "{}: input shape {} has a non-positive dimension", layer, shape_str(s));
  }
}

/// PyTorch's default init for Linear and Conv2d (kaiming_uniform with a = sqrt(5), and the matching bias
/// bound): every parameter ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void init_uniform(std::span<float> params, std::size_t fan_in, Rng& rng) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  for (float& p : params) p = rng.symmetric(bound);
}

}  // namespace

// --- Linear ------------------------------------------------------------------------------------------------

Linear::Linear(const Shape& input, int out_features) : Layer(input), in_(input.size()), out_(out_features) {
  check_shape(input, "linear");
  if (out_features < 1)
    SINEW_THROW(InvalidArgument, "linear: out_features must be >= 1, got {}", out_features);
  output_ = Shape{out_features, 1, 1};
}

std::string Linear::describe() const { return fmt::format("linear {} -> {}", in_, out_); }

std::size_t Linear::num_params() const {
  return static_cast<std::size_t>(out_) * static_cast<std::size_t>(in_) + static_cast<std::size_t>(out_);
}

std::vector<TensorView> Linear::param_views() const {
  const auto in = static_cast<std::size_t>(in_), out = static_cast<std::size_t>(out_);
  return {{"weight",
           "params",
           0,
           {in, out},
           "y = x @ weight + bias, x the input sample flattened in C order (channel, row, column); weight "
           "is (in, out): the transpose of PyTorch's nn.Linear weight"},
          {"bias", "params", in * out, {out}, "y = x @ weight + bias"}};
}

void Linear::init_params(std::span<float> params, Rng& rng) const {
  init_uniform(params, static_cast<std::size_t>(in_), rng);
}

void Linear::forward(const Matrix& x, std::span<const float> params, Matrix& y) {
  const ConstMatMap w(params.data(), out_, in_);
  const ConstVecMap b(params.data() + static_cast<std::ptrdiff_t>(out_) * in_, out_);
  y.resize(out_, x.cols());
  y.noalias() = w * x;
  y.colwise() += b;
}

void Linear::backward_params(const Matrix& x, const Matrix& /*y*/, const Matrix& dy, std::span<float> grads,
                             bool accumulate) {
  MatMap dw(grads.data(), out_, in_);
  VecMap db(grads.data() + static_cast<std::ptrdiff_t>(out_) * in_, out_);
  if (accumulate) {
    dw.noalias() += dy * x.transpose();
    db.noalias() += dy.rowwise().sum();
  } else {
    dw.noalias() = dy * x.transpose();
    db.noalias() = dy.rowwise().sum();
  }
}

void Linear::backward_input(const Matrix& x, const Matrix& /*y*/, const Matrix& dy,
                            std::span<const float> params, Matrix& dx) {
  const ConstMatMap w(params.data(), out_, in_);
  dx.resize(in_, x.cols());
  dx.noalias() = w.transpose() * dy;
}

// --- Conv2d ------------------------------------------------------------------------------------------------

Conv2d::Conv2d(const Shape& input, int out_channels, int kernel, int padding)
    : Layer(input), kernel_(kernel), padding_(padding) {
  check_shape(input, "conv2d");
  if (out_channels < 1 || kernel < 1 || padding < 0) {
    SINEW_THROW(InvalidArgument, "conv2d: need out_channels >= 1, kernel >= 1, padding >= 0; got {}, {}, {}",
                out_channels, kernel, padding);
  }
  output_ =
      Shape{out_channels, input.height + 2 * padding - kernel + 1, input.width + 2 * padding - kernel + 1};
  if (output_.height < 1 || output_.width < 1) {
    SINEW_THROW(InvalidArgument, "conv2d: a {}x{} kernel with padding {} does not fit input {}", kernel,
                kernel, padding, shape_str(input));
  }
}

std::string Conv2d::describe() const {
  return fmt::format("conv2d {}x{} pad {}, {} -> {} channels", kernel_, kernel_, padding_, input_.channels,
                     output_.channels);
}

std::size_t Conv2d::num_params() const {
  const auto k = static_cast<std::size_t>(kernel_);
  const auto out = static_cast<std::size_t>(output_.channels);
  return out * static_cast<std::size_t>(input_.channels) * k * k + out;
}

std::vector<TensorView> Conv2d::param_views() const {
  const auto k = static_cast<std::size_t>(kernel_);
  const auto in = static_cast<std::size_t>(input_.channels), out = static_cast<std::size_t>(output_.channels);
  // W is out x (in*k*k) column-major with column (ci*k + ky)*k + kx: in C order, (ci, ky, kx, o).
  return {
      {"weight",
       "params",
       0,
       {in, k, k, out},
       fmt::format("y[o, i, j] = bias[o] + sum over c, ky, kx of weight[c, ky, kx, o] * "
                   "x[c, i + ky - {0}, j + kx - {0}] (stride 1, zero padding {0}: PyTorch's "
                   "cross-correlation); weight is (in_channels, kh, kw, out_channels): PyTorch's "
                   "nn.Conv2d weight is weight.transpose(3, 0, 1, 2)",
                   padding_)},
      {"bias", "params", out * in * k * k, {out}, "added to output channel o: y[o, i, j] = ... + bias[o]"}};
}

HyperParams Conv2d::hyper_params() const {
  return {{"kernel", kernel_}, {"padding", padding_}, {"stride", 1}};
}

void Conv2d::init_params(std::span<float> params, Rng& rng) const {
  init_uniform(params, static_cast<std::size_t>(input_.channels) * kernel_ * kernel_, rng);
}

std::pair<int, int> Conv2d::valid_columns(int kx) const {
  // Output column ox reads input column ox + kx - padding, which must lie in [0, width).
  const int ow = output_.width;
  const int lo = std::min(std::max(0, padding_ - kx), ow);
  const int hi = std::max(lo, std::min(ow, input_.width + padding_ - kx));
  return {lo, hi};
}

Eigen::Index Conv2d::chunk_size(Eigen::Index batch) const {
  // About kScratch floats of patches per chunk: large enough that GEMM packing overheads vanish, small
  // enough to stay in cache.
  constexpr Eigen::Index kScratch = Eigen::Index{1} << 18;
  const Eigen::Index per_sample =
      static_cast<Eigen::Index>(output_.height) * output_.width * input_.channels * kernel_ * kernel_;
  return std::clamp<Eigen::Index>(kScratch / per_sample, 1, std::max<Eigen::Index>(batch, 1));
}

void Conv2d::im2col(const float* sample, float* col, Eigen::Index ld) const {
  const int h = input_.height, w = input_.width, oh = output_.height, ow = output_.width;
  for (int c = 0; c < input_.channels; ++c) {
    const float* in = sample + static_cast<std::ptrdiff_t>(c) * h * w;
    for (int ky = 0; ky < kernel_; ++ky) {
      for (int kx = 0; kx < kernel_; ++kx) {
        float* out = col + ((static_cast<std::ptrdiff_t>(c) * kernel_ + ky) * kernel_ + kx) * ld;
        const auto [lo, hi] = valid_columns(kx);
        for (int oy = 0; oy < oh; ++oy, out += ow) {
          const int iy = oy + ky - padding_;
          if (iy < 0 || iy >= h) {
            std::fill(out, out + ow, 0.f);
            continue;
          }
          const float* src = in + static_cast<std::ptrdiff_t>(iy) * w + (lo + kx - padding_);
          std::fill(out, out + lo, 0.f);
          std::copy(src, src + (hi - lo), out + lo);
          std::fill(out + hi, out + ow, 0.f);
        }
      }
    }
  }
}

void Conv2d::col2im(const float* col, Eigen::Index ld, float* sample) const {
  const int h = input_.height, w = input_.width, oh = output_.height, ow = output_.width;
  for (int c = 0; c < input_.channels; ++c) {
    float* in = sample + static_cast<std::ptrdiff_t>(c) * h * w;
    for (int ky = 0; ky < kernel_; ++ky) {
      for (int kx = 0; kx < kernel_; ++kx) {
        const float* grad = col + ((static_cast<std::ptrdiff_t>(c) * kernel_ + ky) * kernel_ + kx) * ld;
        const auto [lo, hi] = valid_columns(kx);
        for (int oy = 0; oy < oh; ++oy, grad += ow) {
          const int iy = oy + ky - padding_;
          if (iy < 0 || iy >= h) continue;
          float* dst = in + static_cast<std::ptrdiff_t>(iy) * w + (lo + kx - padding_);
          for (int i = 0; i < hi - lo; ++i) dst[i] += grad[lo + i];
        }
      }
    }
  }
}

// For a chunk of s samples, with P = out_h*out_w and K = in_channels*k*k: col (s*P x K) stacks the samples'
// patches, and out = col * W^T (s*P x out_channels) stacks their outputs, sample i in rows [i*P, (i+1)*P).
// Column c of sample i's block is output channel c of that sample, i.e. rows [c*P, (c+1)*P) of its column
// in y (channel-major). Copying between the two layouts is cheap next to the GEMM.

void Conv2d::forward(const Matrix& x, std::span<const float> params, Matrix& y) {
  const Eigen::Index plane = static_cast<Eigen::Index>(output_.height) * output_.width;
  const Eigen::Index patch = static_cast<Eigen::Index>(input_.channels) * kernel_ * kernel_;
  const int oc = output_.channels;
  const ConstMatMap w(params.data(), oc, patch);
  const ConstVecMap b(params.data() + oc * patch, oc);
  const Eigen::Index chunk = chunk_size(x.cols());
  col_.resize(static_cast<std::size_t>(chunk * plane * patch));
  out_.resize(static_cast<std::size_t>(chunk * plane * oc));
  y.resize(output_.size(), x.cols());
  for (Eigen::Index n0 = 0; n0 < x.cols(); n0 += chunk) {
    const Eigen::Index s = std::min(chunk, x.cols() - n0), rows = s * plane;
    for (Eigen::Index i = 0; i < s; ++i) im2col(x.col(n0 + i).data(), col_.data() + i * plane, rows);
    MatMap out(out_.data(), rows, oc);
    out.noalias() = ConstMatMap(col_.data(), rows, patch) * w.transpose();
    for (Eigen::Index i = 0; i < s; ++i) {
      MatMap dst(y.col(n0 + i).data(), plane, oc);
      dst = (out.middleRows(i * plane, plane).rowwise() + b.transpose());
    }
  }
}

void Conv2d::backward_params(const Matrix& x, const Matrix& /*y*/, const Matrix& dy, std::span<float> grads,
                             bool accumulate) {
  const Eigen::Index plane = static_cast<Eigen::Index>(output_.height) * output_.width;
  const Eigen::Index patch = static_cast<Eigen::Index>(input_.channels) * kernel_ * kernel_;
  const int oc = output_.channels;
  MatMap dw(grads.data(), oc, patch);
  VecMap db(grads.data() + oc * patch, oc);
  if (!accumulate) {
    dw.setZero();
    db.setZero();
  }
  const Eigen::Index chunk = chunk_size(x.cols());
  col_.resize(static_cast<std::size_t>(chunk * plane * patch));
  out_.resize(static_cast<std::size_t>(chunk * plane * oc));
  for (Eigen::Index n0 = 0; n0 < x.cols(); n0 += chunk) {
    const Eigen::Index s = std::min(chunk, x.cols() - n0), rows = s * plane;
    // Patches are recomputed rather than kept from forward(): far less memory, and cheap next to the GEMM.
    for (Eigen::Index i = 0; i < s; ++i) im2col(x.col(n0 + i).data(), col_.data() + i * plane, rows);
    MatMap g(out_.data(), rows, oc);
    for (Eigen::Index i = 0; i < s; ++i)
      g.middleRows(i * plane, plane) = ConstMatMap(dy.col(n0 + i).data(), plane, oc);
    dw.noalias() += g.transpose() * ConstMatMap(col_.data(), rows, patch);
    db.noalias() += g.colwise().sum().transpose();
  }
}

void Conv2d::backward_input(const Matrix& x, const Matrix& /*y*/, const Matrix& dy,
                            std::span<const float> params, Matrix& dx) {
  const Eigen::Index plane = static_cast<Eigen::Index>(output_.height) * output_.width;
  const Eigen::Index patch = static_cast<Eigen::Index>(input_.channels) * kernel_ * kernel_;
  const int oc = output_.channels;
  const ConstMatMap w(params.data(), oc, patch);
  const Eigen::Index chunk = chunk_size(x.cols());
  col_.resize(static_cast<std::size_t>(chunk * plane * patch));
  out_.resize(static_cast<std::size_t>(chunk * plane * oc));
  dx.setZero(x.rows(), x.cols());
  for (Eigen::Index n0 = 0; n0 < x.cols(); n0 += chunk) {
    const Eigen::Index s = std::min(chunk, x.cols() - n0), rows = s * plane;
    MatMap g(out_.data(), rows, oc);
    for (Eigen::Index i = 0; i < s; ++i)
      g.middleRows(i * plane, plane) = ConstMatMap(dy.col(n0 + i).data(), plane, oc);
    MatMap dcol(col_.data(), rows, patch);
    dcol.noalias() = g * w;
    for (Eigen::Index i = 0; i < s; ++i) col2im(col_.data() + i * plane, rows, dx.col(n0 + i).data());
  }
}

// --- MaxPool2d ---------------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(const Shape& input) : Layer(input) {
  check_shape(input, "maxpool2d");
  if (input.height < 2 || input.width < 2) {
    SINEW_THROW(InvalidArgument, "maxpool2d: input {} is smaller than the 2x2 window", shape_str(input));
  }
  output_ = Shape{input.channels, input.height / 2, input.width / 2};
}

void MaxPool2d::forward(const Matrix& x, std::span<const float> /*params*/, Matrix& y) {
  const int w = input_.width, oh = output_.height, ow = output_.width;
  const std::ptrdiff_t in_plane = static_cast<std::ptrdiff_t>(input_.height) * w;
  y.resize(output_.size(), x.cols());
  argmax_.resize(output_.size(), x.cols());
  for (Eigen::Index n = 0; n < x.cols(); ++n) {
    const float* in = x.col(n).data();
    float* out = y.col(n).data();
    std::int32_t* arg = argmax_.col(n).data();
    for (int c = 0; c < output_.channels; ++c) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox, ++out, ++arg) {
          const std::ptrdiff_t base = c * in_plane + 2 * (static_cast<std::ptrdiff_t>(oy) * w + ox);
          const std::ptrdiff_t cand[4] = {base, base + 1, base + w, base + w + 1};
          std::ptrdiff_t best = base;
          for (int i = 1; i < 4; ++i) {
            if (in[cand[i]] > in[best]) best = cand[i];  // first maximum wins ties
          }
          *out = in[best];
          *arg = static_cast<std::int32_t>(best);
        }
      }
    }
  }
}

void MaxPool2d::backward_input(const Matrix& x, const Matrix& /*y*/, const Matrix& dy,
                               std::span<const float> /*params*/, Matrix& dx) {
  dx.setZero(x.rows(), x.cols());
  for (Eigen::Index n = 0; n < dy.cols(); ++n) {
    for (Eigen::Index j = 0; j < dy.rows(); ++j) dx(argmax_(j, n), n) += dy(j, n);
  }
}

// --- ReLU --------------------------------------------------------------------------------------------------

void ReLU::forward(const Matrix& x, std::span<const float> /*params*/, Matrix& y) {
  y.resize(x.rows(), x.cols());
  y.array() = x.array().max(0.f);
}

void ReLU::backward_input(const Matrix& /*x*/, const Matrix& y, const Matrix& dy,
                          std::span<const float> /*params*/, Matrix& dx) {
  dx.resize(dy.rows(), dy.cols());
  dx.array() = (y.array() > 0.f).select(dy.array(), 0.f);
}

}  // namespace sinew::model
