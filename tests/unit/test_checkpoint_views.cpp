// Per-layer views of a manifest (checkpoint/views.hpp): written into small HDF5 files and read back with
// the plain HDF5 C API, as a reader outside Sinew would; the model's views and description, checked by a
// forward pass that uses nothing but them; and the errors of bad views.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/checkpoint/views.hpp"
#include "sinew/core/error.hpp"
#include "sinew/model/model.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {
namespace {

using json = nlohmann::json;

class CheckpointViews : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / (std::string("sinew_views_") + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    h5::quiet();
  }
  void TearDown() override { fs::remove_all(dir_); }

  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// A new file on disk holding tensors/<name> (a regular dataset) for each entry of `tensors`.
  h5::Handle create(const std::string& file, const std::map<std::string, std::vector<float>>& tensors) {
    h5::Handle f(H5Fcreate(path(file).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    EXPECT_GE(f.get(), 0);
    for (const auto& [name, data] : tensors)
      h5::write_floats(f.get(), "tensors/" + name, data.data(), data.size(), file);
    return f;
  }
  [[nodiscard]] h5::Handle open(const std::string& file) const {
    h5::Handle f(H5Fopen(path(file).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    EXPECT_GE(f.get(), 0) << file;
    return f;
  }

  fs::path dir_;
};

std::vector<float> iota(std::size_t n, float start = 0) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::map<std::string, std::uint64_t> sizes_of(const std::map<std::string, std::vector<float>>& tensors) {
  std::map<std::string, std::uint64_t> sizes;
  for (const auto& [name, data] : tensors) sizes[name] = data.size();
  return sizes;
}

/// A dataset as a plain HDF5 reader sees it: its dimensions and its elements in C order.
struct Array {
  std::vector<std::uint64_t> shape;
  std::vector<float> data;
};
Array read_array(hid_t f, const std::string& name) {
  Array a;
  h5::Handle ds(H5Dopen2(f, name.c_str(), H5P_DEFAULT), H5Dclose);
  EXPECT_GE(ds.get(), 0) << name;
  if (ds.get() < 0) return a;
  h5::Handle space(H5Dget_space(ds.get()), H5Sclose);
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.get())));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  a.shape.assign(dims.begin(), dims.end());
  a.data.resize(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.get())));
  EXPECT_GE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data.data()), 0) << name;
  return a;
}

/// Expects write_views() to throw a CheckpointError whose message has every one of `parts`.
void expect_error(hid_t f, const std::vector<TensorView>& views,
                  const std::map<std::string, std::uint64_t>& sizes, const std::vector<std::string>& parts,
                  const std::string& model_json = {}) {
  try {
    write_views(f, views, sizes, "m.h5", model_json);
    ADD_FAILURE() << "no error; expected one naming " << parts.front();
  } catch (const CheckpointError& e) {
    for (const auto& p : parts)
      EXPECT_NE(e.message().find(p), std::string::npos) << e.message() << " lacks " << p;
    EXPECT_NE(e.message().find("m.h5"), std::string::npos) << e.message();
  }
}

TEST_F(CheckpointViews, ShapedViewsReadBackWithPlainHdf5) {
  const std::map<std::string, std::vector<float>> tensors = {{"params", iota(20)},
                                                             {"optim/momentum", iota(20, 100)}};
  const std::vector<TensorView> views = {
      {"fc1/weight", "params", 2, {2, 3}, "y = x @ weight + bias"},
      {"fc1/bias", "params", 8, {3}, "bias"},
      {"conv1/weight", "params", 11, {1, 2, 2, 2}, "conv"},
      {"momentum/fc1", "optim/momentum", 14, {3, 2}, "deep"},
  };
  {
    h5::Handle f = create("m.h5", tensors);
    write_views(f.get(), views, sizes_of(tensors), "m.h5");
  }
  h5::Handle f = open("m.h5");
  for (const auto& v : views) {
    const Array a = read_array(f.get(), "model/" + v.name);
    EXPECT_EQ(a.shape, v.shape) << v.name;
    const auto& t = tensors.at(v.tensor);
    const std::vector<float> expected(t.begin() + static_cast<std::ptrdiff_t>(v.offset),
                                      t.begin() + static_cast<std::ptrdiff_t>(v.offset + a.data.size()));
    EXPECT_EQ(a.data, expected) << v.name;
    h5::Handle ds(H5Dopen2(f.get(), ("model/" + v.name).c_str(), H5P_DEFAULT), H5Dclose);
    EXPECT_EQ(h5::read_attr_string(ds.get(), "tensor", "m.h5"), v.tensor);
    EXPECT_EQ(h5::read_attr_u64(ds.get(), "offset", "m.h5"), v.offset);
    EXPECT_EQ(h5::read_attr_string(ds.get(), "layout", "m.h5"), v.layout);
  }
  // Read back in (tensor, offset) order: optim/momentum's view first. No description was written.
  const ModelViews back = read_views(f.get(), "m.h5");
  EXPECT_TRUE(back.model_json.empty());
  ASSERT_EQ(back.views.size(), views.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    const TensorView& v = views[(i + 3) % views.size()];
    EXPECT_EQ(back.views[i].name, v.name);
    EXPECT_EQ(back.views[i].tensor, v.tensor);
    EXPECT_EQ(back.views[i].offset, v.offset);
    EXPECT_EQ(back.views[i].shape, v.shape);
    EXPECT_EQ(back.views[i].layout, v.layout);
  }
}

// The manifest's tensors are themselves virtual, over the shard files: a view that straddles two shards
// reads through both mappings.
TEST_F(CheckpointViews, ViewsOverAVirtualTensorSpanningShards) {
  const std::vector<float> all = iota(10, 1);
  for (int r = 0; r < 2; ++r) {
    const auto half = static_cast<std::ptrdiff_t>(all.size() / 2);
    const std::vector<float> part(all.begin() + r * half, all.begin() + (r + 1) * half);
    create("shard" + std::to_string(r) + ".h5", {{"params", part}});
  }
  {
    h5::Handle f(H5Fcreate(path("m.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    const hsize_t n = all.size(), half = 5;
    h5::Handle vspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
    h5::Handle src(H5Screate_simple(1, &half, nullptr), H5Sclose);
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    for (int r = 0; r < 2; ++r) {
      const hsize_t start = r * half;
      h5::Handle sel(H5Scopy(vspace.get()), H5Sclose);
      H5Sselect_hyperslab(sel.get(), H5S_SELECT_SET, &start, nullptr, &half, nullptr);
      ASSERT_GE(H5Pset_virtual(dcpl.get(), sel.get(), ("shard" + std::to_string(r) + ".h5").c_str(),
                               "/tensors/params", src.get()),
                0);
    }
    h5::Handle ds(H5Dcreate2(f.get(), "tensors/params", H5T_IEEE_F32LE, vspace.get(),
                             h5::intermediate_groups().get(), dcpl.get(), H5P_DEFAULT),
                  H5Dclose);
    ASSERT_GE(ds.get(), 0);
    write_views(f.get(), {{"fc1/weight", "params", 3, {2, 2}, "across"}}, {{"params", all.size()}}, "m.h5");
  }
  h5::Handle f = open("m.h5");
  const Array a = read_array(f.get(), "model/fc1/weight");
  EXPECT_EQ(a.shape, (std::vector<std::uint64_t>{2, 2}));
  EXPECT_EQ(a.data,
            (std::vector<float>{4, 5, 6, 7}));  // elements 3..6: the last two of shard 0, two of shard 1
}

/// Element i of v (a signed index: the loops below step over padding).
template <class V>
auto& at(V& v, std::ptrdiff_t i) {
  return v[static_cast<std::size_t>(i)];
}

/// The forward pass of one sample as a reader outside Sinew runs it, from the model description and the
/// views alone, with the layouts they document. x: one sample, (channels, height, width) in C order.
std::vector<float> forward_from_views(const json& model, const std::map<std::string, Array>& views,
                                      std::vector<float> x) {
  using Dims = std::vector<std::ptrdiff_t>;
  for (const json& l : model["layers"]) {
    const std::string kind = l["kind"];
    const auto in = l["input_shape"].get<Dims>();
    const auto out = l["output_shape"].get<Dims>();
    std::vector<float> y(static_cast<std::size_t>(out[0] * out[1] * out[2]));
    if (kind == "linear") {  // y = x @ weight + bias, weight (in, out)
      const Array& w = views.at(l["params"]["weight"]);
      const Array& b = views.at(l["params"]["bias"]);
      const std::size_t n_out = y.size();
      EXPECT_EQ(w.shape, (std::vector<std::uint64_t>{x.size(), n_out}));
      for (std::size_t o = 0; o < n_out; ++o) {
        double s = b.data[o];
        for (std::size_t i = 0; i < x.size(); ++i) s += double{x[i]} * w.data[i * n_out + o];
        y[o] = static_cast<float>(s);
      }
    } else if (kind == "conv2d") {  // weight (in_channels, k, k, out_channels), stride 1, zero padding
      const Array& w = views.at(l["params"]["weight"]);
      const Array& b = views.at(l["params"]["bias"]);
      const std::ptrdiff_t k = l["kernel"], pad = l["padding"], c_in = in[0], h = in[1], wd = in[2];
      const std::ptrdiff_t c_out = out[0], oh = out[1], ow = out[2];
      EXPECT_EQ(l["stride"], 1);
      const Dims w_shape(w.shape.begin(), w.shape.end());
      EXPECT_EQ(w_shape, (Dims{c_in, k, k, c_out}));
      for (std::ptrdiff_t o = 0; o < c_out; ++o) {
        for (std::ptrdiff_t i = 0; i < oh; ++i) {
          for (std::ptrdiff_t j = 0; j < ow; ++j) {
            double s = at(b.data, o);
            for (std::ptrdiff_t c = 0; c < c_in; ++c) {
              for (std::ptrdiff_t ky = 0; ky < k; ++ky) {
                for (std::ptrdiff_t kx = 0; kx < k; ++kx) {
                  const std::ptrdiff_t yy = i + ky - pad, xx = j + kx - pad;
                  if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                  s +=
                      double{at(x, (c * h + yy) * wd + xx)} * at(w.data, ((c * k + ky) * k + kx) * c_out + o);
                }
              }
            }
            at(y, (o * oh + i) * ow + j) = static_cast<float>(s);
          }
        }
      }
    } else if (kind == "relu") {
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::max(x[i], 0.f);
    } else if (kind == "maxpool2d") {  // 2x2 windows, stride 2
      EXPECT_EQ(l["kernel"], 2);
      const std::ptrdiff_t h = in[1], wd = in[2];
      for (std::ptrdiff_t c = 0; c < out[0]; ++c) {
        for (std::ptrdiff_t i = 0; i < out[1]; ++i) {
          for (std::ptrdiff_t j = 0; j < out[2]; ++j) {
            float m = -INFINITY;
            for (std::ptrdiff_t d = 0; d < 4; ++d)
              m = std::max(m, at(x, (c * h + 2 * i + d / 2) * wd + 2 * j + d % 2));
            at(y, (c * out[1] + i) * out[2] + j) = m;
          }
        }
      }
    } else {
      ADD_FAILURE() << "unknown layer kind " << kind;
    }
    x = std::move(y);
  }
  return x;
}

// A model's views and description, as ReplicatedState::snapshot() and the manifest writer store them: written
// into a file, read back with plain HDF5 and used for a forward pass that must give the model's logits.
TEST_F(CheckpointViews, ModelViewsRebuildTheForwardPass) {
  for (const std::string spec : {"mlp:12,7", "cnn", "logreg"}) {
    SCOPED_TRACE(spec);
    const model::Shape input{2, 6, 5};  // odd width: max pooling drops the last column
    model::Model net = model::Model::build(spec, input, 4, 7);
    const auto params = net.params();
    const std::map<std::string, std::vector<float>> tensors = {
        {"params", std::vector<float>(params.begin(), params.end())}};
    std::vector<TensorView> views;
    for (const TensorView& v : net.param_views()) {
      views.push_back({v.name, "params", v.offset, {v.shape.begin(), v.shape.end()}, v.layout});
    }
    const std::string file = "m-" + std::string(1, spec[0]) + ".h5";
    {
      h5::Handle f = create(file, tensors);
      write_views(f.get(), views, sizes_of(tensors), file, net.description_json());
    }
    h5::Handle f = open(file);
    const ModelViews back = read_views(f.get(), file);
    EXPECT_EQ(back.model_json, net.description_json());
    ASSERT_EQ(back.views.size(), views.size());

    // As a reader outside Sinew: the attributes of model/ and the datasets they name.
    h5::Handle group(H5Gopen2(f.get(), "model", H5P_DEFAULT), H5Gclose);
    EXPECT_EQ(h5::read_attr_string(group.get(), "spec", file), spec);
    EXPECT_EQ(h5::read_attr_u64s(group.get(), "input_shape", file), (std::vector<std::uint64_t>{2, 6, 5}));
    EXPECT_EQ(h5::read_attr_u64(group.get(), "num_classes", file), 4u);
    const json model = {{"layers", json::parse(h5::read_attr_string(group.get(), "layers", file))}};
    std::map<std::string, Array> arrays;
    for (const json& l : model["layers"]) {
      for (const auto& [param, name] : l["params"].items()) {
        arrays[name.get<std::string>()] = read_array(f.get(), "model/" + name.get<std::string>());
      }
    }
    EXPECT_EQ(arrays.size(), views.size());

    const model::Matrix x = model::Matrix::Random(input.size(), 3);
    const model::Matrix& logits = net.forward(x);
    for (Eigen::Index s = 0; s < x.cols(); ++s) {
      const std::vector<float> sample(x.col(s).data(), x.col(s).data() + x.rows());
      const std::vector<float> y = forward_from_views(model, arrays, sample);
      ASSERT_EQ(y.size(), 4u);
      for (std::size_t c = 0; c < y.size(); ++c) {
        EXPECT_NEAR(y[c], logits(static_cast<Eigen::Index>(c), s), 1e-4f * (1 + std::abs(y[c])))
            << "class " << c;
      }
    }
  }
}

TEST_F(CheckpointViews, ModelNamesLayersAndCoversItsParametersOnce) {
  const model::Model net = model::Model::build("cnn", {1, 28, 28}, 10, 1);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < net.num_layers(); ++i) names.push_back(net.layer_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc1",
                                             "relu3", "fc2"}));
  std::size_t next = 0;
  for (const TensorView& v : net.param_views()) {
    EXPECT_EQ(v.offset, next) << v.name;
    next += std::accumulate(v.shape.begin(), v.shape.end(), std::size_t{1}, std::multiplies<>());
  }
  EXPECT_EQ(next, net.num_params());
  const auto views = net.param_views();
  ASSERT_EQ(views.size(), 8u);
  EXPECT_EQ(views[0].name, "conv1/weight");
  EXPECT_EQ(views[0].shape, (std::vector<std::size_t>{1, 3, 3, 16}));
  EXPECT_EQ(views[4].name, "fc1/weight");  // over the flattened 32 x 7 x 7 output of pool2
  EXPECT_EQ(views[4].shape, (std::vector<std::size_t>{1568, 128}));
  EXPECT_EQ(views[7].name, "fc2/bias");
}

TEST_F(CheckpointViews, OlderManifestsHaveNoViews) {
  h5::Handle f = create("m.h5", {{"params", iota(4)}});
  const ModelViews back = read_views(f.get(), "m.h5");
  EXPECT_TRUE(back.views.empty());
  EXPECT_TRUE(back.model_json.empty());
  write_views(f.get(), {}, {{"params", 4}}, "m.h5");  // nothing to write: no group either
  EXPECT_EQ(H5Lexists(f.get(), "model", H5P_DEFAULT), 0);
}

TEST_F(CheckpointViews, BadViewsAreRefusedNamingThem) {
  const std::map<std::string, std::vector<float>> tensors = {{"params", iota(10)}};
  h5::Handle f = create("m.h5", tensors);
  const auto sizes = sizes_of(tensors);
  expect_error(f.get(), {{"fc1/weight", "params", 4, {2, 4}, ""}}, sizes,
               {"fc1/weight", "runs past", "params"});
  expect_error(f.get(), {{"fc1/weight", "params", 11, {1}, ""}}, sizes, {"fc1/weight", "runs past"});
  expect_error(f.get(), {{"fc1/weight", "params", 0, {1ULL << 40, 1ULL << 40}, ""}}, sizes, {"fc1/weight"});
  expect_error(f.get(), {{"fc1/weight", "optim/momentum", 0, {2}, ""}}, sizes,
               {"fc1/weight", "optim/momentum", "does not have"});
  expect_error(f.get(), {{"fc1/weight", "params", 0, {}, ""}}, sizes, {"fc1/weight", "dimensions"});
  expect_error(f.get(), {{"fc1/weight", "params", 0, {2, 0}, ""}}, sizes, {"fc1/weight", "shape (2, 0)"});
  for (const std::string bad : {"", "/fc1", "fc1/", "fc1//w", "fc1/../w", "a\nb"}) {
    expect_error(f.get(), {{bad, "params", 0, {1}, ""}}, sizes, {"cannot name a view"});
  }
  expect_error(f.get(), {{"fc1/b", "params", 0, {1}, ""}, {"fc1/b", "params", 1, {1}, ""}}, sizes,
               {"two views are named 'fc1/b'"});
  // The tensor sizes must be those of the manifest's datasets.
  expect_error(f.get(), {{"fc1/b", "params", 0, {1}, ""}}, {{"params", 12}}, {"tensors/params", "fc1/b"});
  // A description must be one and name only views that exist.
  const std::vector<TensorView> ok = {{"fc1/b", "params", 0, {1}, ""}};
  expect_error(f.get(), ok, sizes, {"not a JSON object"}, "[1, 2");
  expect_error(f.get(), ok, sizes, {"\"spec\""}, R"({"layers": []})");
  const std::string missing =
      R"({"spec": "x", "input_shape": [1, 1, 1], "num_classes": 1, "layers": [{"name": "fc1", "kind": "linear",)"
      R"( "params": {"weight": "fc1/w"}}]})";
  expect_error(f.get(), ok, sizes, {"'\"fc1/w\"'", "weight", "fc1"}, missing);
  // Nothing was written by the refused calls.
  EXPECT_EQ(H5Lexists(f.get(), "model", H5P_DEFAULT), 0);
}

TEST_F(CheckpointViews, ReadRefusesAViewWhoseMappingDisagreesWithItsAttributes) {
  {
    h5::Handle f = create("m.h5", {{"params", iota(10)}});
    write_views(f.get(), {{"fc1/weight", "params", 2, {2, 2}, ""}}, {{"params", 10}}, "m.h5");
    h5::Handle ds(H5Dopen2(f.get(), "model/fc1/weight", H5P_DEFAULT), H5Dclose);
    ASSERT_GE(H5Adelete(ds.get(), "offset"), 0);
    h5::write_attr(ds.get(), "offset", std::uint64_t{3}, "m.h5");
  }
  h5::Handle f = open("m.h5");
  try {
    (void)read_views(f.get(), "m.h5");
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.message().find("fc1/weight"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("not mapped"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace sinew::checkpoint
