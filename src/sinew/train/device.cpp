#include "sinew/train/device.hpp"

#include <mpi.h>

#include <algorithm>
#include <functional>
#include <string_view>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/core/error.hpp"

namespace sinew::train {

int pick_device(std::span<const DeviceClaim> claims, int me, int count) {
  if (count <= 0)
    SINEW_THROW(InvalidArgument, "--device cuda needs a CUDA GPU; none is visible on this node");
  const auto& mine = claims[static_cast<std::size_t>(me)];
  if (mine.device >= 0) return static_cast<int>(mine.device);
  std::vector<bool> used(static_cast<std::size_t>(count), false);
  int waiting_before = 0;  // members of this node before me that have no GPU yet
  for (std::size_t r = 0; r < claims.size(); ++r) {
    if (claims[r].node != mine.node) continue;
    if (claims[r].device >= 0 && claims[r].device < count)
      used[static_cast<std::size_t>(claims[r].device)] = true;
    if (claims[r].device < 0 && static_cast<int>(r) < me) ++waiting_before;
  }
  // The members without a GPU take the free ones in rank order.
  int free_seen = 0;
  for (int d = 0; d < count; ++d) {
    if (used[static_cast<std::size_t>(d)]) continue;
    if (free_seen++ == waiting_before) return d;
  }
  return waiting_before % count;  // more members than GPUs: share them
}

int choose_device(comm::Backend& view, const comm::Options& op, int current, int count) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  DeviceClaim mine{std::hash<std::string_view>{}(std::string_view(name, static_cast<std::size_t>(len))),
                   current};
  std::vector<DeviceClaim> all(static_cast<std::size_t>(view.size()));
  view.allgather_sync(comm::Buffer::of(std::as_writable_bytes(std::span<DeviceClaim>(&mine, 1))),
                      comm::Buffer::of(std::as_writable_bytes(std::span<DeviceClaim>(all))), op);
  return pick_device(all, view.rank(), count);
}

}  // namespace sinew::train
