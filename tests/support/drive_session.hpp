// The documented loop of train::Session (session.hpp) over a test_support::LinearModel whose forward and
// backward the caller computes: what a PyTorch training script does through the Python package. Used by
// tests/mpi/session_test.cpp and the job tests/mpi/session_driver.cpp.
#pragma once

#include <cstddef>
#include <vector>

#include "flat_workload.hpp"
#include "linear_model.hpp"
#include "sinew/core/error.hpp"
#include "sinew/train/session.hpp"

namespace sinew::test_support {

/// Where the test samples are: indices first + [0, count) of the model's synthetic data.
struct TestSet {
  std::size_t first = 100000;
  std::size_t count = 256;
};

/// Trains until the session is done, recovering in place from every CommFailure; returns finish()'s
/// summary. The injected fault point "backward" fires between forward and backward of a step's first
/// micro-batch ("forward", "allreduce", "optimizer" fire inside the session).
inline train::Summary drive(train::Session& s, const LinearModel& model, FlatWorkload& work,
                            TestSet test = {}) {
  if (!s.start()) return s.finish();  // a hot spare, dismissed at the end
  for (;;) {
    try {
      for (train::Next n = s.next(); n != train::Next::kDone; n = s.next()) {
        if (n == train::Next::kEvaluate) {
          const auto [first, last] = s.begin_evaluation(test.count);
          std::vector<std::size_t> idx;
          for (std::size_t i = first; i < last; ++i) idx.push_back(test.first + i);
          s.end_evaluation(model.evaluate(work.params(), idx), idx.size());
          continue;
        }
        const train::StepPlan& p = s.begin_step();
        double loss = 0;
        for (std::size_t j = 0; j < p.micro_batches; ++j) {
          const auto indices = s.micro_batch(j);
          const bool last = j + 1 == p.micro_batches;
          if (j == 0 && !indices.empty()) s.fault(fault::Point::kBackward);
          loss +=
              model.train(work.params(), work.grads(), indices, static_cast<double>(p.total), j > 0,
                          last ? workload::ReadyFn([&s](Slice r) { s.grad_ready(r); }) : workload::ReadyFn());
        }
        s.end_step(loss);
        if (s.boundary() != train::After::kContinue) break;
      }
      break;
    } catch (const CommFailure& e) {
      s.recover(e);
    }
  }
  return s.finish();
}

}  // namespace sinew::test_support
