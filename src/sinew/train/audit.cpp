#include "sinew/train/audit.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <iterator>
#include <system_error>
#include <utility>

#include "sinew/core/error.hpp"

namespace sinew::train {

AuditLog::AuditLog(const std::string& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string path = fmt::format("{}/audit-{}-{}.txt", dir, host, ::getpid());
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    SINEW_THROW(InvalidArgument, "--audit-dir: cannot create {}: {}", path,
                std::generic_category().message(errno));
}

AuditLog::AuditLog(AuditLog&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

AuditLog& AuditLog::operator=(AuditLog&& o) noexcept {
  std::swap(fd_, o.fd_);
  return *this;
}

AuditLog::~AuditLog() {
  if (fd_ >= 0) ::close(fd_);
}

void AuditLog::record(int generation, std::uint64_t membership_epoch, std::int64_t step,
                      std::int64_t data_epoch, const std::vector<std::size_t>& indices) {
  if (fd_ < 0) return;
  line_ = fmt::format("{} {} {} {}", generation, membership_epoch, step, data_epoch);
  for (auto i : indices) fmt::format_to(std::back_inserter(line_), " {}", i);
  line_ += '\n';
  if (::write(fd_, line_.data(), line_.size()) != static_cast<ssize_t>(line_.size())) {
    SINEW_THROW(DataError, "--audit-dir: write failed: {}", std::generic_category().message(errno));
  }
}

}  // namespace sinew::train
