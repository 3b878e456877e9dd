// The driver of train::Session (driver.hpp) over a test_support::LinearModel whose forward and
// backward the caller computes: what a PyTorch training script does through the Python package. Used by
// tests/mpi/session_test.cpp and the job tests/mpi/session_driver.cpp.
#pragma once

#include <cstddef>
#include <vector>

#include "flat_workload.hpp"
#include "linear_model.hpp"
#include "sinew/core/error.hpp"
#include "sinew/train/driver.hpp"
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
  train::Driver d(s, test.count);
  return d.run(
      [&](const train::Task& t) {
        if (t.micro_batch == 0 && !t.indices.empty()) s.fault(fault::Point::kBackward);
        return model.train(work.params(), work.grads(), t.indices, static_cast<double>(t.total),
                           t.micro_batch > 0,
                           t.last_micro_batch() ? workload::ReadyFn([&s](Slice r) { s.grad_ready(r); })
                                                : workload::ReadyFn());
      },
      [&](std::size_t first, std::size_t last) {
        std::vector<std::size_t> idx;
        for (std::size_t i = first; i < last; ++i) idx.push_back(test.first + i);
        return model.evaluate(work.params(), idx);
      });
}

}  // namespace sinew::test_support
