// The group: which processes train together right now, as an epoch-numbered view over one MPI
// communicator, and the ways it changes.
//
//   shrink   a member died (or stopped answering and was revoked): revoke -> shrink -> free -> agree, with
//            ULFM, retried while members keep failing during the recovery itself (docs/fault-tolerance.md)
//   grow     MPI_Comm_spawn of new processes + MPI_Intercomm_merge; the new members come last in rank order
//   leave    members asked to go (job server, signal) split off at a step boundary; not a failure
//   reform   with hot spares (attach(spawn, spares)): the members and the idle spares share a pool
//            communicator; every change (a failure, promoting spares, a leave) revokes and shrinks the
//            pool and splits the new view off it, so a failed member is replaced by a spare that is
//            already running and has its data loaded, instead of a process being spawned
//
// Every MPI call of a change (revoke, shrink, agree, split, dup, merge, the detector's set-up) runs under
// a deadline watched by another thread (repair_watch.hpp): past it the process exits with code 75 for a
// relaunch instead of hanging in the MPI library.
//
// Every change increments the epoch. The view's communicator is only used by the group itself; traffic
// (gradients, state, checkpoints) goes through backends built over it, rebuilt after every change.
//
// The group holds the command that grow() starts new members with (SpawnCommand::of_this_process() in
// main()); a spawned member's own main() records the same command, so it can grow the group in turn.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/core/names.hpp"
#include "sinew/membership/liveness.hpp"
#include "sinew/membership/repair_watch.hpp"
#include "sinew/mpi/communicator.hpp"

namespace sinew::membership {

/// How a process came to be in the current view.
enum class Role : std::uint8_t {
  kInitial,    ///< started with the job, no change of membership yet
  kSurvivor,   ///< started with the job (or spawned earlier) and lived through at least one change
  kRecovered,  ///< spawned to replace lost members; takes its state from peers' memory
};

inline constexpr NameTable<Role, 3> kRoleNames{{
    {Role::kInitial, "initial"},
    {Role::kSurvivor, "survivor"},
    {Role::kRecovered, "recovered"},
}};

/// "initial", "survivor" or "recovered" (metrics and logs).
constexpr std::string_view role_name(Role r) noexcept { return name_of(kRoleNames, r); }

/// Growing failed although every member is alive (e.g. no free slots for new processes): the group is
/// unchanged and usable. Not a CommFailure: retrying a recovery would not help.
class SpawnError : public Error {
 public:
  using Error::Error;
};

/// A process spawned by grow() could not join its parents (a member died during the merge, or the parents
/// gave up on the spawn and revoked the link). It never was a member: nobody waits for it, and its leaving
/// is not a failure of the job, so the process exits with code 0 (apps/sinew_train.cpp).
class JoinFailed : public CommFailure {
 public:
  using CommFailure::CommFailure;
  [[nodiscard]] ExitCode exit_code() const noexcept override { return ExitCode::kOk; }
};

/// Wall-clock cost of one shrink, in milliseconds.
struct ShrinkReport {
  double revoke_ms = 0;
  double shrink_ms = 0;
  double agree_ms = 0;
  int attempts = 0;   ///< > 1 when members failed during the recovery itself
  int lost = 0;       ///< members no longer in the view
  int promoted = 0;   ///< reform(): spares that became members
  int from_size = 0;  ///< reform(): the view's size before the change
};

/// Wall-clock cost of one growth, in milliseconds.
struct GrowReport {
  double spawn_ms = 0;
  double merge_ms = 0;
  int added = 0;
};

/// The command a grown group starts its new members with: the program and its arguments (without
/// argv[0]). Empty (no program) when the group cannot grow.
struct SpawnCommand {
  std::string program;
  std::vector<std::string> args;

  /// This process's own command: the absolute path of its executable (/proc/self/exe, so that spawned
  /// members start the same program whatever the working directory of the launcher's daemons; argv[0]
  /// if that cannot be read) and argv[1..argc). Call it in main() with main's arguments, before anything
  /// (MPI_Init, option parsers) can rewrite them. A process started with this command and calling it
  /// again gets an equal command.
  static SpawnCommand of_this_process(int argc, const char* const* argv);

  [[nodiscard]] bool empty() const noexcept { return program.empty(); }
  friend bool operator==(const SpawnCommand&, const SpawnCommand&) = default;
};

/// For a process spawned by Group::grow(): if it has not joined its parents (MPI_Init, merge) within the
/// deadline they set (twice their spawn deadline, at least 5 s, in SINEW_JOIN_DEADLINE_MS), it finalizes PMIx
/// and exits with code 0 (group.cpp says why both). A spawn that the parents abandoned would otherwise leave
/// it blocked in MPI_Init for ever, and mpirun waits for every process it started. The process never was a
/// member: its end is not a failure of the job, and mpirun still returns 0. Start it in main() before
/// MPI_Init; does nothing in a process not spawned by grow(). Cancelled by joined() or destruction.
class JoinDeadline {
 public:
  JoinDeadline();
  JoinDeadline(const JoinDeadline&) = delete;
  JoinDeadline& operator=(const JoinDeadline&) = delete;
  ~JoinDeadline();
  /// The process is a member now: the deadline no longer applies.
  void joined();
  /// True in a process spawned by grow() under ULFM (its parents set a join deadline).
  [[nodiscard]] bool spawned() const noexcept;
  /// Ends a spawned process that cannot join (an MPI_Init that failed, the deadline): exit code 0.
  [[noreturn]] static void leave();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// Optional hook run by shrink() at the start of every attempt (fault injection names it "recovery").
using RecoveryHook = std::function<void(int attempt)>;

class Group {
 public:
  /// The group this process starts in: MPI_COMM_WORLD, or, for a process spawned by grow(), the merged
  /// group of its parents and siblings (collective with the parents' grow()). `spawn` is what this
  /// group's grow() starts new members with: SpawnCommand::of_this_process(argc, argv) from main().
  /// Throws JoinFailed if a spawned process cannot join.
  static Group attach(SpawnCommand spawn);
  /// As attach(spawn), with the last `spares` processes of MPI_COMM_WORLD held back as hot spares: they
  /// are in no view (spare() is true, rank() is -1) and call wait_as_spare(). Needs ULFM and more than
  /// `spares` processes; throws InvalidArgument otherwise.
  static Group attach(SpawnCommand spawn, int spares);
  /// A group over a duplicate of `comm` (tests, embedding in a larger application); it can grow only if
  /// given a spawn command. Collective over `comm`.
  static Group over(const mpi::Communicator& comm, SpawnCommand spawn = {});

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
  /// The rank this process had in MPI_COMM_WORLD at launch (for over(): in that communicator); -1 for a
  /// process spawned by grow().
  [[nodiscard]] int launch_rank() const noexcept { return launch_rank_; }
  /// A hot spare: in the pool, not in the view (rank() is -1).
  [[nodiscard]] bool spare() const noexcept { return spare_; }
  /// Idle spares in the pool at its last change (some may have died since; reform() counts again).
  [[nodiscard]] int spares() const noexcept { return static_cast<int>(spare_ranks_.size()); }
  /// True while the group has a pool (it was made with spares and has not grown by spawning since).
  [[nodiscard]] bool pooled() const noexcept { return pool_.valid(); }
  /// What grow() starts new members with; empty if the group was made without one.
  [[nodiscard]] const SpawnCommand& spawn_command() const noexcept { return spawn_; }

  /// Collective over the survivors, after a failure was reported by MPI (ULFM only; throws CommFailure
  /// without it). Revokes the view, shrinks it to the live members, frees the old one and agrees on the
  /// result; if a member fails during these steps, starts again from the revoke. `hook` runs at the start
  /// of every attempt (1, 2, ...).
  ///
  /// The caller's part of the contract: the failure was seen on some other communicator (a backend's
  /// duplicate of this view), and members may still be blocked in it. The group knows nothing of
  /// backends, so the caller aborts them first (comm::Backend::abort() revokes the backend's
  /// communicator, so that every member blocked in it returns and reaches this call), then calls
  /// shrink() on every survivor. Backends over the old view are unusable afterwards: rebuild them over
  /// comm(). Throws CommFailure if MPI cannot shrink at all.
  ShrinkReport shrink(const RecoveryHook& hook = {});

  /// Collective: starts `n` new members with spawn_command() and merges them into the view (they call
  /// attach(), last in rank order; the epoch increments). Members hold a command alike, all or none
  /// (MPI uses rank 0's). Throws SpawnError if the group has no spawn command, or if the spawn fails with
  /// every member alive (e.g. no free slots, a program that does not exist), or if MPI_Comm_spawn did not
  /// return within `deadline` at some member while every member is alive: the view is then unchanged and
  /// usable. Throws CommFailure if a member died meanwhile.
  ///
  /// The deadline needs ULFM (the members agree on the outcome). Open MPI 5.0.7 cannot interrupt
  /// MPI_Comm_spawn: when a member of the view dies during it, the root stays blocked in PMIx_Connect
  /// (inside ompi_dpm_connect_accept) for ever, revoke or not. So the spawn runs on a helper thread, over
  /// a private dup of the view, and a member whose spawn is past the deadline abandons that thread (left
  /// in MPI until the spawn returns, or until the process's bounded finalize ends it,
  /// mpi::Environment::finalize) and joins the agreement over the view. The new processes
  /// are told the deadline (environment SINEW_JOIN_DEADLINE_MS, see JoinDeadline) and leave on their own
  /// if they cannot join. `spawning` runs right before the spawn starts (tests: a fault injected there).
  GrowReport grow(int n, std::chrono::milliseconds deadline = std::chrono::milliseconds(30000),
                  const std::function<void()>& spawning = {});

  /// For a spare: waits, without spinning on a core (it polls every `poll`), until the members change the
  /// view. Returns the reform's report once this process was promoted (it is a member now, role()
  /// kRecovered, and takes its state from the members' memory), nothing when the members dismissed the
  /// spares (training is over). Members dying meanwhile only wake it when the members reform.
  std::optional<ShrinkReport> wait_as_spare(std::chrono::milliseconds poll = std::chrono::milliseconds(1));

  /// Collective over the pool (members, and the spares woken by it): revokes the view and the pool,
  /// shrinks the pool to the live processes and splits the new view off it: the surviving members in
  /// their order, then up to `want_size` minus their number of spares (promoted, last in rank order).
  /// Members with `leaving` true leave the pool as well. Retried while processes fail during it; `hook`
  /// runs at the start of every attempt. Throws CommFailure if MPI cannot shrink at all.
  ShrinkReport reform(int want_size, bool leaving, const RecoveryHook& hook = {});

  /// At the end of training (every member calls it): tells the idle spares to leave. No-op without a pool.
  void dismiss_spares();

  /// Collective over the pool (or the view): from now on every process watches another for stalls
  /// (Liveness: a process silent for `timeout` is fenced), over every view this group takes. A process
  /// spawned by grow() calls it too, right after attach(). Zero stops watching.
  void watch(std::chrono::milliseconds timeout);

  /// Arms the deadline of the repair call `what` (RepairWatch): repair_deadline() over the pool or view,
  /// with the stall timeout given to watch() as the detection time, plus `extra` (a step that moves data).
  [[nodiscard]] RepairWatch::Guard repair_guard(
      std::string what, std::chrono::milliseconds extra = std::chrono::milliseconds(0)) const;

  /// Collective: the members with `leaving` true form no view any more (their communicator is freed);
  /// the others continue in a new view. A leaving member must stop using the group.
  void split_leave(bool leaving);

 private:
  Group(mpi::Communicator comm, std::uint64_t epoch, Role role, int launch_rank, SpawnCommand spawn);
  void adopt(mpi::Communicator comm);

  mpi::Communicator comm_;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t epoch_ = 0;
  Role role_ = Role::kInitial;
  int launch_rank_ = -1;
  SpawnCommand spawn_;
  // Hot spares: the pool (members and spares), this process's place in it, the spares' pool ranks.
  mpi::Communicator pool_;
  bool spare_ = false;
  std::vector<int> spare_ranks_;
  // Stall detection over the current pool or view, rebuilt after every change (watch()).
  std::chrono::milliseconds watch_{0};
  std::unique_ptr<Liveness> live_;
  // Hosts whose processes went silent without being fenced here (cut off from the data network, as far as
  // this process could tell), for the whole job: grow() does not spawn onto them.
  std::vector<std::string> silent_hosts_;
  void rewatch();
  static constexpr std::chrono::milliseconds kDefaultDetect{10000};
  void unwatch();      ///< notes the detector's silent hosts, then stops it
  void note_silent();  ///< adds the detector's silent hosts to silent_hosts_
};

}  // namespace sinew::membership
