// Model, layers and loss: gradients against central finite differences, layouts, the on_grad_ready
// contract that data-parallel overlap relies on, seeding, spec parsing, and a small training run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/model/layers.hpp"
#include "sinew/model/loss.hpp"
#include "sinew/model/model.hpp"
#include "sinew/optim/optimizer.hpp"

namespace sinew::model {
namespace {

Matrix random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double bound = 1.0) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (Eigen::Index j = 0; j < cols; ++j) {
    for (Eigen::Index i = 0; i < rows; ++i) m(i, j) = rng.symmetric(bound);
  }
  return m;
}

/// Values at least 0.1 away from zero: central differences with eps 1e-2 never cross the ReLU kink.
Matrix away_from_zero(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed) {
  Matrix m = random_matrix(rows, cols, seed);
  return m.unaryExpr([](float v) { return v < 0 ? v - 0.1f : v + 0.1f; });
}

/// Distinct values 0.1 apart in random order: a 1e-2 perturbation never changes a max-pool argmax.
Matrix distinct_values(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed) {
  std::vector<int> order(static_cast<std::size_t>(rows * cols));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  Matrix m(rows, cols);
  for (Eigen::Index k = 0; k < rows * cols; ++k) {
    m.data()[k] = 0.1f * static_cast<float>(order[static_cast<std::size_t>(k)]) - 1.f;
  }
  return m;
}

double weighted_sum(const Matrix& y, const Matrix& r) {
  return (y.cast<double>().array() * r.cast<double>().array()).sum();
}

bool close(double numeric, double analytic, double atol, double rtol) {
  return std::abs(numeric - analytic) <= atol + rtol * std::abs(analytic);
}

/// Checks a layer's parameter and input gradients for the loss L = sum(R .* layer(x)) against central
/// differences. The loss is bilinear in (params, x) for linear/conv layers, so the differences are exact up
/// to float rounding.
void check_layer_gradients(Layer& layer, const Matrix& x, std::uint64_t seed, float eps = 1e-2f,
                           double atol = 2e-3, double rtol = 1e-2) {
  std::vector<float> params(layer.num_params());
  Rng rng(seed);
  layer.init_params(params, rng);
  Matrix y;
  layer.forward(x, params, y);
  ASSERT_EQ(y.rows(), layer.output_shape().size());
  ASSERT_EQ(y.cols(), x.cols());
  const Matrix r = random_matrix(y.rows(), y.cols(), seed + 1);

  std::vector<float> grads(params.size(), std::numeric_limits<float>::quiet_NaN());
  Matrix dx;
  if (!params.empty()) layer.backward_params(x, y, r, grads, /*accumulate=*/false);
  layer.backward_input(x, y, r, params, dx);
  ASSERT_EQ(dx.rows(), x.rows());
  ASSERT_EQ(dx.cols(), x.cols());

  auto loss = [&](const Matrix& input, const std::vector<float>& p) {
    Matrix out;
    layer.forward(input, p, out);
    return weighted_sum(out, r);
  };
  for (std::size_t j = 0; j < params.size(); ++j) {
    std::vector<float> p = params;
    p[j] = params[j] + eps;
    const double up = loss(x, p);
    p[j] = params[j] - eps;
    const double down = loss(x, p);
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    ASSERT_TRUE(close(numeric, grads[j], atol, rtol))
        << layer.kind() << " param " << j << ": numeric " << numeric << " analytic " << grads[j];
  }
  for (Eigen::Index k = 0; k < x.size(); ++k) {
    Matrix xp = x;
    xp.data()[k] = x.data()[k] + eps;
    const double up = loss(xp, params);
    xp.data()[k] = x.data()[k] - eps;
    const double down = loss(xp, params);
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    ASSERT_TRUE(close(numeric, dx.data()[k], atol, rtol))
        << layer.kind() << " input " << k << ": numeric " << numeric << " analytic " << dx.data()[k];
  }

  // accumulate = true adds to what is there.
  if (!params.empty()) {
    std::vector<float> twice = grads;
    layer.backward_params(x, y, r, twice, /*accumulate=*/true);
    for (std::size_t j = 0; j < grads.size(); ++j)
      ASSERT_NEAR(twice[j], 2 * grads[j], 1e-5 + 1e-5 * std::abs(grads[j]));
  }
}

std::vector<std::int32_t> labels_for(Eigen::Index batch, int classes, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(classes));
  return labels;
}

/// Checks d(mean CE)/d(params) of a whole model against central differences, on every `stride`-th parameter
/// and on the first and last parameter of every layer. The loss is evaluated in double from float logits.
void check_model_gradients(Model& model, const Matrix& x, std::uint64_t seed, std::size_t stride, float eps,
                           double atol, double rtol) {
  const auto labels = labels_for(x.cols(), model.num_classes(), seed);
  Matrix dlogits;
  softmax_cross_entropy(model.forward(x), labels, dlogits);
  model.backward(dlogits);
  const std::vector<float> grads(model.grads().begin(), model.grads().end());

  auto loss = [&]() {
    const Matrix& z = model.forward(x);
    double total = 0;
    for (Eigen::Index n = 0; n < z.cols(); ++n) {
      const float* col = z.col(n).data();
      const double m = *std::max_element(col, col + z.rows());
      double sum = 0;
      for (Eigen::Index k = 0; k < z.rows(); ++k) sum += std::exp(static_cast<double>(col[k]) - m);
      total += m + std::log(sum) - col[labels[static_cast<std::size_t>(n)]];
    }
    return total / static_cast<double>(z.cols());
  };
  std::vector<std::size_t> checked;
  for (std::size_t j = 0; j < model.num_params(); j += stride) checked.push_back(j);
  for (std::size_t i = 0; i < model.num_layers(); ++i) {
    const Slice r = model.layer_params(i);
    if (r.count > 0) {
      checked.push_back(r.offset);
      checked.push_back(r.offset + r.count - 1);
    }
  }
  std::size_t bad = 0;
  for (const std::size_t j : checked) {
    float& p = model.params()[j];
    const float saved = p;
    p = saved + eps;
    const double up = loss();
    p = saved - eps;
    const double down = loss();
    p = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    if (!close(numeric, grads[j], atol, rtol)) {
      ++bad;
      ADD_FAILURE() << model.spec() << " param " << j << ": numeric " << numeric << " analytic " << grads[j];
      if (bad > 5) return;
    }
  }
}

// --- layers ------------------------------------------------------------------------------------------------

TEST(Model, RngIsSplitMix64) {
  Rng rng(0);  // reference values of splitmix64 seeded with 0
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ULL);
  Rng sym(42);
  for (int i = 0; i < 1000; ++i) {
    const float v = sym.symmetric(0.5);
    ASSERT_GT(v, -0.5f);
    ASSERT_LT(v, 0.5f);
  }
}

TEST(Model, LinearLayoutIsColumnMajorWeightsThenBias) {
  Linear layer(Shape{2, 1, 1}, 3);
  ASSERT_EQ(layer.num_params(), 9U);
  // W = [[1, 2], [3, 4], [5, 6]] stored column-major, then b = [10, 20, 30].
  const std::vector<float> params = {1, 3, 5, 2, 4, 6, 10, 20, 30};
  Matrix x(2, 2);
  x << 1, -1, 2, 0.5;  // samples (1, 2) and (-1, 0.5)
  Matrix y;
  layer.forward(x, params, y);
  Matrix expected(3, 2);
  expected << 15, 10, 31, 19, 47, 28;
  EXPECT_TRUE(y.isApprox(expected)) << y;
}

TEST(Model, LinearGradMatchesNumerical) {
  Linear layer(Shape{2, 2, 2}, 5);  // an 8-d input, flattened implicitly
  check_layer_gradients(layer, random_matrix(8, 3, 7), 11);
}

TEST(Model, ReluGradMatchesNumerical) {
  ReLU layer(Shape{3, 2, 2});
  check_layer_gradients(layer, away_from_zero(12, 4, 5), 13);
}

TEST(Model, MaxPoolGradMatchesNumerical) {
  MaxPool2d layer(Shape{2, 5, 4});  // odd height: the last row is dropped
  EXPECT_EQ(layer.output_shape(), (Shape{2, 2, 2}));
  check_layer_gradients(layer, distinct_values(40, 3, 3), 17);
}

TEST(Model, MaxPoolPicksWindowMaximum) {
  MaxPool2d layer(Shape{1, 2, 4});
  Matrix x(8, 1);
  x << 1, 5, 2, 0, 3, -1, 7, 7;  // rows (1 5 2 0) and (3 -1 7 7)
  Matrix y;
  layer.forward(x, {}, y);
  EXPECT_FLOAT_EQ(y(0, 0), 5);
  EXPECT_FLOAT_EQ(y(1, 0), 7);
  Matrix dy(2, 1), dx;
  dy << 1, 2;
  layer.backward_input(x, y, dy, {}, dx);
  Matrix expected(8, 1);
  expected << 0, 1, 0, 0, 0, 0, 2, 0;  // the first of the tied maxima receives the gradient
  EXPECT_EQ(dx, expected);
}

TEST(Model, Conv2dMatchesDirectConvolution) {
  const Shape in{2, 5, 4};
  const int oc = 3, k = 3, pad = 1;
  Conv2d layer(in, oc, k, pad);
  ASSERT_EQ(layer.output_shape(), (Shape{3, 5, 4}));
  std::vector<float> params(layer.num_params());
  Rng rng(3);
  layer.init_params(params, rng);
  const Matrix x = random_matrix(in.size(), 2, 9);
  Matrix y;
  layer.forward(x, params, y);
  const std::size_t bias = static_cast<std::size_t>(oc) * in.channels * k * k;
  for (Eigen::Index n = 0; n < x.cols(); ++n) {
    for (int o = 0; o < oc; ++o) {
      for (int oy = 0; oy < in.height; ++oy) {
        for (int ox = 0; ox < in.width; ++ox) {
          double acc = params[bias + static_cast<std::size_t>(o)];
          for (int c = 0; c < in.channels; ++c) {
            for (int ky = 0; ky < k; ++ky) {
              for (int kx = 0; kx < k; ++kx) {
                const int iy = oy + ky - pad, ix = ox + kx - pad;
                if (iy < 0 || iy >= in.height || ix < 0 || ix >= in.width) continue;
                const std::size_t col = static_cast<std::size_t>((c * k + ky) * k + kx);
                acc += static_cast<double>(params[col * oc + static_cast<std::size_t>(o)]) *
                       x((c * in.height + iy) * in.width + ix, n);
              }
            }
          }
          ASSERT_NEAR(y((o * in.height + oy) * in.width + ox, n), acc, 1e-5) << o << " " << oy << " " << ox;
        }
      }
    }
  }
}

TEST(Model, Conv2dGradMatchesNumerical) {
  Conv2d padded(Shape{2, 4, 5}, 3, 3, 1);
  check_layer_gradients(padded, random_matrix(40, 2, 21), 23);
  Conv2d valid(Shape{3, 4, 4}, 2, 2, 0);
  EXPECT_EQ(valid.output_shape(), (Shape{2, 3, 3}));
  check_layer_gradients(valid, random_matrix(48, 2, 25), 27);
  Conv2d wide(Shape{1, 3, 3}, 2, 3, 2);  // padding larger than the border the kernel needs
  EXPECT_EQ(wide.output_shape(), (Shape{2, 5, 5}));
  check_layer_gradients(wide, random_matrix(9, 2, 29), 31);
}

TEST(Model, LayerRejectsBadShapes) {
  EXPECT_THROW(Linear(Shape{0, 1, 1}, 3), InvalidArgument);
  EXPECT_THROW(Linear(Shape{3, 1, 1}, 0), InvalidArgument);
  EXPECT_THROW(Conv2d(Shape{1, 2, 2}, 4, 3, 0), InvalidArgument);
  EXPECT_THROW(Conv2d(Shape{1, 4, 4}, 4, 3, -1), InvalidArgument);
  EXPECT_THROW(MaxPool2d(Shape{1, 1, 4}), InvalidArgument);
}

// --- whole models ------------------------------------------------------------------------------------------

TEST(Model, MlpGradMatchesNumerical) {
  Model model = Model::build("mlp:8,8", Shape{5, 1, 1}, 3, 1);
  check_model_gradients(model, away_from_zero(5, 4, 2), 3, /*stride=*/1, /*eps=*/1e-3f, 1e-3, 2e-2);
}

TEST(Model, CnnGradMatchesNumerical) {
  Model model = Model::build("cnn", Shape{2, 6, 5}, 3, 4);
  // A small eps: with 1e-3 one parameter moves a pre-activation across a ReLU/max-pool kink.
  check_model_gradients(model, random_matrix(60, 2, 5), 6, /*stride=*/37, /*eps=*/3e-4f, 1e-3, 2e-2);
}

TEST(Model, LogregGradMatchesNumerical) {
  Model model = Model::build("logreg", Shape{1, 3, 3}, 4, 8);
  check_model_gradients(model, random_matrix(9, 5, 9), 10, 1, 1e-3f, 1e-3, 2e-2);
}

TEST(Model, BuildSpecs) {
  const Shape mnist{1, 28, 28};
  Model mlp = Model::build("mlp", mnist, 10, 0);
  EXPECT_EQ(mlp.num_params(), 784U * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  EXPECT_EQ(mlp.num_layers(), 5U);
  EXPECT_EQ(Model::build("mlp:512,512", mnist, 10, 0).num_params(), mlp.num_params());
  EXPECT_EQ(Model::build("mlp:16", mnist, 10, 0).num_params(), 784U * 16 + 16 + 16 * 10 + 10);
  EXPECT_EQ(Model::build("logreg", mnist, 10, 0).num_params(), 7850U);
  Model cnn = Model::build("cnn", mnist, 10, 0);
  EXPECT_EQ(cnn.num_params(),
            (16U * 9 + 16) + (32U * 144 + 32) + (32U * 7 * 7 * 128 + 128) + (128U * 10 + 10));
  EXPECT_EQ(cnn.input_shape(), mnist);
  EXPECT_EQ(cnn.num_classes(), 10);
  EXPECT_EQ(cnn.spec(), "cnn");
  const std::string summary = cnn.summary();
  EXPECT_NE(summary.find("conv2d"), std::string::npos) << summary;
  EXPECT_NE(summary.find(std::to_string(cnn.num_params())), std::string::npos) << summary;
  EXPECT_EQ(std::count(summary.begin(), summary.end(), '\n'), 10) << summary;  // header + 9 layers + total
}

TEST(Model, BuildRejectsBadSpecs) {
  for (const std::string spec : {"", "resnet", "MLP", "mlp:", "mlp:0", "mlp:-3", "mlp:12x", "mlp:5,,6",
                                 "mlp:5,", "mlp:99999999999", "logreg:3", "cnn:1"}) {
    try {
      (void)Model::build(spec, Shape{1, 8, 8}, 10, 0);
      ADD_FAILURE() << "no exception for '" << spec << "'";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + spec + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("valid specs"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW((void)Model::build("cnn", Shape{1, 3, 8}, 10, 0), InvalidArgument);
  EXPECT_THROW((void)Model::build("mlp", Shape{1, 0, 8}, 10, 0), InvalidArgument);
  EXPECT_THROW((void)Model::build("logreg", Shape{1, 8, 8}, 0, 0), InvalidArgument);
}

TEST(Model, SeedDeterminesParameters) {
  const Shape in{1, 6, 6};
  const Model a = Model::build("cnn", in, 4, 123);
  const Model b = Model::build("cnn", in, 4, 123);
  const Model c = Model::build("cnn", in, 4, 124);
  ASSERT_EQ(a.num_params(), c.num_params());
  EXPECT_TRUE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.num_params(); ++i) same += a.params()[i] == c.params()[i] ? 1 : 0;
  EXPECT_LT(same, a.num_params() / 100);
}

TEST(Model, InitFollowsPytorchLinearDefault) {
  const Model m = Model::build("mlp:64", Shape{100, 1, 1}, 10, 5);
  const Slice first = m.layer_params(0);
  const auto p = m.params().subspan(first.offset, first.count);
  const float bound = 0.1f;  // 1/sqrt(100)
  double sum = 0, sq = 0;
  for (const float v : p) {
    ASSERT_LT(std::abs(v), bound);
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(p.size());
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sq / n, 0.01 / 3.0, 0.0003);  // variance of U(-b, b) is b^2/3
}

TEST(Model, GradReadyOrderCoversBufferInReverse) {
  for (const std::string spec : {"logreg", "mlp", "mlp:8,8", "cnn"}) {
    const Model m = Model::build(spec, Shape{1, 8, 8}, 10, 0);
    const auto order = m.grad_ready_order();
    ASSERT_FALSE(order.empty());
    std::size_t end = m.num_params();
    for (const Slice& r : order) {
      EXPECT_GT(r.count, 0U);
      EXPECT_EQ(r.offset + r.count, end) << spec;
      end = r.offset;
    }
    EXPECT_EQ(end, 0U) << spec;
  }
}

TEST(Model, OnGradReadyReportsFinalGradsAsEarlyAsPossible) {
  for (const std::string spec : {"mlp:8,8", "cnn"}) {
    Model model = Model::build(spec, Shape{2, 6, 6}, 4, 1);
    const Matrix x = random_matrix(72, 5, 2);
    const auto labels = labels_for(5, 4, 3);
    Matrix dlogits;
    softmax_cross_entropy(model.forward(x), labels, dlogits);

    // Reference gradients from a backward without a callback.
    model.backward(dlogits);
    const std::vector<float> reference(model.grads().begin(), model.grads().end());

    // Poison the buffer with NaN. When a range is reported it must be fully written, while everything
    // before it (the layers not yet back-propagated) must still be NaN: reporting is not delayed.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::fill(model.grads().begin(), model.grads().end(), nan);
    std::vector<Slice> reported;
    std::vector<std::vector<float>> snapshots;
    model.backward(dlogits, [&](Slice r) {
      const auto g = model.grads();
      for (std::size_t i = r.offset; i < r.offset + r.count; ++i) ASSERT_FALSE(std::isnan(g[i])) << i;
      // Everything before this range (layers not yet back-propagated) is still untouched.
      for (std::size_t i = 0; i < r.offset; ++i) ASSERT_TRUE(std::isnan(g[i])) << i;
      reported.push_back(r);
      snapshots.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(r.offset),
                             g.begin() + static_cast<std::ptrdiff_t>(r.offset + r.count));
    });
    ASSERT_EQ(reported, model.grad_ready_order()) << spec;
    for (std::size_t k = 0; k < reported.size(); ++k) {
      for (std::size_t i = 0; i < reported[k].count; ++i) {
        // Unchanged since reported, and equal to the reference.
        ASSERT_EQ(snapshots[k][i], model.grads()[reported[k].offset + i]);
        ASSERT_EQ(snapshots[k][i], reference[reported[k].offset + i]);
      }
    }
  }
}

TEST(Model, BackwardAccumulates) {
  Model model = Model::build("cnn", Shape{1, 4, 4}, 3, 7);
  const Matrix x = random_matrix(16, 3, 8);
  Matrix dlogits;
  softmax_cross_entropy(model.forward(x), labels_for(3, 3, 9), dlogits);
  model.backward(dlogits);
  const std::vector<float> once(model.grads().begin(), model.grads().end());
  model.backward(dlogits, {}, /*accumulate=*/true);
  for (std::size_t i = 0; i < once.size(); ++i)
    ASSERT_NEAR(model.grads()[i], 2 * once[i], 1e-6 + 1e-5 * std::abs(once[i]));
  model.backward(dlogits);  // overwrite again
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_EQ(model.grads()[i], once[i]);
}

TEST(Model, SamplesAreIndependentAndBatchSizeMayChange) {
  Model model = Model::build("cnn", Shape{2, 5, 6}, 4, 3);
  const Matrix x = random_matrix(60, 4, 4);
  const Matrix all = model.forward(x);
  for (Eigen::Index n = 0; n < x.cols(); ++n) {
    const Matrix one = model.forward(x.col(n));
    ASSERT_TRUE(one.col(0).isApprox(all.col(n), 1e-5f)) << n;
  }
  const Matrix pair = model.forward(x.middleCols(1, 2));
  EXPECT_TRUE(pair.isApprox(all.middleCols(1, 2), 1e-5f));
}

TEST(Model, SumOfShardGradientsWithGlobalDenominatorEqualsFullBatch) {
  // What a SUM allreduce computes in data-parallel training: each rank's gradient of sum_loss / global_batch.
  Model model = Model::build("mlp:16", Shape{6, 1, 1}, 3, 10);
  const Matrix x = random_matrix(6, 8, 11);
  const auto labels = labels_for(8, 3, 12);
  Matrix d;
  const float full_loss = softmax_cross_entropy(model.forward(x), labels, d);
  model.backward(d);
  const std::vector<float> full(model.grads().begin(), model.grads().end());

  const std::span<const std::int32_t> all_labels(labels);
  const float loss0 = softmax_cross_entropy(model.forward(x.leftCols(5)), all_labels.first(5), d, 8);
  model.backward(d);
  const float loss1 = softmax_cross_entropy(model.forward(x.rightCols(3)), all_labels.last(3), d, 8);
  model.backward(d, {}, /*accumulate=*/true);
  EXPECT_NEAR(loss0 + loss1, full_loss, 1e-5);
  for (std::size_t i = 0; i < full.size(); ++i)
    ASSERT_NEAR(model.grads()[i], full[i], 1e-6 + 1e-5 * std::abs(full[i]));
}

TEST(Model, MoveKeepsBuffersAndCloneCopiesThem) {
  Model a = Model::build("mlp:8", Shape{4, 1, 1}, 2, 1);
  const float* data = a.params().data();
  const Matrix x = random_matrix(4, 3, 2);
  const Matrix before = a.forward(x);
  Model b = std::move(a);
  EXPECT_EQ(b.params().data(), data);
  EXPECT_EQ(b.forward(x), before);
  Model c;
  c = std::move(b);
  EXPECT_EQ(c.params().data(), data);
  Model d = c.clone();
  EXPECT_NE(d.params().data(), data);
  EXPECT_EQ(d.forward(x), before);
  d.params()[0] += 1;
  EXPECT_EQ(c.forward(x), before);
}

TEST(Model, MisuseThrows) {
  Model model = Model::build("mlp:4", Shape{3, 1, 1}, 2, 1);
  Matrix d = Matrix::Zero(2, 2);
  EXPECT_THROW(model.backward(d), InvalidArgument);  // no forward yet
  EXPECT_THROW(model.forward(Matrix::Zero(4, 2)), InvalidArgument);
  model.forward(Matrix::Zero(3, 2));
  EXPECT_THROW(model.backward(Matrix::Zero(2, 3)), InvalidArgument);
  EXPECT_NO_THROW(model.backward(d));
  Model empty;
  EXPECT_THROW(empty.forward(Matrix::Zero(1, 1)), InvalidArgument);
}

// --- loss ------------------------------------------------------------------------------------------------

TEST(Model, SoftmaxCrossEntropyValues) {
  Matrix logits = Matrix::Zero(4, 2);
  const std::vector<std::int32_t> labels = {1, 3};
  Matrix d;
  EXPECT_NEAR(softmax_cross_entropy(logits, labels, d), std::log(4.0), 1e-6);
  EXPECT_NEAR(d(0, 0), 0.25 / 2, 1e-7);
  EXPECT_NEAR(d(1, 0), (0.25 - 1) / 2, 1e-7);
  // Huge logits: no overflow, exact limits.
  logits << 1000, -1000, -1000, 1000, 0, 0, 0, 0;
  const float loss = softmax_cross_entropy(logits, labels, d);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, (2000.0 + 1000.0) / 2, 1e-2);  // sample 0: label 1 at -1000; sample 1: label 3 at 0
  EXPECT_TRUE(d.allFinite());
  EXPECT_NEAR(d(0, 0), 0.5, 1e-6);
  EXPECT_NEAR(d(1, 0), -0.5, 1e-6);
}

TEST(Model, SoftmaxCrossEntropyGradMatchesNumerical) {
  const Matrix logits = random_matrix(5, 3, 1, 3.0);
  const std::vector<std::int32_t> labels = {4, 0, 2};
  Matrix d, unused;
  softmax_cross_entropy(logits, labels, d, 7);  // an explicit denominator
  const float eps = 1e-2f;
  for (Eigen::Index k = 0; k < logits.size(); ++k) {
    Matrix z = logits;
    z.data()[k] += eps;
    const double up = softmax_cross_entropy(z, labels, unused, 7);
    z.data()[k] -= 2 * eps;
    const double down = softmax_cross_entropy(z, labels, unused, 7);
    EXPECT_NEAR((up - down) / (2 * eps), d.data()[k], 2e-4) << k;
  }
  EXPECT_NEAR(d.sum(), 0.0, 1e-6);  // each column of softmax - onehot sums to 0
}

TEST(Model, SoftmaxCrossEntropyDenominator) {
  const Matrix logits = random_matrix(3, 4, 2, 2.0);
  const std::vector<std::int32_t> labels = {0, 1, 2, 1};
  Matrix d_mean, d_default, d_global;
  const float mean = softmax_cross_entropy(logits, labels, d_mean);
  EXPECT_EQ(softmax_cross_entropy(logits, labels, d_default, 4), mean);
  EXPECT_EQ(d_default, d_mean);
  const float global = softmax_cross_entropy(logits, labels, d_global, 16);
  EXPECT_NEAR(global, mean / 4, 1e-6);
  EXPECT_TRUE(d_global.isApprox(d_mean / 4));
  EXPECT_THROW(softmax_cross_entropy(logits, labels, d_global, -1), InvalidArgument);
  // An empty local batch contributes nothing.
  Matrix d_empty;
  EXPECT_EQ(softmax_cross_entropy(Matrix(3, 0), {}, d_empty, 16), 0.f);
  EXPECT_EQ(d_empty.cols(), 0);
}

TEST(Model, LabelsOutOfRangeThrowDataError) {
  const Matrix logits = Matrix::Zero(3, 2);
  Matrix d;
  const std::vector<std::int32_t> too_big = {0, 3}, negative = {-1, 0}, short_labels = {0};
  EXPECT_THROW(softmax_cross_entropy(logits, too_big, d), DataError);
  EXPECT_THROW(softmax_cross_entropy(logits, negative, d), DataError);
  EXPECT_THROW(count_correct(logits, too_big), DataError);
  EXPECT_THROW(softmax_cross_entropy(logits, short_labels, d), InvalidArgument);
  EXPECT_THROW(count_correct(logits, short_labels), InvalidArgument);
}

TEST(Model, CountCorrect) {
  Matrix logits(3, 4);
  logits << 1, 0, 0, 5,  //
      2, 0, 1, 5,        //
      0, 3, 1, 1;        // argmax per column: 1, 2, 1 (first of ties), 0 (first of ties)
  const std::vector<std::int32_t> labels = {1, 2, 2, 0};
  EXPECT_EQ(count_correct(logits, labels), 3U);
}

// --- training --------------------------------------------------------------------------------------------

/// Samples in [-1, 1]^dim labelled by the argmax of a fixed random linear map: linearly separable.
void make_separable(int dim, int classes, Eigen::Index n, std::uint64_t seed, Matrix& x,
                    std::vector<std::int32_t>& labels) {
  const Matrix teacher = random_matrix(classes, dim, seed);
  x = random_matrix(dim, n, seed + 1);
  labels.resize(static_cast<std::size_t>(n));
  const Matrix scores = teacher * x;
  for (Eigen::Index i = 0; i < n; ++i) {
    const float* col = scores.col(i).data();
    labels[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(std::max_element(col, col + classes) - col);
  }
}

double train_and_evaluate(const std::string& spec, const optim::OptimizerOptions& opts, float lr, int steps) {
  const int dim = 10, classes = 3, batch = 32;
  Matrix x;
  std::vector<std::int32_t> labels;
  make_separable(dim, classes, 2048, 77, x, labels);
  Model model = Model::build(spec, Shape{dim, 1, 1}, classes, 1);
  auto opt = optim::make_optimizer(opts, model.num_params());
  Matrix d;
  const std::span<const std::int32_t> all(labels);
  for (int s = 0; s < steps; ++s) {
    const Eigen::Index start = (static_cast<Eigen::Index>(s) * batch) % x.cols();
    softmax_cross_entropy(model.forward(x.middleCols(start, batch)),
                          all.subspan(static_cast<std::size_t>(start), batch), d);
    model.backward(d);
    opt->step(model.params(), model.grads(), lr);
  }
  return static_cast<double>(count_correct(model.forward(x), labels)) / static_cast<double>(x.cols());
}

TEST(Model, LogregLearnsSeparableProblem) {
  optim::OptimizerOptions sgd;
  sgd.name = "sgd";
  sgd.momentum = 0.9f;
  EXPECT_GT(train_and_evaluate("logreg", sgd, 0.5f, 400), 0.95);
}

TEST(Model, MlpLearnsSeparableProblemWithAdam) {
  optim::OptimizerOptions adam;
  adam.name = "adam";
  EXPECT_GT(train_and_evaluate("mlp:32", adam, 0.01f, 400), 0.95);
}

}  // namespace
}  // namespace sinew::model
