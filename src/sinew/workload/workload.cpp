#include "sinew/workload/workload.hpp"

#include "sinew/core/error.hpp"

namespace sinew::workload {

std::span<float> Workload::optimizer_state(std::string_view name, std::string_view who) {
  std::string have;
  for (const auto& [n, buf] : optimizer_state()) {
    if (n == name) return buf;
    have += (have.empty() ? "" : ", ") + n;
  }
  SINEW_THROW(InvalidArgument,
              "{} needs the optimiser state '{}', which the optimiser '{}' does not keep ({})", who, name,
              optimizer_name(), have.empty() ? "it keeps none" : "it keeps " + have);
}

float Workload::train(const MicroBatch&, const TrainHooks&) {
  SINEW_THROW(InvalidArgument,
              "{}: this workload is driven by its caller (forward and backward are the caller's); drive a "
              "train::Session instead of the built-in loop",
              describe());
}

EvalSums Workload::evaluate(std::span<const std::size_t>) {
  SINEW_THROW(InvalidArgument, "{}: this workload is driven by its caller and evaluates itself", describe());
}

float* Workload::attach_device(int) {
  SINEW_THROW(InvalidArgument, "{} trains in host memory; it cannot be moved to a GPU (use --device cpu)",
              describe());
}

}  // namespace sinew::workload
