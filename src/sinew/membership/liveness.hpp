// Sinew's own detector of processes that stop without dying (SIGSTOP, a process that is not scheduled any
// more, a host cut off from the others), in the default configuration.
//
// ULFM reports a process that died. One that stops is not reported: its peers block in the next collective
// until the collectives' deadline (--timeout-ms, 300 s), and even then the shrink waits for it. ULFM's own
// heartbeat detector sends its heartbeats from inside MPI calls, so on an oversubscribed node it declared
// healthy ranks failed while they loaded data outside MPI (docs/fault-tolerance.md). This detector runs on a
// thread of its own in every process, which the kernel schedules whatever the main thread does:
//
//   ring     every process sends a small UDP datagram to its successor every period (timeout / 10, at most
//            0.5 s) and watches its predecessor. The thread makes no MPI call: heartbeats over MPI from a
//            second thread made Open MPI 5.0.7 abort the job when a process died (its PMIx failure event
//            was treated as fatal), and a plain socket also sees a network cut that MPI has not noticed;
//   fence    a predecessor silent for `timeout` is fenced with SIGKILL, which also ends a stopped process.
//            ULFM then reports it failed, and the survivors recover as for kill -9: a fenced process can
//            never write a checkpoint, a metrics line or an audit record after its exclusion. A process
//            can only be signalled from its own node (same kernel and PID namespace); Open MPI 5.0.7's
//            PMIx job control (PMIX_JOB_CTRL_KILL of one process) sent SIGTERM to the whole job in our
//            runs, so a stalled process on another node is reported, not fenced, and the collectives'
//            deadline applies to it;
//   bye      a process that stops watching on purpose (end of training, a change of membership) says so
//            first, so that its successor does not take the silence for a stall.
//
// The ring is rebuilt over every new view (membership::Group does it after each change).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "sinew/mpi/communicator.hpp"

namespace sinew::membership {

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

 private:
  void loop();

  struct Peer;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Peer> pred_, succ_;
  int fd_ = -1;
  int pred_rank_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> fenced_{0};
  std::thread thread_;
};

}  // namespace sinew::membership
