// Per-layer views of a manifest's flat tensors (docs/checkpoint-format.md, "Per-layer views"): for each
// TensorView, the dataset model/<name>, an HDF5 virtual dataset of the view's shape over a slice of the
// manifest's own tensors/<tensor> (itself virtual, over the shards), so that an h5py user reads
// f["model/fc1/weight"] as a shaped array; and the model's description as attributes of the group model/.
// Internal to the checkpoint layer.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sinew/checkpoint/state.hpp"

namespace sinew::checkpoint {

/// Writes the group model/ into the manifest `manifest`, whose datasets tensors/<name> must exist already,
/// with tensor_sizes[name] elements each. For each view, the dataset model/<name>: virtual, of the view's
/// shape, mapped in C order onto elements [offset, offset + prod(shape)) of tensors/<tensor> in the same
/// file, with attributes tensor (string), offset (u64) and layout (string). With `model_json` (the model's
/// description, model::Model::description_json(): a JSON object with "spec", "input_shape",
/// "num_classes" and "layers"), the group gets the attributes spec (string), input_shape (u64 x 3),
/// num_classes (u64) and layers (the JSON array, as a string). Writes nothing without views and
/// description. Throws CheckpointError naming `file` and the view for a view that names an unknown tensor,
/// runs past its tensor's end, has an empty shape, a zero extent or an unusable name, or that repeats a
/// name; and for a description that is not such an object or names a parameter view that does not exist.
void write_views(hid_t manifest, const std::vector<TensorView>& views,
                 const std::map<std::string, std::uint64_t>& tensor_sizes, const std::string& file,
                 const std::string& model_json = {});

/// What a manifest's model/ group holds.
struct ModelViews {
  std::vector<TensorView> views;  ///< ordered by tensor, then offset
  /// The model's description as write_views() took it (the same JSON text when it came from
  /// Model::description_json()); empty when the manifest has none.
  std::string model_json;
};

/// Reads what write_views() wrote; empty (no views, no description) for a manifest without model/ (the
/// checkpoints written before views existed). Throws CheckpointError naming `file` for a view without its
/// attributes or with an unusable shape.
ModelViews read_views(hid_t manifest, const std::string& file);

}  // namespace sinew::checkpoint
