// A workload whose caller computes forward and backward itself (the tests' own models): flat parameter
// and gradient vectors the test owns, one of Sinew's optimisers over them, each parameter tensor a
// vector named "t<i>" unless the test names its views. train() and evaluate() are the base class's (the
// caller drives a train::Session, or an algorithm, directly).
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinew/optim/optimizer.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::test_support {

class FlatWorkload final : public workload::Workload {
 public:
  /// `n` parameters (zeros) in the ready ranges `ready` (their order is backward's), with the views
  /// `views` (empty: one vector view per range, "t<i>" in flat order).
  FlatWorkload(std::size_t n, const optim::OptimizerOptions& o, std::vector<Slice> ready = {},
               std::vector<TensorView> views = {})
      : params_(n, 0.f),
        grads_(n, 0.f),
        optimizer_(optim::make_optimizer(o, n)),
        ready_(std::move(ready)),
        views_(std::move(views)) {
    if (ready_.empty()) ready_.push_back({0, n});
    if (views_.empty()) {
      std::vector<Slice> flat = ready_;
      std::sort(flat.begin(), flat.end(), [](Slice a, Slice b) { return a.offset < b.offset; });
      for (std::size_t i = 0; i < flat.size(); ++i) {
        std::string name = "t";  // (not "t" + to_string: GCC 12's -Wrestrict false positive, bug 105329)
        name += std::to_string(i);
        views_.push_back({std::move(name), "params", flat[i].offset, {flat[i].count}, ""});
      }
    }
  }
  /// Over given parameter and gradient values.
  FlatWorkload(std::vector<float> p, std::vector<float> g, const optim::OptimizerOptions& o,
               std::vector<TensorView> views = {})
      : FlatWorkload(p.size(), o, {}, std::move(views)) {
    params_ = std::move(p);
    grads_ = std::move(g);
  }

  [[nodiscard]] std::string describe() const override {
    return "a test's flat workload (" + std::to_string(params_.size()) + " parameters)";
  }
  [[nodiscard]] std::vector<Slice> ready_order() const override { return ready_; }
  [[nodiscard]] std::vector<TensorView> views() const override { return views_; }
  [[nodiscard]] std::span<float> params() override { return params_; }
  [[nodiscard]] std::span<float> grads() override { return grads_; }
  [[nodiscard]] std::string optimizer_name() const override { return optimizer_->name(); }
  [[nodiscard]] NamedSpans optimizer_state() override { return optimizer_->state(); }
  [[nodiscard]] std::int64_t optimizer_steps() const override { return optimizer_->steps(); }
  void set_optimizer_steps(std::int64_t steps) override { optimizer_->set_steps(steps); }
  void optimizer_step(float lr) override { optimizer_->step(params_, grads_, lr); }

  /// The vectors themselves (the spans above are views of them: never reassign, copy into them).
  std::vector<float>& param_vector() { return params_; }
  std::vector<float>& grad_vector() { return grads_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  std::vector<float> params_, grads_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<Slice> ready_;
  std::vector<TensorView> views_;
};

}  // namespace sinew::test_support
