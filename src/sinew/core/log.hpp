// Logging: spdlog with the rank in every line ("[sinew r3/4] ...").
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace sinew::log {

/// Parses "trace|debug|info|warn|error|off"; throws InvalidArgument otherwise.
spdlog::level::level_enum parse_level(std::string_view name);

/// Installs Sinew's default logger with a rank prefix. Call again after the group changes size.
void init(int rank, int world_size, spdlog::level::level_enum level = spdlog::level::info);

/// Updates the rank prefix of the current logger.
void set_rank(int rank, int world_size);

}  // namespace sinew::log
