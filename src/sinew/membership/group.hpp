// The group: which processes train together right now, as an epoch-numbered view over one MPI
// communicator, and the ways it changes.
//
//   shrink   a member died (or stopped answering and was revoked): revoke -> shrink -> free -> agree, with
//            ULFM, retried while members keep failing during the recovery itself (docs/fault-tolerance.md)
//   grow     MPI_Comm_spawn of new processes + MPI_Intercomm_merge; the new members come last in rank order
//   leave    members asked to go (job server, signal) split off at a step boundary; not a failure
//
// Every change increments the epoch. The view's communicator is only used by the group itself; traffic
// (gradients, state, checkpoints) goes through backends built over it, rebuilt after every change.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/mpi/communicator.hpp"

namespace sinew::membership {

/// How a process came to be in the current view.
enum class Role : std::uint8_t {
  kInitial,    ///< started with the job, no change of membership yet
  kSurvivor,   ///< started with the job (or spawned earlier) and lived through at least one change
  kRecovered,  ///< spawned to replace lost members; takes its state from peers' memory
};
const char* role_name(Role r) noexcept;

/// Growing failed although every member is alive (e.g. no free slots for new processes): the group is
/// unchanged and usable. Not a CommFailure: retrying a recovery would not help.
class SpawnError : public Error {
 public:
  using Error::Error;
};

/// Wall-clock cost of one shrink, in milliseconds.
struct ShrinkReport {
  double revoke_ms = 0;
  double shrink_ms = 0;
  double agree_ms = 0;
  int attempts = 0;  ///< > 1 when members failed during the recovery itself
  int lost = 0;      ///< members no longer in the view
};

/// Wall-clock cost of one growth, in milliseconds.
struct GrowReport {
  double spawn_ms = 0;
  double merge_ms = 0;
  int added = 0;
};

/// The command a grown group starts its new members with (argv[0] and the arguments).
struct SpawnCommand {
  std::string program;
  std::vector<std::string> args;
};

/// Optional hook run by recover() at its start, once per attempt (fault injection names it "recovery").
using RecoveryHook = std::function<void(int attempt)>;

class Group {
 public:
  /// The group this process starts in: MPI_COMM_WORLD, or, for a process spawned by grow(), the merged
  /// group of its parents and siblings (collective with the parents' grow()).
  static Group attach();
  /// A group over a duplicate of `comm` (tests, embedding in a larger application).
  static Group over(const mpi::Communicator& comm);

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  Group(Group&&) noexcept = default;
  Group& operator=(Group&&) noexcept = default;
  ~Group() = default;

  [[nodiscard]] const mpi::Communicator& comm() const noexcept { return comm_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] Role role() const noexcept { return role_; }
  /// The rank this process had in MPI_COMM_WORLD at launch; -1 for a process spawned by grow().
  [[nodiscard]] int launch_rank() const noexcept { return launch_rank_; }

  /// Collective over the survivors, after a failure was reported by MPI (ULFM only; throws CommFailure
  /// without it). Revokes the view, shrinks it to the live members, frees the old one and agrees on the
  /// result; if a member fails during these steps, starts again from the revoke. `failed` is the
  /// communicator on which the failure was seen (a backend's duplicate of the view), revoked first so
  /// that every member blocked in it returns.
  ShrinkReport shrink(MPI_Comm failed, const RecoveryHook& hook = {});

  /// Collective: starts `n` new members with `cmd` and merges them into the view (they call attach()).
  /// Throws SpawnError if the spawn fails with every member alive (e.g. no free slots; the view is
  /// unchanged), CommFailure if a member died meanwhile.
  GrowReport grow(int n, const SpawnCommand& cmd);

  /// Collective: the members with `leaving` true form no view any more (their communicator is freed);
  /// the others continue in a new view. A leaving member must stop using the group.
  void split_leave(bool leaving);

 private:
  Group(mpi::Communicator comm, std::uint64_t epoch, Role role, int launch_rank);
  void adopt(mpi::Communicator comm);

  mpi::Communicator comm_;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t epoch_ = 0;
  Role role_ = Role::kInitial;
  int launch_rank_ = -1;
};

/// The program and arguments of this process, recorded by main() for grow().
void set_command_line(int argc, const char* const* argv);
const SpawnCommand& command_line();

}  // namespace sinew::membership
