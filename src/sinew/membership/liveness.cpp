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
#include <random>
#include <string>
#include <vector>

#include "sinew/core/launch.hpp"
#include "sinew/core/status.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/mpi/check.hpp"

namespace sinew::membership {

namespace {

constexpr std::uint32_t kBeat = 0x53574842;  // "SWHB"
constexpr std::uint32_t kBye = 0x53574259;   // "SWBY"

/// One datagram: what, the view's token, the sender's rank in the view.
struct Message {
  std::uint32_t what = 0;
  std::uint32_t token = 0;
  std::int32_t rank = -1;
};

/// Who a process is, for the runtime and for a local SIGKILL.
struct Identity {
  std::array<char, 256> nspace{};  ///< PMIx namespace (PMIX_NAMESPACE), empty if unknown
  std::int64_t pmix_rank = -1;     ///< the launch rank (PMIX_RANK under Open MPI and srun)
  std::int64_t pid = 0;
  std::array<char, 64> host{};
  std::array<char, 40> boot_id{};  ///< the kernel's, /proc/sys/kernel/random/boot_id
  std::uint64_t pidns = 0;         ///< inode of /proc/self/ns/pid
  std::uint64_t netns = 0;         ///< inode of /proc/self/ns/net
  std::uint32_t addr = 0;          ///< IPv4 of the heartbeat socket, network order
  std::uint16_t port = 0;          ///< network order
  std::uint32_t token = 0;         ///< a random number; rank 0's becomes the view's token
};

/// The IPv4 address this process's peers reach it on: the first address of the first interface in Open
/// MPI's btl_tcp_if_include (the network MPI's data takes, e.g. eth0 on the test bed), else the first
/// non-loopback interface that is up, else 127.0.0.1.
std::uint32_t host_address() {
  std::vector<std::string> wanted;
  if (const char* inc = std::getenv("OMPI_MCA_btl_tcp_if_include")) {  // NOLINT(concurrency-mt-unsafe)
    std::string list = inc;
    for (std::size_t at = 0; at <= list.size();) {
      const std::size_t comma = std::min(list.find(',', at), list.size());
      if (comma > at) wanted.push_back(list.substr(at, comma - at));
      at = comma + 1;
    }
  }
  std::uint32_t out = htonl(INADDR_LOOPBACK);
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  auto usable = [](const ifaddrs* i) {
    return i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) != 0;
  };
  bool found = false;
  for (const std::string& name : wanted) {  // in the order given
    for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
      if (!usable(i) || name != i->ifa_name) continue;
      out = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      found = true;
    }
    if (found) break;
  }
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (!usable(i) || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    out = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    found = true;
  }
  ::freeifaddrs(list);
  return out;
}

std::uint64_t ns_inode(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? st.st_ino : 0;
}

Identity whoami() {
  Identity id;
  // The launcher's names for this process (core/launch.hpp), read once at start-up.
  const launch::Launch& l = launch::current();
  std::strncpy(id.nspace.data(), l.pmix_namespace.c_str(), id.nspace.size() - 1);
  id.pmix_rank = l.rank;
  id.pid = ::getpid();
  ::gethostname(id.host.data(), id.host.size() - 1);
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
    if (std::fgets(id.boot_id.data(), static_cast<int>(id.boot_id.size()), f) == nullptr)
      id.boot_id[0] = '\0';
    std::fclose(f);
  }
  id.pidns = ns_inode("/proc/self/ns/pid");
  id.netns = ns_inode("/proc/self/ns/net");
  return id;
}

/// Whether this process can send `who` a signal as a node can its own processes: the same kernel (boot id),
/// PID namespace and network namespace. True for two ranks on one node, false across nodes, and false
/// across the test bed's hosts (network namespaces on one kernel), which stand for separate nodes.
bool can_signal(const Identity& who, const Identity& me) {
  return who.pid > 0 && who.pidns != 0 && who.pidns == me.pidns && who.netns == me.netns &&
         std::strncmp(who.boot_id.data(), me.boot_id.data(), me.boot_id.size()) == 0;
}

}  // namespace

struct Liveness::Peer {
  Identity id;
  sockaddr_in to{};
  Clock::time_point heard{};
  bool bye = false;
};

Liveness::Liveness(const mpi::Communicator& over, std::chrono::milliseconds timeout)
    : timeout_(timeout), rank_(over.rank()) {
  const int size = over.size();
  Identity mine = whoami();
  {
    std::random_device rd;
    mine.token = rd();
  }
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
  const int rc =
      MPI_Allgather(&mine, sizeof(Identity), MPI_BYTE, all.data(), sizeof(Identity), MPI_BYTE, over.get());
  if (rc != MPI_SUCCESS) {
    // A member died right after the view formed (the chaos driver's kill 40 ms after an exclusion): the
    // next collective reports it too, and the recovery from it builds a detector over the next view. Not
    // an error of its own, or a process would leave the group on it.
    spdlog::warn("failure detector not started over this view: {}; the next recovery starts it",
                 mpi::error_string(rc));
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return;
  }
  if (size < 2 || fd_ < 0) return;
  token_ = all[0].token;
  peers_.resize(all.size());
  const auto now = Clock::now();
  for (std::size_t r = 0; r < all.size(); ++r) {
    Peer& p = peers_[r];
    p.id = all[r];
    p.to.sin_family = AF_INET;
    p.to.sin_addr.s_addr = p.id.addr;
    p.to.sin_port = p.id.port;
    p.heard = now;
  }
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
  auto send = [&](std::uint32_t what) {
    const Message m{what, token_, rank_};
    for (std::size_t r = 0; r < peers_.size(); ++r) {
      const Peer& p = peers_[r];
      if (static_cast<int>(r) == rank_ || p.id.port == 0) continue;
      ::sendto(fd_, &m, sizeof(m), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&p.to), sizeof(p.to));
    }
  };
  std::vector<bool> reported(peers_.size(), false), suspected(peers_.size(), false);
  auto next_beat = Clock::now();
  while (!stop_.load()) {
    if (Clock::now() >= next_beat) {
      send(kBeat);
      next_beat = Clock::now() + period;
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      Message m;
      // Everything queued is read before any judgement: a thread that was not scheduled for a while finds
      // the beats that arrived meanwhile and does not take its own delay for the others' silence.
      while (::recv(fd_, &m, sizeof(m), MSG_DONTWAIT) == static_cast<ssize_t>(sizeof(m))) {
        if (m.token != token_ || m.rank < 0 || m.rank >= static_cast<int>(peers_.size())) continue;
        Peer& from = peers_[static_cast<std::size_t>(m.rank)];
        from.heard = Clock::now();
        if (m.what == kBye) from.bye = true;  // it stops on purpose (end, or a change of membership)
      }
    }
    judge(reported, suspected);
  }
  // Stopping on purpose: the others must not take the silence for a stall.
  send(kBye);
}

void Liveness::judge(std::vector<bool>& reported, std::vector<bool>& suspected) {
  const auto now = Clock::now();
  const Identity& me = peers_[static_cast<std::size_t>(rank_)].id;
  // Whether peer r has been silent for `limit`. Never this process, nor one without a socket (port 0: not
  // watched), nor one that said bye: it was reachable when it did (it leaves this view for the next one),
  // or the bye of a survivor that began its recovery would tip a survivor's count.
  auto silent = [&](std::size_t r, std::chrono::milliseconds limit) {
    const Peer& p = peers_[r];
    return static_cast<int>(r) != rank_ && p.id.port != 0 && !p.bye && now - p.heard > limit;
  };
  // Suspects first, at half the timeout: a host whose process has been silent that long gets no new
  // process (Group::grow), even if the process is excluded before this one's own timeout expires.
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    if (suspected[r] || !silent(r, timeout_ / 2)) continue;
    suspected[r] = true;
    if (can_signal(peers_[r].id, me)) continue;  // on this node: fenced below if it stays silent
    std::lock_guard lock(mu_);
    silent_.emplace_back(peers_[r].id.host.data());
  }
  int watched = 0, heard = 0;
  bool lowest_heard = false;  // the lowest-ranked watched process is heard
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    if (peers_[r].id.port == 0) continue;  // not watched
    const bool alive = !silent(r, timeout_);
    if (watched++ == 0) lowest_heard = alive;
    heard += alive ? 1 : 0;
  }
  if (heard == watched) return;
  const bool recovering = recovering_.load();
  if (recovering ? heard == 1 && watched > 1 : !has_quorum(heard, watched, lowest_heard)) {
    // Cut off: the others (a quorum, if there is one) go on without this process, which must not write
    // anything more. SIGKILL, as for kill -9: the launcher's daemon on this node reports it failed.
    spdlog::error(
        "heard nothing for {} ms from {} of the {} processes of the group: this process ({} on {}) is "
        "cut off from the others, and fences itself (SIGKILL) so that they go on without it",
        timeout_.count(), watched - heard, watched, me.pid, me.host.data());
    spdlog::default_logger()->flush();
    // The launcher (sinew-run) leaves this host out of the relaunches of a job with a hostfile: a
    // relaunch that includes it would fail at its start.
    status::process().cut_off();
    fenced_.fetch_add(1);
    ::kill(::getpid(), SIGKILL);
    return;
  }
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (reported[r] || !silent(r, timeout_)) continue;
    reported[r] = true;
    const Identity& who = p.id;
    const double ms = std::chrono::duration<double, std::milli>(now - p.heard).count();
    // SIGKILL works on a stopped process too. Open MPI then reports it failed (ULFM), as for kill -9.
    const bool killed = can_signal(who, me) && ::kill(static_cast<pid_t>(who.pid), SIGKILL) == 0;
    fenced_.fetch_add(killed ? 1 : 0);
    if (recovering && !killed) continue;  // dead, most likely: the recovery is about it
    spdlog::error(
        "rank {} of the view (process {}:{}, pid {} on {}) sent no heartbeat for {:.0f} ms: {}", r,
        who.nspace.data(), who.pmix_rank, who.pid, who.host.data(), ms,
        killed ? "it stopped without dying; fenced (SIGKILL), so that the group recovers without it"
               : "on another node it either fences itself (cut off, without a quorum) or is stalled, and "
                 "then the collectives' deadline (--timeout-ms) applies");
  }
}

std::vector<std::string> Liveness::silent_hosts() const {
  std::lock_guard lock(mu_);
  return silent_;
}

std::vector<std::string> Liveness::hosts() const {
  std::vector<std::string> out;
  for (const Peer& p : peers_) {
    const std::string h = p.id.host.data();
    if (!h.empty() && std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  }
  return out;
}

}  // namespace sinew::membership
