// The memory limit this process runs under, as a cluster's scheduler sets one per job or task: the memory
// cgroup's (v2 memory.max, v1 memory.limit_in_bytes). python/sinew/memory.py reads the same at start; the
// runtime reads it where it must decide whether more memory fits now (the end of training with sharded
// parameters, which gathers the model whole).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace sinew {

struct MemoryLimit {
  std::uint64_t limit = 0;  ///< bytes the cgroup may use
  std::uint64_t used = 0;  ///< bytes it uses now, less the inactive file cache (the kernel reclaims it first)
  std::string where;       ///< the cgroup's directory
};

/// This process's memory cgroup and its use now; nullopt where there is none with a limit (or it cannot be
/// read).
[[nodiscard]] std::optional<MemoryLimit> memory_limit();

}  // namespace sinew
