#include "sinew/core/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include "sinew/core/error.hpp"

namespace sinew::log {

spdlog::level::level_enum parse_level(std::string_view name) {
  for (auto level : {spdlog::level::trace, spdlog::level::debug, spdlog::level::info, spdlog::level::warn,
                     spdlog::level::err, spdlog::level::off}) {
    auto sv = spdlog::level::to_string_view(level);
    if (name == std::string_view(sv.data(), sv.size())) return level;
  }
  if (name == "warning") return spdlog::level::warn;
  if (name == "error") return spdlog::level::err;
  SINEW_THROW(InvalidArgument, "--log-level: unknown level '{}'; use trace, debug, info, warn, error or off",
              name);
}

void set_rank(int rank, int world_size) {
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [sinew r{}/{}] [%^%l%$] %v", rank, world_size));
}

void init(int rank, int world_size, spdlog::level::level_enum level) {
  // Log lines go to stderr so that stdout stays free for the program's own output (tables, JSON).
  spdlog::drop("sinew");
  auto logger = spdlog::stderr_logger_mt("sinew");
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);
  set_rank(rank, world_size);
}

}  // namespace sinew::log
