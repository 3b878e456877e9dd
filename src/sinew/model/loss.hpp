// Classification loss and accuracy on logits laid out one column per sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "sinew/model/layers.hpp"

namespace sinew::model {

/// Softmax cross-entropy, numerically stable (log-sum-exp with the column maximum subtracted).
///
/// Returns sum over samples of -log softmax(logits)[label] divided by `denominator`, and sets
/// dlogits = d(that value)/d(logits) (resized to the shape of logits). `denominator` <= 0 means the local
/// batch size, logits.cols(). Data-parallel training passes the GLOBAL batch size, so that a SUM allreduce
/// of the gradients gives exactly the gradient of the mean loss over the global batch.
/// Throws InvalidArgument if labels.size() != logits.cols() and DataError if a label is outside
/// [0, logits.rows()).
float softmax_cross_entropy(const Matrix& logits, std::span<const std::int32_t> labels, Matrix& dlogits,
                            double denominator = 0);

/// Knowledge distillation (Hinton et al. 2015), per sample n:
///   loss_n = alpha * CE(softmax(z_n), label_n) + (1 - alpha) * T^2 * KL(softmax(t_n / T) || softmax(z_n /
///   T))
/// with z the student's logits and t the teacher's, summed over samples and divided by `denominator` (<= 0:
/// the local batch size) as softmax_cross_entropy() does, so that the summed gradients of data-parallel
/// ranks stay the exact mean over the global batch. The T^2 keeps the soft term's gradient of the same
/// size as the hard term's across temperatures. d loss_n / d z_n = alpha * (softmax(z_n) - onehot) +
/// (1 - alpha) * T * (softmax(z_n / T) - softmax(t_n / T)), divided by the denominator.
///
/// `teacher` holds classes x batch logits, column-major (one column per sample). A sample whose
/// `has_teacher` entry is 0 (no teacher logits arrived for it) is trained on its label alone: its loss is
/// the plain cross-entropy (alpha = 1). An empty `has_teacher` means every sample has teacher logits.
/// Throws InvalidArgument for alpha outside [0, 1], T <= 0, or mis-sized inputs; DataError for a bad label.
float distillation_loss(const Matrix& logits, std::span<const std::int32_t> labels,
                        std::span<const float> teacher, std::span<const std::uint8_t> has_teacher,
                        float alpha, float temperature, Matrix& dlogits, double denominator = 0);

/// Number of samples whose argmax(logits) (the first maximum on ties) equals the label.
/// Throws InvalidArgument if labels.size() != logits.cols() and DataError for a label outside [0,
/// logits.rows()).
std::size_t count_correct(const Matrix& logits, std::span<const std::int32_t> labels);

}  // namespace sinew::model
