#include "sinew/core/status.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/core/launch.hpp"

namespace sinew::status {

namespace {

using Json = nlohmann::ordered_json;  // the fields in the documented order

/// The common fields of a record (status.hpp), `step` only once one was completed.
Json head(std::string_view event, const Identity& who, std::int64_t step) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  Json j;
  j["event"] = event;
  j["unix_time"] = now;
  j["host"] = who.host;
  j["pid"] = who.pid;
  j["launch_rank"] = who.launch_rank;
  j["generation"] = who.generation;
  if (step >= 0) j["step"] = step;
  return j;
}

std::string line_of(const Json& j) {
  // An error message may hold bytes that are not UTF-8 (a path): replaced, never a throw.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace

Writer::Writer(std::string dir, Identity who) : dir_(std::move(dir)), who_(std::move(who)) {
  if (!dir_.empty()) path_ = dir_ + "/" + who_.host + "-" + std::to_string(who_.pid) + ".jsonl";
}

Writer::~Writer() {
  const int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
}

bool Writer::enabled() const noexcept { return !path_.empty() && !failed_.load(); }

int Writer::descriptor() noexcept {
  int fd = fd_.load();
  if (fd >= 0 || !enabled()) return fd;
  std::lock_guard lock(open_mu_);
  fd = fd_.load();
  if (fd >= 0 || failed_.load()) return fd;
  // Never O_CREAT of the directory: a node where it is missing does not share it with the launcher.
  fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);  // NOLINT(*-vararg)
  if (fd < 0) {
    const int err = errno;
    failed_.store(true);
    std::array<char, 256> buf{};
    // strerror_r (GNU): the message, thread-safe.
    const char* msg = ::strerror_r(err, buf.data(), buf.size());
    std::fprintf(
        stderr,
        "[sinew] cannot write the launcher's status records to %s: %s; the launcher (sinew-run) will "
        "not hear from this process (%s must name a directory that every node shares: sinew-run "
        "--status-dir)\n",
        path_.c_str(), msg, kDirVariable);
    return -1;
  }
  fd_.store(fd);
  return fd;
}

void Writer::write_line(const std::string& line, bool sync) noexcept {
  const int fd = descriptor();
  if (fd < 0) return;
  // One write() of the whole line (O_APPEND: at the end, never torn by another thread). A regular file
  // takes it whole; the loop only covers a signal or a full disk cutting it short.
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (sync) ::fdatasync(fd);
}

void Writer::start() noexcept {
  if (!enabled()) return;
  try {
    std::call_once(started_, [&] { write_line(line_of(head("start", who_, step_.load())), false); });
  } catch (...) {  // NOLINT(bugprone-empty-catch): a record is never an error of the job (out of memory)
  }
}

void Writer::complete(int world_size) noexcept {
  if (!enabled()) return;
  try {
    start();
    Json j = head("complete", who_, step_.load());
    j["world_size"] = world_size;
    write_line(line_of(j), /*sync=*/true);
  } catch (...) {  // NOLINT(bugprone-empty-catch): as start()
  }
}

void Writer::relaunch(Reason why, std::string_view detail) noexcept {
  if (!enabled()) return;
  try {
    start();
    Json j = head("relaunch", who_, step_.load());
    j["reason"] = name_of(kReasonNames, why);
    j["detail"] = detail;
    write_line(line_of(j), false);
  } catch (...) {  // NOLINT(bugprone-empty-catch): as start()
  }
}

void Writer::cut_off() noexcept {
  if (!enabled()) return;
  try {
    start();
    write_line(line_of(head("cut-off", who_, step_.load())), false);
  } catch (...) {  // NOLINT(bugprone-empty-catch): as start()
  }
}

Writer& process() {
  static auto* w = [] {
    const launch::Launch& l = launch::current();
    Identity who;
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) == 0) who.host = host.data();
    who.pid = ::getpid();
    who.launch_rank = l.rank;
    try {
      who.generation = l.restart_generation();
    } catch (const Error&) {  // a malformed generation variable: the job stops on it with exit code 2
    }
    return new Writer(l.status_dir, std::move(who));  // NOLINT(cppcoreguidelines-owning-memory): never freed
  }();
  return *w;
}

}  // namespace sinew::status
