// The fabric: everything built over one view of the group, rebuilt after every change of membership.
//
// It owns, in order of creation, the communication backend (through the comm::Backend interface), the
// checkpoint writer (which uses the backend), the communication algorithm (backend) and the gradient
// bucketer (backend, algorithm; its communication thread). Members are declared in that order, so they
// are destroyed in reverse: the bucketer's thread stops before the algorithm and the backend it uses go.
//
//   abort()      after a failure or a missed deadline: makes every pending and future operation of the
//                backend fail here and (ULFM revoke) at the peers, so that nothing stays blocked in the
//                old view. Never throws. The fabric is then only good for destruction.
//   destruction  a clean teardown (a planned change: every member agrees), in reverse order.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sinew/algo/algorithm.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/comm/bucketer.hpp"
#include "sinew/core/fault.hpp"

namespace sinew::checkpoint {
class Writer;
}
namespace sinew::membership {
class Group;
}
namespace sinew::optim {
class Optimizer;
}

namespace sinew::train {

/// What every view's fabric is built with (the same for all views of a run).
struct FabricSetup {
  comm::Options op;            ///< deadline of every collective
  std::string checkpoint_dir;  ///< empty: no checkpoint writer
  int checkpoint_keep = 3;
  const fault::Plan* faults = nullptr;  ///< checkpoint-writer fault points (not owned)
  algo::AlgorithmOptions algorithm;
  double bucket_mb = 4;
  bool overlap = true;
  // The model and optimiser, owned by the trainer.
  std::span<float> params, grads;
  std::vector<comm::Range> grad_ready_order;
  optim::Optimizer* optimizer = nullptr;
  std::function<double()> compute_ms;                          ///< for `--algorithm auto`
  std::function<void(const nlohmann::json&)> algorithm_event;  ///< the algorithm's own events
};

class Fabric {
 public:
  /// Collective over the view: duplicates its communicator, agrees on the checkpoint directory, and
  /// (`--algorithm auto`) measures the bandwidth. Throws CommFailure/Timeout if a member fails meanwhile.
  Fabric(const membership::Group& group, const FabricSetup& setup);
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  Fabric(Fabric&&) = delete;
  Fabric& operator=(Fabric&&) = delete;
  ~Fabric();

  void abort() noexcept;

  [[nodiscard]] comm::Backend& backend() noexcept { return *backend_; }
  [[nodiscard]] algo::Algorithm& algorithm() noexcept { return *algorithm_; }
  [[nodiscard]] comm::GradientBucketer& bucketer() noexcept { return *bucketer_; }
  /// Null without --checkpoint-dir.
  [[nodiscard]] checkpoint::Writer* writer() noexcept { return writer_.get(); }
  [[nodiscard]] int rank() const { return backend_->rank(); }
  [[nodiscard]] int size() const { return backend_->size(); }

 private:
  std::unique_ptr<comm::Backend> backend_;
  std::unique_ptr<checkpoint::Writer> writer_;
  std::unique_ptr<algo::Algorithm> algorithm_;
  std::unique_ptr<comm::GradientBucketer> bucketer_;
};

}  // namespace sinew::train
