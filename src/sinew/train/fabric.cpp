#include "sinew/train/fabric.hpp"

#include "sinew/checkpoint/writer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/membership/group.hpp"

namespace sinew::train {

Fabric::Fabric(const membership::Group& group, const FabricSetup& s)
    : backend_(std::make_unique<comm::mpi::MpiBackend>(group.comm())) {
  if (!s.checkpoint_dir.empty()) {
    checkpoint::WriterOptions wo;
    wo.keep = s.checkpoint_keep;
    wo.op = s.op;
    wo.faults = s.faults;
    writer_ = std::make_unique<checkpoint::Writer>(s.checkpoint_dir, *backend_, wo);
  }
  algo::Context ctx{*backend_, s.params, s.grads, *s.optimizer, s.op, s.compute_ms, s.algorithm_event};
  algorithm_ = algo::make_algorithm(s.algorithm, std::move(ctx));
  comm::BucketOptions bo;
  bo.bucket_bytes = static_cast<std::size_t>(s.bucket_mb * (1 << 20));
  bo.overlap = s.overlap;
  bo.op = s.op;
  if (!algorithm_->uses_backend_allreduce()) {
    bo.reduce = [a = algorithm_.get()](std::span<float> b, std::size_t offset) {
      a->reduce_bucket(b, offset);
    };
  }
  bucketer_ = std::make_unique<comm::GradientBucketer>(*backend_, s.grads, s.grad_ready_order, std::move(bo));
}

Fabric::~Fabric() = default;

void Fabric::abort() noexcept { backend_->abort(); }

}  // namespace sinew::train
