#include "sinew/model/loss.hpp"

#include <cmath>

#include "sinew/core/error.hpp"

namespace sinew::model {

namespace {

/// Labels must match the batch and lie in [0, classes); checked before any output is written.
void check_labels(const Matrix& logits, std::span<const std::int32_t> labels, const char* what) {
  if (labels.size() != static_cast<std::size_t>(logits.cols())) {
    SINEW_THROW(InvalidArgument, "{}: {} labels for a batch of {} samples", what, labels.size(),
                logits.cols());
  }
  for (std::size_t n = 0; n < labels.size(); ++n) {
    if (labels[n] < 0 || labels[n] >= logits.rows()) {
      SINEW_THROW(DataError,
                  "{}: label {} of sample {} is outside [0, {}): the data has more classes than the model",
                  what, labels[n], n, logits.rows());
    }
  }
}

}  // namespace

float softmax_cross_entropy(const Matrix& logits, std::span<const std::int32_t> labels, Matrix& dlogits,
                            double denominator) {
  if (!(denominator >= 0) || !std::isfinite(denominator)) {
    SINEW_THROW(InvalidArgument, "softmax_cross_entropy: denominator must be finite and >= 0, got {}",
                denominator);
  }
  check_labels(logits, labels, "softmax_cross_entropy");
  const double denom = denominator > 0 ? denominator : static_cast<double>(logits.cols());
  dlogits.resize(logits.rows(), logits.cols());
  if (logits.cols() == 0) return 0.f;

  const auto scale = static_cast<float>(1.0 / denom);
  double total = 0;
  for (Eigen::Index n = 0; n < logits.cols(); ++n) {
    const auto z = logits.col(n);
    auto d = dlogits.col(n);
    const float zmax = z.maxCoeff();
    d.array() = (z.array() - zmax).exp();  // in (0, 1]: no overflow
    const float sum = d.sum();             // >= 1
    const auto label = static_cast<Eigen::Index>(labels[static_cast<std::size_t>(n)]);
    // -log softmax(z)[label] = log(sum exp(z - zmax)) + zmax - z[label]
    total += static_cast<double>(std::log(sum)) + static_cast<double>(zmax) - static_cast<double>(z(label));
    d *= scale / sum;  // softmax / denom
    d(label) -= scale;
  }
  return static_cast<float>(total / denom);
}

std::size_t count_correct(const Matrix& logits, std::span<const std::int32_t> labels) {
  check_labels(logits, labels, "count_correct");
  std::size_t correct = 0;
  for (Eigen::Index n = 0; n < logits.cols(); ++n) {
    Eigen::Index best = 0;
    logits.col(n).maxCoeff(&best);
    if (best == labels[static_cast<std::size_t>(n)]) ++correct;
  }
  return correct;
}

}  // namespace sinew::model
