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

float distillation_loss(const Matrix& logits, std::span<const std::int32_t> labels,
                        std::span<const float> teacher, std::span<const std::uint8_t> has_teacher,
                        float alpha, float temperature, Matrix& dlogits, double denominator) {
  if (!(alpha >= 0.f && alpha <= 1.f)) {
    SINEW_THROW(InvalidArgument, "distillation_loss: alpha must lie in [0, 1], got {}", alpha);
  }
  if (!(temperature > 0.f) || !std::isfinite(temperature)) {
    SINEW_THROW(InvalidArgument, "distillation_loss: the temperature must be > 0, got {}", temperature);
  }
  const auto classes = static_cast<std::size_t>(logits.rows());
  const auto batch = static_cast<std::size_t>(logits.cols());
  if (teacher.size() != classes * batch) {
    SINEW_THROW(InvalidArgument, "distillation_loss: {} teacher logits for {} classes x {} samples",
                teacher.size(), classes, batch);
  }
  if (!has_teacher.empty() && has_teacher.size() != batch) {
    SINEW_THROW(InvalidArgument, "distillation_loss: {} teacher flags for a batch of {} samples",
                has_teacher.size(), batch);
  }
  // The hard term for every sample (alpha = 1 for those without a teacher is added below).
  const double denom = denominator > 0 ? denominator : static_cast<double>(batch);
  const double ce = softmax_cross_entropy(logits, labels, dlogits, denom) * denom;  // sum over samples
  if (batch == 0) return 0.f;
  const double inv_t = 1.0 / temperature;
  const auto scale = static_cast<float>(1.0 / denom);
  double total = 0;
  Eigen::VectorXf qs(logits.rows()), pt(logits.rows());
  for (Eigen::Index n = 0; n < logits.cols(); ++n) {
    auto d = dlogits.col(n);
    const auto un = static_cast<std::size_t>(n);
    if (!has_teacher.empty() && has_teacher[un] == 0) continue;  // labels alone: d is the CE gradient
    // The hard term's share of this sample: alpha * (its CE gradient), recovered from d.
    d *= alpha;
    // log softmax(z / T) and softmax(t / T), each stable with its maximum subtracted.
    const auto z = logits.col(n);
    const Eigen::Map<const Eigen::VectorXf> t(teacher.data() + un * classes, logits.rows());
    const float zmax = z.maxCoeff(), tmax = t.maxCoeff();
    qs.array() = ((z.array() - zmax) * static_cast<float>(inv_t)).exp();
    pt.array() = ((t.array() - tmax) * static_cast<float>(inv_t)).exp();
    const double qsum = qs.sum(), psum = pt.sum();
    double kl = 0;  // sum_i p_i (log p_i - log q_i)
    for (Eigen::Index i = 0; i < logits.rows(); ++i) {
      const double p = pt(i) / psum;
      if (p > 0) {
        const double log_p = (t(i) - tmax) * inv_t - std::log(psum);
        const double log_q = (z(i) - zmax) * inv_t - std::log(qsum);
        kl += p * (log_p - log_q);
      }
    }
    total += (1.0 - alpha) * temperature * temperature * kl;
    // d/dz of T^2 KL = T (q - p)
    const float soft = (1.f - alpha) * temperature * scale;
    d.array() += soft * (qs.array() / static_cast<float>(qsum) - pt.array() / static_cast<float>(psum));
  }
  // CE counted once per sample: alpha for the distilled samples, 1 for the others. The per-sample CE is not
  // kept, so it is recomputed for the distilled ones (cheap next to the forward pass).
  double ce_distilled = 0;
  for (Eigen::Index n = 0; n < logits.cols(); ++n) {
    const auto un = static_cast<std::size_t>(n);
    if (!has_teacher.empty() && has_teacher[un] == 0) continue;
    const auto z = logits.col(n);
    const float zmax = z.maxCoeff();
    ce_distilled += std::log((z.array() - zmax).exp().sum()) + zmax - z(labels[un]);
  }
  total += ce - (1.0 - alpha) * ce_distilled;
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
