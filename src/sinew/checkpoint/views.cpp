#include "sinew/checkpoint/views.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/core/error.hpp"

namespace sinew::checkpoint {

namespace {

using json =
    nlohmann::ordered_json;  // keys in the order written, so that a description reads back as written

constexpr const char* kGroup = "model";
constexpr int kMaxDepth = 8;  // of the names below model/ ("fc1/weight" has depth 2)

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

/// Elements of a view of `shape`; throws naming the view for an empty shape, a zero extent or an overflow.
std::uint64_t elements(const TensorView& v, const std::string& file) {
  if (v.shape.empty() || v.shape.size() > H5S_MAX_RANK) {
    SINEW_THROW(CheckpointError, "{}: view '{}' has {} dimensions, need 1 to {}", file, v.name,
                v.shape.size(), H5S_MAX_RANK);
  }
  std::uint64_t n = 1;
  for (const std::uint64_t d : v.shape) {
    if (d == 0 || n > std::numeric_limits<std::uint64_t>::max() / d) {
      SINEW_THROW(CheckpointError, "{}: view '{}' has an unusable shape {}", file, v.name,
                  shape_text(v.shape));
    }
    n *= d;
  }
  return n;
}

/// A name of one or more '/'-separated parts, none empty, "." or "..", without newlines.
void check_name(const std::string& name, const std::string& file) {
  bool ok = !name.empty() && name.find('\n') == std::string::npos;
  std::size_t depth = 0;
  for (std::size_t begin = 0; ok && begin <= name.size(); ++depth) {
    const std::size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part = std::string_view(name).substr(begin, end - begin);
    ok = !part.empty() && part != "." && part != ".." && depth < kMaxDepth;
    begin = end + 1;
  }
  if (!ok) SINEW_THROW(CheckpointError, "{}: '{}' cannot name a view (model/<layer>/<param>)", file, name);
}

/// Checks a model description and returns it parsed; throws naming `file` and the problem.
json parse_description(const std::string& text, const std::set<std::string>& view_names,
                       const std::string& file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    SINEW_THROW(CheckpointError, "{}: the model description {}", file, why);
  };
  if (j.is_discarded() || !j.is_object()) bad("is not a JSON object");
  if (!j.contains("spec") || !j["spec"].is_string()) bad("has no \"spec\" string");
  const auto is_count = [](const json& x) { return x.is_number_unsigned() && x.get<std::uint64_t>() > 0; };
  if (!j.contains("input_shape") || !j["input_shape"].is_array() || j["input_shape"].size() != 3 ||
      !std::all_of(j["input_shape"].begin(), j["input_shape"].end(), is_count)) {
    bad("has no \"input_shape\" [channels, height, width]");
  }
  if (!j.contains("num_classes") || !is_count(j["num_classes"])) bad("has no \"num_classes\"");
  if (!j.contains("layers") || !j["layers"].is_array()) bad("has no \"layers\" array");
  for (const json& l : j["layers"]) {
    if (!l.is_object() || !l.contains("name") || !l["name"].is_string() || !l.contains("kind") ||
        !l["kind"].is_string()) {
      bad("has a layer without a \"name\" and \"kind\"");
    }
    if (!l.contains("params")) continue;
    if (!l["params"].is_object()) bad("has a layer whose \"params\" is not an object");
    for (const auto& [param, view] : l["params"].items()) {
      if (!view.is_string() || view_names.count(view.get<std::string>()) == 0) {
        bad(fmt::format("names the view '{}' for {} of layer {}, but there is no such view", view.dump(),
                        param, l["name"].get<std::string>()));
      }
    }
  }
  return j;
}

void write_view(hid_t group, const TensorView& v, std::uint64_t count, std::uint64_t tensor_size,
                const std::string& file) {
  std::vector<hsize_t> dims(v.shape.begin(), v.shape.end());
  h5::Handle vspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  const hsize_t src_dims = tensor_size, start = v.offset, n = count;
  h5::Handle src(H5Screate_simple(1, &src_dims, nullptr), H5Sclose);
  h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // The whole view, in C order, onto one contiguous 1-D slice of the tensor; "." is this very file.
  if (vspace.get() < 0 || src.get() < 0 || dcpl.get() < 0 ||
      H5Sselect_hyperslab(src.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr) < 0 ||
      H5Pset_virtual(dcpl.get(), vspace.get(), ".", ("/tensors/" + v.tensor).c_str(), src.get()) < 0) {
    SINEW_THROW(CheckpointError, "{}: cannot map view '{}' onto tensor '{}'", file, v.name, v.tensor);
  }
  h5::Handle ds(H5Dcreate2(group, v.name.c_str(), H5T_IEEE_F32LE, vspace.get(),
                           h5::intermediate_groups().get(), dcpl.get(), H5P_DEFAULT),
                H5Dclose);
  if (ds.get() < 0) SINEW_THROW(CheckpointError, "{}: cannot create the view {}/{}", file, kGroup, v.name);
  h5::write_attr(ds.get(), "tensor", v.tensor, file);
  h5::write_attr(ds.get(), "offset", v.offset, file);
  h5::write_attr(ds.get(), "layout", v.layout, file);
}

/// Reads the view `name` (relative to model/) from the open dataset `ds`, checking that its mapping is
/// the slice its attributes say.
TensorView read_view(hid_t manifest, hid_t ds, const std::string& name, const std::string& file) {
  TensorView v;
  v.name = name;
  v.tensor = h5::read_attr_string(ds, "tensor", file);
  v.offset = h5::read_attr_u64(ds, "offset", file);
  v.layout = h5::read_attr_string(ds, "layout", file);
  h5::Handle space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 1 || rank > H5S_MAX_RANK)
    SINEW_THROW(CheckpointError, "{}: view '{}' has no usable shape", file, name);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  v.shape.assign(dims.begin(), dims.end());
  const std::uint64_t count = elements(v, file);
  const std::uint64_t size = h5::dataset_size(manifest, "tensors/" + v.tensor, file);
  if (v.offset > size || count > size - v.offset) {
    SINEW_THROW(CheckpointError,
                "{}: view '{}' ({} elements from offset {}) runs past the end of tensor '{}' ({})", file,
                name, count, v.offset, v.tensor, size);
  }
  // The mapping itself: one virtual mapping onto exactly that slice of tensors/<tensor> in this file.
  h5::Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  std::size_t mappings = 0;
  bool ok = H5Pget_layout(dcpl.get()) == H5D_VIRTUAL && H5Pget_virtual_count(dcpl.get(), &mappings) >= 0 &&
            mappings == 1;
  if (ok) {
    std::string src_name(256, '\0');
    const ssize_t len = H5Pget_virtual_dsetname(dcpl.get(), 0, src_name.data(), src_name.size());
    src_name.resize(static_cast<std::size_t>(std::clamp<ssize_t>(len, 0, 255)));
    h5::Handle sel(H5Pget_virtual_srcspace(dcpl.get(), 0), H5Sclose);
    hsize_t lo = 0, hi = 0;
    ok = src_name == "/tensors/" + v.tensor && sel.get() >= 0 &&
         H5Sget_select_npoints(sel.get()) == static_cast<hssize_t>(count) &&
         H5Sget_select_bounds(sel.get(), &lo, &hi) >= 0 && lo == v.offset && hi + 1 == v.offset + count;
  }
  if (!ok) {
    SINEW_THROW(CheckpointError,
                "{}: view '{}' is not mapped onto elements [{}, {}) of tensor '{}' as it says", file, name,
                v.offset, v.offset + count, v.tensor);
  }
  return v;
}

void read_group(hid_t manifest, hid_t group, const std::string& prefix, int depth,
                std::vector<TensorView>& out, const std::string& file) {
  if (depth > kMaxDepth) SINEW_THROW(CheckpointError, "{}: {}/ nests too deep", file, kGroup);
  for (const std::string& member : h5::members(group, file)) {
    const std::string name = prefix + member;
    h5::Handle obj(H5Oopen(group, member.c_str(), H5P_DEFAULT), H5Oclose);
    if (obj.get() < 0) SINEW_THROW(CheckpointError, "{}: cannot open {}/{}", file, kGroup, name);
    switch (H5Iget_type(obj.get())) {
      case H5I_GROUP:
        read_group(manifest, obj.get(), name + "/", depth + 1, out, file);
        break;
      case H5I_DATASET:
        out.push_back(read_view(manifest, obj.get(), name, file));
        break;
      default:
        SINEW_THROW(CheckpointError, "{}: {}/{} is neither a view nor a group", file, kGroup, name);
    }
  }
}

}  // namespace

void write_views(hid_t manifest, const std::vector<TensorView>& views,
                 const std::map<std::string, std::uint64_t>& tensor_sizes, const std::string& file,
                 const std::string& model_json) {
  if (views.empty() && model_json.empty()) return;
  // Everything is checked before anything is written.
  std::set<std::string> names;
  std::vector<std::uint64_t> counts;
  for (const TensorView& v : views) {
    check_name(v.name, file);
    if (!names.insert(v.name).second)
      SINEW_THROW(CheckpointError, "{}: two views are named '{}'", file, v.name);
    const auto it = tensor_sizes.find(v.tensor);
    if (it == tensor_sizes.end()) {
      SINEW_THROW(CheckpointError, "{}: view '{}' lies in tensor '{}', which the checkpoint does not have",
                  file, v.name, v.tensor);
    }
    const std::uint64_t count = elements(v, file);
    if (v.offset > it->second || count > it->second - v.offset) {
      SINEW_THROW(CheckpointError,
                  "{}: view '{}' of shape {} ({} elements from offset {}) runs past the end of tensor '{}' "
                  "({} elements)",
                  file, v.name, shape_text(v.shape), count, v.offset, v.tensor, it->second);
    }
    if (h5::dataset_size(manifest, "tensors/" + v.tensor, file) != it->second) {
      SINEW_THROW(CheckpointError, "{}: tensors/{} does not have the {} elements of its view '{}'", file,
                  v.tensor, it->second, v.name);
    }
    counts.push_back(count);
  }
  json description;
  if (!model_json.empty()) description = parse_description(model_json, names, file);

  h5::Handle group = h5::create_group(manifest, kGroup);
  for (std::size_t i = 0; i < views.size(); ++i) {
    write_view(group.get(), views[i], counts[i], tensor_sizes.at(views[i].tensor), file);
  }
  if (!model_json.empty()) {
    h5::write_attr(group.get(), "spec", description["spec"].get<std::string>(), file);
    h5::write_attr(group.get(), "input_shape", description["input_shape"].get<std::vector<std::uint64_t>>(),
                   file);
    h5::write_attr(group.get(), "num_classes", description["num_classes"].get<std::uint64_t>(), file);
    h5::write_attr(group.get(), "layers", description["layers"].dump(), file);
  }
}

ModelViews read_views(hid_t manifest, const std::string& file) {
  ModelViews out;
  if (H5Lexists(manifest, kGroup, H5P_DEFAULT) <= 0) return out;  // written before views existed
  h5::Handle group(H5Gopen2(manifest, kGroup, H5P_DEFAULT), H5Gclose);
  if (group.get() < 0) SINEW_THROW(CheckpointError, "{}: {} is not a group", file, kGroup);
  read_group(manifest, group.get(), "", 1, out.views, file);
  std::sort(out.views.begin(), out.views.end(), [](const TensorView& a, const TensorView& b) {
    return std::tie(a.tensor, a.offset, a.name) < std::tie(b.tensor, b.offset, b.name);
  });
  if (H5Aexists(group.get(), "layers") > 0) {
    json layers = json::parse(h5::read_attr_string(group.get(), "layers", file), nullptr, false);
    if (layers.is_discarded() || !layers.is_array()) {
      SINEW_THROW(CheckpointError, "{}: attribute {}/layers is not a JSON array", file, kGroup);
    }
    const json j = {{"spec", h5::read_attr_string(group.get(), "spec", file)},
                    {"input_shape", h5::read_attr_u64s(group.get(), "input_shape", file)},
                    {"num_classes", h5::read_attr_u64(group.get(), "num_classes", file)},
                    {"layers", std::move(layers)}};
    out.model_json = j.dump();
  }
  return out;
}

}  // namespace sinew::checkpoint
