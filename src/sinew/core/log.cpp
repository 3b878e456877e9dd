#include "sinew/core/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include "sinew/core/error.hpp"

namespace sinew::log {

spdlog::level::level_enum parse_level(std::string_view name) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},  {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"off", spdlog::level::off}};
  for (const auto& [n, level] : kLevels) {
    if (name == n) return level;
  }
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
