// Sinew's own detector of processes that stop without dying (SIGSTOP, a process that is not scheduled any
// more) and of processes cut off from the others by the network, in the default configuration.
//
// ULFM reports a process that died. One that stops, or whose network link goes dark, is not reported: its
// peers block in the next collective until the collectives' deadline (--timeout-ms, 300 s), and even then
// the shrink waits for it. ULFM's own heartbeat detector sends its heartbeats from inside MPI calls, so on
// an oversubscribed node it declared healthy ranks failed while they loaded data outside MPI
// (docs/fault-tolerance.md). This detector runs on a thread of its own in every process, which the kernel
// schedules whatever the main thread does:
//
//   beat     every process sends a small UDP datagram to every other one every period (timeout / 10, at
//            most 0.5 s), over the interface MPI's TCP transport uses (btl_tcp_if_include), so that the
//            heartbeats share the fate of the data. The thread makes no MPI call: heartbeats over MPI from a
//            second thread made Open MPI 5.0.7 abort the job when a process died (its PMIx failure event
//            was treated as fatal), and a plain socket also sees a network cut that MPI has not noticed;
//   quorum   when a peer has been silent for `timeout`, a process counts whom it still hears (itself
//            included). More than half of the watched processes, or exactly half with the lowest rank among
//            them, is a quorum: at most one side of any split has one;
//   fence    a process with a quorum fences a silent peer on its own node with SIGKILL (which also ends a
//            stopped process); ULFM then reports it failed and the survivors recover as for kill -9. A
//            process without a quorum is the one cut off: it fences itself (SIGKILL to itself, after one
//            log line), its node's launcher daemon reports it dead over the management network, and the
//            others recover. Either way a process is out of the group only once it is dead: an excluded
//            process never writes a checkpoint, a metrics line or an audit record, and two halves of a split
//            never both go on. A stalled process on another node cannot be signalled (Open MPI 5.0.7's
//            PMIx job control, PMIX_JOB_CTRL_KILL of one process, sent SIGTERM to the whole job in our
//            runs): it is reported, and the collectives' deadline applies to it;
//   bye      a process that stops watching on purpose (end of training, a change of membership) says so
//            first, so that the others do not take its silence for a stall or a cut.
//
// The detector is rebuilt over every new view (membership::Group does it after each change).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sinew/mpi/communicator.hpp"

namespace sinew::membership {

/// The quorum rule (see above): `heard` processes reachable (this one included, and those that said bye) of
/// `watched`; `has_lowest`: the lowest-ranked watched process is among them.
[[nodiscard]] constexpr bool has_quorum(int heard, int watched, bool has_lowest) noexcept {
  return 2 * heard > watched || (2 * heard == watched && has_lowest);
}

class Liveness {
 public:
  /// Collective over `over` (the group's view, or its pool with the hot spares): opens a UDP socket,
  /// learns every process's address and runtime identity (allgather) and starts the thread. With one
  /// process, watches nobody.
  Liveness(const mpi::Communicator& over, std::chrono::milliseconds timeout);
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;
  Liveness(Liveness&&) = delete;
  Liveness& operator=(Liveness&&) = delete;
  /// Says bye to the successor and stops the thread (local, bounded).
  ~Liveness();

  /// Processes this one has fenced.
  [[nodiscard]] int fenced() const noexcept { return fenced_.load(); }
  /// The hosts of the processes on other nodes silent for half the timeout or more (cut off, stalled, or
  /// dead), in the order found: suspects, for placing new processes, before the timeout decides anything.
  /// Safe to call while the detector runs.
  [[nodiscard]] std::vector<std::string> silent_hosts() const;
  /// The group is recovering from a failure (Group::shrink, reform): silent peers may simply be dead, which
  /// a quorum cannot tell, so from now on a process fences itself only when it hears nobody at all (cut off
  /// while the others wait for it in the recovery), and fences silent peers on its own node as before.
  void recovering() noexcept { recovering_.store(true); }
  /// The host names of the view's processes, each once, in rank order.
  [[nodiscard]] std::vector<std::string> hosts() const;

 private:
  void loop();
  void judge(std::vector<bool>& reported, std::vector<bool>& suspected);

  struct Peer;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;  ///< every process of the view, this one included (by rank)
  int rank_ = 0;
  std::uint32_t token_ = 0;  ///< this view's, agreed by all: a stale datagram of another view is ignored
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> recovering_{false};
  std::atomic<int> fenced_{0};
  mutable std::mutex mu_;  ///< guards silent_
  std::vector<std::string> silent_;
  std::thread thread_;
};

}  // namespace sinew::membership
