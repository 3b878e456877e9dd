#include "sinew/membership/liveness.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sinew/core/timer.hpp"
#include "sinew/mpi/check.hpp"

namespace sinew::membership {

namespace {

constexpr std::uint32_t kBeat = 0x53574842;  // "SWHB"
constexpr std::uint32_t kBye = 0x53574259;   // "SWBY"

/// Who a process is, for the runtime and for a local SIGKILL.
struct Identity {
  std::array<char, 256> nspace{};  ///< PMIx namespace (PMIX_NAMESPACE), empty if unknown
  std::int64_t pmix_rank = -1;     ///< PMIX_RANK
  std::int64_t pid = 0;
  std::array<char, 64> host{};
  std::array<char, 40> boot_id{};  ///< the kernel's, /proc/sys/kernel/random/boot_id
  std::uint64_t pidns = 0;         ///< inode of /proc/self/ns/pid
  std::uint32_t addr = 0;          ///< IPv4 of the heartbeat socket, network order
  std::uint16_t port = 0;          ///< network order
};

/// This host's first IPv4 address that is up and not loopback (the one its peers reach it on; on the test
/// bed, the namespace's own interface), else 127.0.0.1.
std::uint32_t host_address() {
  std::uint32_t out = htonl(INADDR_LOOPBACK);
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    out = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    break;
  }
  ::freeifaddrs(list);
  return out;
}

Identity whoami() {
  Identity id;
  // The launcher's environment, set before the process started and never changed by Sinew.
  if (const char* ns = std::getenv("PMIX_NAMESPACE"))  // NOLINT(concurrency-mt-unsafe)
    std::strncpy(id.nspace.data(), ns, id.nspace.size() - 1);
  if (const char* r = std::getenv("PMIX_RANK"))  // NOLINT(concurrency-mt-unsafe)
    id.pmix_rank = std::strtoll(r, nullptr, 10);
  id.pid = ::getpid();
  ::gethostname(id.host.data(), id.host.size() - 1);
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
    if (std::fgets(id.boot_id.data(), static_cast<int>(id.boot_id.size()), f) == nullptr)
      id.boot_id[0] = '\0';
    std::fclose(f);
  }
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) id.pidns = st.st_ino;
  return id;
}

/// Whether this process can send `who` a signal: the same kernel (boot id) and the same PID namespace.
/// True for two ranks on one node, false across nodes.
bool can_signal(const Identity& who) {
  const Identity me = whoami();
  return who.pid > 0 && who.pidns != 0 && who.pidns == me.pidns &&
         std::strncmp(who.boot_id.data(), me.boot_id.data(), me.boot_id.size()) == 0;
}

}  // namespace

struct Liveness::Peer {
  Identity id;
  sockaddr_in to{};
};

Liveness::Liveness(const mpi::Communicator& over, std::chrono::milliseconds timeout)
    : timeout_(timeout), pred_(std::make_unique<Peer>()), succ_(std::make_unique<Peer>()) {
  const int rank = over.rank(), size = over.size();
  Identity mine = whoami();
  if (size > 1) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      spdlog::warn("stall detection off in this process: no UDP socket (errno {})", errno);
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
    } else {
      mine.addr = host_address();
      mine.port = a.sin_port;
    }
  }
  // Collective even where the socket failed (port 0: nobody watches that process, it watches nobody).
  std::vector<Identity> all(static_cast<std::size_t>(size));
  SINEW_MPI(
      MPI_Allgather(&mine, sizeof(Identity), MPI_BYTE, all.data(), sizeof(Identity), MPI_BYTE, over.get()));
  if (size < 2 || fd_ < 0) return;
  pred_rank_ = (rank + size - 1) % size;
  pred_->id = all[static_cast<std::size_t>(pred_rank_)];
  succ_->id = all[static_cast<std::size_t>((rank + 1) % size)];
  succ_->to.sin_family = AF_INET;
  succ_->to.sin_addr.s_addr = succ_->id.addr;
  succ_->to.sin_port = succ_->id.port;
  thread_ = std::thread([this] { loop(); });
}

Liveness::~Liveness() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void Liveness::loop() {
  using namespace std::chrono;
  const auto period = std::clamp(timeout_ / 10, milliseconds(10), milliseconds(500));
  const bool has_succ = succ_->id.port != 0;
  bool watching = pred_->id.port != 0;
  auto send = [&](std::uint32_t what) {
    if (has_succ)
      ::sendto(fd_, &what, sizeof(what), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&succ_->to),
               sizeof(succ_->to));
  };
  auto heard = Clock::now();
  auto next_beat = Clock::now();
  while (!stop_.load()) {
    if (Clock::now() >= next_beat) {
      send(kBeat);
      next_beat += period;
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      std::uint32_t msg = 0;
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      while (::recvfrom(fd_, &msg, sizeof(msg), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len) ==
             static_cast<ssize_t>(sizeof(msg))) {
        len = sizeof(from);
        // Only the predecessor's datagrams count (its port is its own; the source address depends on the
        // route, so it is not compared).
        if (from.sin_port != pred_->id.port) continue;
        heard = Clock::now();
        if (msg == kBye) watching = false;  // it stops on purpose (end, or a change of membership)
      }
    }
    if (watching && Clock::now() - heard > timeout_) {
      watching = false;
      const Identity& who = pred_->id;
      const double ms = seconds_since(heard) * 1e3;
      // SIGKILL works on a stopped process too. Open MPI then reports it failed (ULFM), as for kill -9.
      const bool killed = can_signal(who) && ::kill(static_cast<pid_t>(who.pid), SIGKILL) == 0;
      fenced_.fetch_add(killed ? 1 : 0);
      spdlog::error(
          "rank {} of the ring (process {}:{}, pid {} on {}) sent no heartbeat for {:.0f} ms: it stopped "
          "without dying; {}",
          pred_rank_, who.nspace.data(), who.pmix_rank, who.pid, who.host.data(), ms,
          killed
              ? "fenced (SIGKILL), so that the group recovers without it"
              : "cannot fence a process on another node; the collectives' deadline (--timeout-ms) applies");
    }
  }
  // Stopping on purpose: the successor must not take the silence for a stall.
  send(kBye);
}

}  // namespace sinew::membership
