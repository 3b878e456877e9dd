// sinew._core: the Python binding of Sinew's PyTorch integration (src/sinew/torch). The Python package
// (python/sinew) is a thin layer over it; the runtime, the training loop and the recovery are the C++ ones.
#include <ATen/ATen.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/torch/job.hpp"
#include "sinew/torch/workload.hpp"
#include "sinew/train/session.hpp"

namespace py = pybind11;
using namespace sinew;

namespace {

std::vector<pytorch::NamedTensor> named(const std::vector<std::pair<std::string, at::Tensor>>& items) {
  std::vector<pytorch::NamedTensor> out;
  out.reserve(items.size());
  for (const auto& [name, t] : items) out.push_back({name, t});
  return out;
}

/// The run's summary as the metrics' done event has it, with `left` and `exit_code`.
py::dict summary_dict(const train::Summary& s) {
  nlohmann::json j = train::to_json(s);
  j.erase("event");
  j["left"] = s.left;
  j["exit_code"] = s.exit_code();
  return py::module_::import("json").attr("loads")(j.dump());
}

/// The samples as an N x C x H x W float32 tensor.
at::Tensor features(const data::Dataset& d) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(d.size()), d.channels, d.height, d.width}, at::kFloat);
  std::copy(d.features.begin(), d.features.end(), t.data_ptr<float>());
  return t;
}

/// The labels as an int64 tensor (what torch's losses take).
at::Tensor labels(const data::Dataset& d) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(d.size())}, at::kLong);
  std::copy(d.labels.begin(), d.labels.end(), t.data_ptr<std::int64_t>());
  return t;
}

/// The CommFailure last handed to Python as sinew.CommFailure (Job.recover() recovers from it).
std::exception_ptr& last_failure() {
  static std::exception_ptr p;
  return p;
}

pytorch::Steps steps_of(
    const std::function<double(std::vector<std::size_t>)>& train,
    const std::function<std::pair<double, std::size_t>(std::size_t, std::size_t)>& evaluate,
    std::size_t test_size) {
  // The callbacks run Python: pybind11's function wrapper takes the GIL for each call.
  pytorch::Steps steps;
  if (train) {
    steps.train = [train](std::span<const std::size_t> idx) {
      return train(std::vector<std::size_t>(idx.begin(), idx.end()));
    };
  }
  if (evaluate) {
    steps.evaluate = [evaluate](std::size_t first, std::size_t last) {
      const auto [loss, correct] = evaluate(first, last);
      return workload::EvalSums{loss, correct};
    };
  }
  steps.test_size = test_size;
  return steps;
}

train::Session& session_of(pytorch::Job& job) {
  train::Session* s = job.session();
  if (s == nullptr) SINEW_THROW(InvalidArgument, "the job has not started training yet");
  return *s;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Sinew's elastic runtime for PyTorch models (C++ core)";
  // Sinew's errors keep their exit code (docs/usage.md): the Python layer exits with it.
  // (The type objects live as long as the module: handles, never decremented at exit.)
  static const py::handle error = py::exception<Error>(m, "Error").release();
  // A rank failure: the Python layer calls Job.recover(), which recovers from the failure kept here.
  static const py::handle comm_failure = py::exception<CommFailure>(m, "CommFailure", error).release();
  // The other kinds, by their exit code (docs/usage.md): a script can catch the one it cares about.
  static const py::handle usage_error = py::exception<InvalidArgument>(m, "UsageError", error).release();
  static const py::handle data_error = py::exception<DataError>(m, "DataError", error).release();
  static const py::handle checkpoint_error =
      py::exception<CheckpointError>(m, "CheckpointError", error).release();
  static const py::handle relaunch = py::exception<RelaunchRequest>(m, "RelaunchRequest", error).release();
  py::register_exception_translator(
      [](std::exception_ptr p) {  // NOLINT(performance-unnecessary-value-param): pybind11's signature
        const auto raise = [](py::handle type, const Error& e) {
          py::object exc = py::reinterpret_borrow<py::object>(type)(e.what());
          exc.attr("exit_code") = static_cast<int>(e.exit_code());
          PyErr_SetObject(type.ptr(), exc.ptr());
        };
        try {
          if (p) std::rethrow_exception(p);
        } catch (const CommFailure& e) {
          last_failure() = p;
          raise(comm_failure, e);
        } catch (const InvalidArgument& e) {
          raise(usage_error, e);
        } catch (const DataError& e) {
          raise(data_error, e);
        } catch (const CheckpointError& e) {
          raise(checkpoint_error, e);
        } catch (const RelaunchRequest& e) {
          raise(relaunch, e);
        } catch (const Error& e) {
          raise(error, e);
        }
      });

  py::class_<pytorch::TorchWorkload>(m, "Workload")
      .def(py::init([](const std::vector<std::pair<std::string, at::Tensor>>& params,
                       const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                       const pytorch::Job& job, std::string model) {
             // --shard: known before the script's optimiser is adopted (per shard, then).
             if (job.config().shard != train::ShardStage::kNone) {
               return std::make_unique<pytorch::TorchWorkload>(
                   named(params), named(buffers), job.optimizer(), std::move(model),
                   pytorch::TorchWorkload::Sharded{job.config().shard == train::ShardStage::kParameters});
             }
             return std::make_unique<pytorch::TorchWorkload>(named(params), named(buffers), job.optimizer(),
                                                             std::move(model));
           }),
           py::arg("params"), py::arg("buffers"), py::arg("job"), py::arg("model"))
      .def("describe", &pytorch::TorchWorkload::describe)
      .def_property_readonly("flat_params", &pytorch::TorchWorkload::flat_params)
      .def_property_readonly("flat_grads", &pytorch::TorchWorkload::flat_grads)
      .def_property_readonly("host_params", &pytorch::TorchWorkload::host_params)
      .def_property_readonly("host_grads", &pytorch::TorchWorkload::host_grads)
      .def("unreported", &pytorch::TorchWorkload::unreported)
      .def("zero_grads", &pytorch::TorchWorkload::zero_grads)
      .def(
          "use_optimizer",
          [](pytorch::TorchWorkload& w, std::string name,
             const std::vector<std::pair<std::string, at::Tensor>>& state, std::function<void(float)> step,
             std::function<std::int64_t()> steps, std::function<void(std::int64_t)> set_steps,
             std::function<void()> relayout) {
            // The functions run Python: pybind11's function wrapper takes the GIL for each call.
            w.use_optimizer({std::move(name), named(state), std::move(step), std::move(steps),
                             std::move(set_steps), std::move(relayout)});
          },
          py::arg("name"), py::arg("state"), py::arg("step"), py::arg("steps"), py::arg("set_steps"),
          py::arg("relayout") = py::none())
      .def_property_readonly("sharded", [](const pytorch::TorchWorkload& w) { return !w.has_optimizer(); })
      .def(
          "use_sharded_optimizer",
          [](pytorch::TorchWorkload& w, std::string name, const py::function& make) {
            // The factory is Python: held through a shared pointer whose last owner takes the GIL to drop it,
            // so that copies of the C++ function never touch Python's reference counts without it.
            std::shared_ptr<py::function> fn(new py::function(make), [](py::function* f) {
              py::gil_scoped_acquire gil;
              delete f;
            });
            w.use_sharded_optimizer(std::move(name), [fn](Slice r, const optim::StatePlacement& place) {
              py::gil_scoped_acquire gil;
              // (place: None, or a reshard's buffers' page offsets, optim::StatePlacement)
              const py::object where = place.overwritten ? py::cast(place.page_offset) : py::none();
              const py::tuple t = (*fn)(r.offset, r.count, where);
              pytorch::ExternalOptimizer o;
              o.state = named(t[0].cast<std::vector<std::pair<std::string, at::Tensor>>>());
              o.step = t[1].cast<std::function<void(float)>>();
              o.steps = t[2].cast<std::function<std::int64_t()>>();
              o.set_steps = t[3].cast<std::function<void(std::int64_t)>>();
              return o;
            });
          },
          py::arg("name"), py::arg("make"))
      .def("also_keep", &pytorch::TorchWorkload::also_keep, py::arg("tensors"))
      .def("restore_buffers", &pytorch::TorchWorkload::restore_buffers)
      .def("set_backward_done", &pytorch::TorchWorkload::set_backward_done, py::arg("fn"))
      .def("set_extra_state", &pytorch::TorchWorkload::set_extra_state, py::arg("provider"))
      .def("set_extra_loader", &pytorch::TorchWorkload::set_extra_loader, py::arg("loader"));

  py::class_<pytorch::Job>(m, "Job")
      .def(py::init<const std::vector<std::string>&, std::vector<std::string>>(), py::arg("options"),
           py::arg("command"))
      .def_property_readonly("help", &pytorch::Job::help)
      .def_property_readonly("rank", &pytorch::Job::rank)
      .def_property_readonly("size", &pytorch::Job::size)
      .def_property_readonly(
          "step",
          [](pytorch::Job& j) -> std::int64_t { return j.session() != nullptr ? j.session()->step() : 0; })
      .def_property_readonly("epochs", [](const pytorch::Job& j) { return j.config().epochs; })
      .def_property_readonly("batch_size", [](const pytorch::Job& j) { return j.config().batch_size; })
      .def_property_readonly("shuffle", [](const pytorch::Job& j) { return j.config().shuffle; })
      .def(
          "run",
          [](pytorch::Job& job, pytorch::TorchWorkload& work, std::size_t train_size,
             const std::function<double(std::vector<std::size_t>)>& train,
             const std::function<std::pair<double, std::size_t>(std::size_t, std::size_t)>& evaluate,
             std::size_t test_size) {
            const pytorch::Steps steps = steps_of(train, evaluate, test_size);
            train::Summary s;
            {
              py::gil_scoped_release nogil;  // collectives, the communication thread, recovery
              s = job.run(work, train_size, steps);
            }
            return summary_dict(s);
          },
          py::arg("workload"), py::arg("train_size"), py::arg("train"), py::arg("evaluate"),
          py::arg("test_size"))
      .def(
          "start",
          [](pytorch::Job& job, pytorch::TorchWorkload& work, std::size_t train_size,
             const std::function<double(std::vector<std::size_t>)>& train,
             const std::function<std::pair<double, std::size_t>(std::size_t, std::size_t)>& evaluate,
             std::size_t test_size) {
            // Kept by the job for its life (--algorithm auto's measure, the evaluation).
            const pytorch::Steps steps = steps_of(train, evaluate, test_size);
            py::gil_scoped_release nogil;
            return job.start(work, train_size, steps);
          },
          py::arg("workload"), py::arg("train_size"), py::arg("train"), py::arg("evaluate"),
          py::arg("test_size"))
      .def(
          "next",
          [](pytorch::Job& job, double loss) -> py::object {
            std::optional<pytorch::MicroBatch> b;
            {
              py::gil_scoped_release nogil;
              b = job.next(loss);
            }
            if (!b) return py::none();
            return py::make_tuple(std::vector<std::size_t>(b->indices.begin(), b->indices.end()), b->index,
                                  b->count, b->step, b->epoch);
          },
          py::arg("loss"))
      // ---- the script's own loop (python/sinew/__init__.py: the DDP-style loop) ----
      .def("start_loop", &pytorch::Job::start_loop, py::arg("workload"), py::arg("train_size"),
           py::arg("batch_size"), py::arg("epochs"), py::arg("shuffle"),
           py::call_guard<py::gil_scoped_release>())
      .def("settle", &pytorch::Job::settle, py::call_guard<py::gil_scoped_release>())
      .def("begin",
           [](pytorch::Job& job) {
             pytorch::MicroBatch b;
             {
               py::gil_scoped_release nogil;
               b = job.begin();
             }
             return py::make_tuple(std::vector<std::size_t>(b.indices.begin(), b.indices.end()), b.step,
                                   b.epoch);
           })
      .def("reduce", &pytorch::Job::reduce, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("sharded_parameters", &pytorch::Job::sharded_parameters)
      .def_property_readonly(
          "shard",
          [](const pytorch::Job& j) { return std::string(name_of(train::kShardNames, j.config().shard)); })
      .def_property_readonly("shard_replicas",
                             [](const pytorch::Job& j) { return j.config().shard_replicas; })
      .def("keep_sharded_at_end", &pytorch::Job::keep_sharded_at_end)
      .def_property_readonly("kept_sharded", &pytorch::Job::kept_sharded)
      .def_property_readonly("checkpoint_dir",
                             [](const pytorch::Job& j) { return j.config().checkpoint_dir; })
      .def_property_readonly("residual_per_parameter",
                             [](const pytorch::Job& j) {
                               // bytegrad's error feedback: a float per parameter, whatever the stage
                               const auto& c = j.config();
                               return c.algorithm == algo::Kind::kByteGrad && c.error_feedback ? 1 : 0;
                             })
      .def(
          "gather_params",
          [](pytorch::Job& j, const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
             std::uint64_t ticket) {
            std::vector<Slice> r;
            for (const auto& [o, c] : ranges) r.push_back({o, c});
            py::gil_scoped_release unlocked;
            j.gather_params(r, ticket);
          },
          py::arg("ranges"), py::arg("ticket") = 0)
      .def(
          "gather_rows",
          [](pytorch::Job& j, std::pair<std::size_t, std::size_t> table, std::size_t width,
             const std::vector<std::int64_t>& rows) {
            py::gil_scoped_release unlocked;
            j.gather_rows({table.first, table.second}, width, rows);
          },
          py::arg("table"), py::arg("width"), py::arg("rows"))
      .def(
          "prefetch_params",
          [](pytorch::Job& j, const std::vector<std::pair<std::size_t, std::size_t>>& ranges) {
            std::vector<Slice> r;
            for (const auto& [o, c] : ranges) r.push_back({o, c});
            return j.prefetch_params(r);
          },
          py::arg("ranges"))
      .def_property_readonly("shard_prefetch",
                             [](const pytorch::Job& j) { return j.config().shard_prefetch; })
      .def(
          "release_params",
          [](pytorch::Job& j, const std::vector<std::pair<std::size_t, std::size_t>>& ranges) {
            std::vector<Slice> r;
            for (const auto& [o, c] : ranges) r.push_back({o, c});
            j.release_params(r);
          },
          py::arg("ranges"))
      .def("sharded_gradients",
           [](const pytorch::Job& j) {
             std::vector<std::pair<std::size_t, std::size_t>> r;
             for (const Slice s : j.sharded_gradients()) r.emplace_back(s.offset, s.count);
             return r;
           })
      .def("update", &pytorch::Job::update, py::arg("loss"),
           py::arg("lr") = std::numeric_limits<double>::quiet_NaN(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("phase", &pytorch::Job::phase)
      .def("peek", &pytorch::Job::peek, py::arg("ahead"), py::call_guard<py::gil_scoped_release>())
      .def(
          "share",
          [](pytorch::Job& job, const py::bytes& data, bool have) {
            std::string in = data;
            std::string out;
            {
              py::gil_scoped_release nogil;
              out = session_of(job).share(in, have);
            }
            return py::bytes(out);
          },
          py::arg("data"), py::arg("have"))
      .def(
          "allreduce",
          [](pytorch::Job& job, std::vector<double> values, bool max) {
            {
              py::gil_scoped_release nogil;
              session_of(job).allreduce(values, max);
            }
            return values;
          },
          py::arg("values"), py::arg("max") = false)
      .def_property_readonly("group_epoch",
                             [](pytorch::Job& j) -> std::uint64_t { return session_of(j).group_epoch(); })
      .def_property_readonly(
          "joined",
          [](pytorch::Job& j) { return session_of(j).group().role() == membership::Role::kRecovered; })
      .def_property_readonly(
          "session_epoch",
          [](pytorch::Job& j) -> std::int64_t { return j.session() != nullptr ? j.session()->epoch() : 0; })
      .def("recover",
           [](pytorch::Job& job) {
             std::exception_ptr p = std::exchange(last_failure(), nullptr);
             if (!p) SINEW_THROW(InvalidArgument, "Job.recover(): no rank failure to recover from");
             py::gil_scoped_release nogil;
             try {
               std::rethrow_exception(p);
             } catch (const CommFailure& e) {
               job.recover(e);
             }
           })
      .def("finish",
           [](pytorch::Job& job) {
             train::Summary s;
             {
               py::gil_scoped_release nogil;
               s = job.finish();
             }
             return summary_dict(s);
           })
      .def("dataset",
           [](const pytorch::Job& job) {
             const data::DataSplit d = job.dataset();
             return py::make_tuple(features(d.train), labels(d.train), features(d.test), labels(d.test),
                                   d.description);
           })
      .def("exit", &pytorch::Job::exit, py::arg("code"), py::call_guard<py::gil_scoped_release>());
}
