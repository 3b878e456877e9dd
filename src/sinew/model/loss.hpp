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

/// Number of samples whose argmax(logits) (the first maximum on ties) equals the label.
/// Throws InvalidArgument if labels.size() != logits.cols() and DataError for a label outside [0,
/// logits.rows()).
std::size_t count_correct(const Matrix& logits, std::span<const std::int32_t> labels);

}  // namespace sinew::model
