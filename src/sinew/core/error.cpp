#include "sinew/core/error.hpp"

#include <filesystem>

namespace sinew {

namespace {
std::string located(std::string_view what, const SourceLocation& where) {
  return fmt::format("{} [{}:{}]", what, std::filesystem::path(where.file_name()).filename().string(),
                     where.line());
}
}  // namespace

Error::Error(std::string_view what, const SourceLocation& where)
    : std::runtime_error(located(what, where)), message_(what), where_(where) {}

}  // namespace sinew
