// Deadlines on the calls that repair the group.
//
// In-place recovery runs inside the MPI library (revoke, shrink, agree, spawn, merge), then rebuilds the
// backends and synchronises the state over the new view. Open MPI 5.0.7 has calls among these that never
// return: MPIX_Comm_shrink in the ERA agreement after two or three members die within ~40 ms, or in a
// group holding a spawned member (docs/fault-tolerance.md). A process stuck there cannot be helped by
// anything it does on the stuck thread. So each of these calls runs under a deadline of its own, watched by
// a thread that makes no MPI call and does not depend on the call returning. Past a deadline the process
// takes the one way out that cannot hang: it records why for the launcher (a relaunch record, reason
// repair-deadline: core/status.hpp), prints what was stuck and for how long, and exits at once with code 75
// (ExitCode::kRelaunch), without MPI_Finalize. The launcher (mpi_scripts/sinew-run) then relaunches the job
// from its newest state. Members stuck in the same call pass the same deadline within
// moments of each other; a member that is not stuck sees one that left as one more failure.
//
// The deadline of a call (repair_deadline): the time in which the group notices a silent member
// (--stall-timeout-ms, 10 s by default, which a shrink may have to wait for), plus 5 s, plus 10 ms per
// process of the group. With 4 processes and the defaults: 15.04 s; with 1024: 25.2 s. A healthy repair
// call takes milliseconds (docs/benchmarks.md), so a call past its deadline is stuck, not slow. The state
// synchronisation moves the model over the network: its deadline adds the collectives' own (--timeout-ms).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace sinew::membership {

/// The deadline of one repair call in a group of `processes`, where a silent member is noticed within
/// `detect` (see above).
[[nodiscard]] std::chrono::milliseconds repair_deadline(int processes, std::chrono::milliseconds detect);

class RepairWatch {
 public:
  /// What happens when a call passes its deadline: `what` names the call, `deadline` is its deadline.
  using Expired = std::function<void(const std::string& what, std::chrono::milliseconds deadline)>;

  /// Disarms its deadline when it goes out of scope (the call returned, or threw).
  class Guard {
   public:
    Guard() = default;
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    Guard(Guard&& o) noexcept : watch_(o.watch_), id_(o.id_) { o.watch_ = nullptr; }
    Guard& operator=(Guard&& o) noexcept;
    ~Guard() { release(); }
    /// Disarms now (the call returned).
    void release() noexcept;

   private:
    friend class RepairWatch;
    Guard(RepairWatch* w, std::uint64_t id) : watch_(w), id_(id) {}
    RepairWatch* watch_ = nullptr;
    std::uint64_t id_ = 0;
  };

  /// This process's watch. Its thread starts with the first deadline armed and lives as long as the
  /// process (it is never joined: it may have to act while every other thread is stuck).
  static RepairWatch& process();

  /// Arms a deadline for the call `what` ("shrink (attempt 1)"); it is watched until the guard is
  /// released. Deadlines may nest (a recovery's calls inside a recovery).
  [[nodiscard]] Guard arm(std::string what, std::chrono::milliseconds deadline);

  /// Replaces what happens past a deadline (tests); an empty function restores the default, which prints
  /// one line to stderr and ends the process with exit code 75 (leave_for_relaunch).
  void on_expired(Expired f);

  /// The default action: a relaunch record (repair-deadline), "[sinew] WHAT did not return within S s ..." on
  /// stderr, then std::_Exit(75).
  [[noreturn]] static void leave_for_relaunch(const std::string& what, std::chrono::milliseconds deadline);

  /// From now on, this process leaves (exit code 75, without MPI_Finalize) within 0.2 s of its parent
  /// process going away: the launcher's daemon on this node (prterun, prted, slurmstepd) was killed, and
  /// nothing else would stop a process that no launcher sees any more, still training and writing the
  /// checkpoints and the node's state copy while the supervisor relaunches the job. A thread compares
  /// getppid() with the parent at the first call; once per process, the later calls do nothing.
  static void leave_when_orphaned();

  RepairWatch(const RepairWatch&) = delete;
  RepairWatch& operator=(const RepairWatch&) = delete;

 private:
  RepairWatch() = default;
  ~RepairWatch() = default;
  struct Impl;
  Impl& impl();
  void disarm(std::uint64_t id) noexcept;
};

}  // namespace sinew::membership
