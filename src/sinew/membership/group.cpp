#include "sinew/membership/group.hpp"

#include <dlfcn.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/membership/repair_watch.hpp"
#include "sinew/mpi/check.hpp"
#include "sinew/mpi/environment.hpp"
#if SINEW_HAVE_ULFM
#include <mpi-ext.h>
#endif

namespace sinew::membership {

namespace {
double ms_since(Clock::time_point t) { return seconds_since(t) * 1e3; }

constexpr const char* kJoinDeadlineVar = "SINEW_JOIN_DEADLINE_MS";

/// How long a new process may take to join (JoinDeadline): twice the parents' spawn deadline, which also
/// covers the merge after the spawn, and at least 5 s. A process that leaves in the middle of MPI_Init
/// while its parents' (abandoned) spawn still connects to it crashed a parent (SIGSEGV in
/// ompi_dpm_connect_accept) or stalled the group's next collective: with a 50 ms deadline it left at
/// 100 ms, before its own start-up could end. Given the time to finish MPI_Init, it gets the parents' word
/// to leave (tell_new_processes) once their spawn returns, and leaves cleanly.
std::chrono::milliseconds join_deadline(std::chrono::milliseconds spawn_deadline) {
  return std::max(2 * spawn_deadline, std::chrono::milliseconds(5000));
}

/// The parents' word to the processes they spawned, over the intercommunicator, before any merge: join
/// (`go`) or leave, the group having given up on the spawn. Sent by the view's rank 0 (the spawn's root),
/// whichever thread holds the link then. A revoke of the link said "leave" before: the new process's
/// merge failed as it should, but every parent then crashed in MPI_Finalize (SIGBUS in
/// ompi_comm_shrink_internal, Open MPI 5.0.7), 3 runs of 3. Returns the MPI error code.
int tell_new_processes(MPI_Comm inter, bool go) {
  int rank = -1;
  MPI_Comm_rank(inter, &rank);
  int word = go ? 1 : 0;
  return MPI_Bcast(&word, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter);
}

/// One MPI_Comm_spawn on a helper thread, shared with it: the caller may stop waiting (abandon it) while
/// the thread is still blocked in MPI, so neither owns the other.
struct SpawnCall {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  int rc = MPI_SUCCESS;
  MPI_Comm inter = MPI_COMM_NULL;
  std::vector<int> errcodes;
};
#if SINEW_HAVE_ULFM
/// Revokes `comm` and returns the communicator of its live members, adding the time of each to `rep`.
/// Throws CommFailure if MPI cannot shrink (shrink itself is fault tolerant: not a failure to work around).
MPI_Comm revoke_and_shrink(MPI_Comm comm, ShrinkReport& rep) {
  auto t = Clock::now();
  MPIX_Comm_revoke(comm);
  rep.revoke_ms += ms_since(t);
  t = Clock::now();
  MPI_Comm next = MPI_COMM_NULL;
  const int rc = MPIX_Comm_shrink(comm, &next);
  rep.shrink_ms += ms_since(t);
  if (rc != MPI_SUCCESS) SINEW_THROW(CommFailure, "MPIX_Comm_shrink failed: {}", mpi::error_string(rc));
  return next;
}
#endif
}  // namespace

struct JoinDeadline::State {
  std::mutex mu;
  std::condition_variable cv;
  bool joined = false;
};

JoinDeadline::JoinDeadline() {
  // Read before any thread starts (main(), before MPI_Init), so getenv's lack of thread safety is moot.
  const char* v = std::getenv(kJoinDeadlineVar);  // NOLINT(concurrency-mt-unsafe)
  if (v == nullptr) return;
  const long ms = std::strtol(v, nullptr, 10);
  if (ms <= 0) return;
  state_ = std::make_shared<State>();
  std::thread([s = state_, ms] {
    std::unique_lock lock(s->mu);
    if (s->cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return s->joined; })) return;
    std::fprintf(stderr,
                 "[sinew] spawned process: could not join the group within %ld ms (its parents gave up on "
                 "the spawn); leaving\n",
                 ms);
    std::fflush(stderr);
    JoinDeadline::leave();
  }).detach();
}

JoinDeadline::~JoinDeadline() { joined(); }

void JoinDeadline::leave() {
  // The process is inside (or just failed) MPI_Init. Exiting as is would be an "improper" exit to
  // PRRTE (called init, no finalize), which ends the whole job with mpirun exit code 1, and a signal is
  // reported as exit code 137 (both measured). So it first tells its PMIx server that it finalizes
  // (PMIx_Finalize, found at run time: Open MPI links it, Sinew does not), then exits 0.
  // PMIx_Finalize takes PMIx's global lock, which PMIx_Init holds while it waits for its server: in a
  // process stuck inside MPI_Init it never returns (seen once in chaos.short: the abandoned process and
  // so mpirun outlived the trial's deadline). It gets 5 s; then the process exits without it.
  std::fflush(nullptr);
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(0);
  }).detach();
  using PmixFinalize = int (*)(const void*, std::size_t);
  if (auto* fin = reinterpret_cast<PmixFinalize>(::dlsym(RTLD_DEFAULT, "PMIx_Finalize"))) fin(nullptr, 0);
  std::_Exit(0);
}

bool JoinDeadline::spawned() const noexcept { return state_ != nullptr; }

void JoinDeadline::joined() {
  if (!state_) return;
  {
    std::lock_guard lock(state_->mu);
    state_->joined = true;
  }
  state_->cv.notify_all();
}

SpawnCommand SpawnCommand::of_this_process(int argc, const char* const* argv) {
  std::array<char, PATH_MAX> exe{};
  const ssize_t n = ::readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  SpawnCommand cmd;
  cmd.program =
      n > 0 ? std::string(exe.data(), static_cast<std::size_t>(n)) : std::string(argc > 0 ? argv[0] : "");
  if (argc > 1) cmd.args.assign(argv + 1, argv + argc);
  return cmd;
}

Group::Group(mpi::Communicator comm, std::uint64_t epoch, Role role, int launch_rank, SpawnCommand spawn)
    : epoch_(epoch), role_(role), launch_rank_(launch_rank), spawn_(std::move(spawn)) {
  adopt(std::move(comm));
}

void Group::adopt(mpi::Communicator comm) {
  comm_ = std::move(comm);
  rank_ = comm_.valid() ? comm_.rank() : -1;  // a hot spare is in no view
  size_ = comm_.valid() ? comm_.size() : 0;
}

Group Group::attach(SpawnCommand spawn) {
  RepairWatch::leave_when_orphaned();
  MPI_Comm parent = MPI_COMM_NULL;
  SINEW_MPI(MPI_Comm_get_parent(&parent));
  if (parent == MPI_COMM_NULL) {
    const auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
    const int rank = world.rank();
    return Group(world.dup(), 0, Role::kInitial, rank, std::move(spawn));
  }
  // Spawned by grow(): merge with the parents (they come first), then learn the view's epoch.
  MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
  int go = 0;  // tell_new_processes()
  const int grc = MPI_Bcast(&go, 1, MPI_INT, 0, parent);
  if (grc != MPI_SUCCESS || go == 0) {
    MPI_Comm_free(&parent);
    SINEW_THROW(membership::JoinFailed, "{}",
                grc != MPI_SUCCESS
                    ? fmt::format("waiting for the parents' word failed: {}", mpi::error_string(grc))
                    : std::string("the parents gave up on the spawn"));
  }
  MPI_Comm merged = MPI_COMM_NULL;
  const int mrc = MPI_Intercomm_merge(parent, /*high=*/1, &merged);
  if (mrc != MPI_SUCCESS) {
    // The parents gave up (revoked the link) or one died: they recover without this process.
    MPI_Comm_free(&parent);
    SINEW_THROW(membership::JoinFailed, "MPI_Intercomm_merge with the parents failed: {}",
                mpi::error_string(mrc));
  }
  mpi::Communicator comm(merged);
  std::uint64_t epoch = 0;
  const int brc = MPI_Bcast(&epoch, 1, MPI_UINT64_T, 0, comm.get());
  MPI_Comm_free(&parent);
  if (brc != MPI_SUCCESS) {
    // The parents adopt the merged view only after this broadcast succeeded at them, so a failure here
    // leaves them recovering over their old view, without this process.
    SINEW_THROW(membership::JoinFailed, "receiving the view's epoch from the parents failed: {}",
                mpi::error_string(brc));
  }
  return Group(std::move(comm), epoch, Role::kRecovered, -1, std::move(spawn));
}

Group Group::attach(SpawnCommand spawn, int spares) {
  if (spares <= 0) return attach(std::move(spawn));
  RepairWatch::leave_when_orphaned();
  MPI_Comm parent = MPI_COMM_NULL;
  SINEW_MPI(MPI_Comm_get_parent(&parent));
  if (parent != MPI_COMM_NULL) {
    // Spawned to replace members once the spares were used up: the group has no pool any more.
    return attach(std::move(spawn));
  }
  const auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  const int rank = world.rank(), size = world.size();
  if (SINEW_HAVE_ULFM == 0 || !mpi::ulfm_enabled()) {
    SINEW_THROW(InvalidArgument,
                "--spares {} needs ULFM (run under Open MPI 5 with `mpirun --with-ft ulfm`): spares replace "
                "failed members in place",
                spares);
  }
  if (size <= spares) {
    SINEW_THROW(InvalidArgument,
                "--spares {} needs more than {} processes (members plus spares), this job has {}: launch "
                "with `mpirun -n <ranks + spares>`",
                spares, spares, size);
  }
  const int members = size - spares;
  mpi::Communicator pool = world.dup();
  MPI_Comm view = MPI_COMM_NULL;
  SINEW_MPI(MPI_Comm_split(pool.get(), rank < members ? 0 : MPI_UNDEFINED, rank, &view));
  Group g(mpi::Communicator(view), 0, Role::kInitial, rank, std::move(spawn));
  g.pool_ = std::move(pool);
  for (int r = members; r < size; ++r) g.spare_ranks_.push_back(r);
  if (rank >= members) {
    g.spare_ = true;
    g.rank_ = -1;
    g.size_ = members;
  }
  return g;
}

Group Group::over(const mpi::Communicator& comm, SpawnCommand spawn) {
  RepairWatch::leave_when_orphaned();
  const int rank = comm.rank();
  return Group(comm.dup(), 0, Role::kInitial, rank, std::move(spawn));
}

ShrinkReport Group::shrink(const RecoveryHook& hook) {
#if SINEW_HAVE_ULFM
  if (!mpi::ulfm_enabled()) {
    SINEW_THROW(CommFailure,
                "a member of the group failed and this MPI job has no ULFM (run under Open MPI 5 "
                "with `mpirun --with-ft ulfm`, or use --elastic restart)");
  }
  ShrinkReport rep;
  const int before = size_;
  // The detector runs on through the recovery (rebuilt over the new view below): a process cut off from
  // the data network while the others wait for it in the shrink must still fence itself.
  if (live_) live_->recovering();
  for (;;) {
    ++rep.attempts;
    auto deadline = repair_guard(fmt::format("revoke and shrink (attempt {})", rep.attempts));
    if (hook) hook(rep.attempts);
    MPI_Comm next = revoke_and_shrink(comm_.get(), rep);
    comm_.destroy();
    adopt(mpi::Communicator(next));
    ++epoch_;
    deadline = repair_guard(fmt::format("agreement on the shrunk group (attempt {})", rep.attempts));
    const auto t = Clock::now();
    int flag = 1;
    const int arc = MPIX_Comm_agree(comm_.get(), &flag);
    rep.agree_ms += ms_since(t);
    deadline.release();
    if (arc == MPI_SUCCESS) break;
    // A member of the shrunk view died before the agreement: acknowledge and shrink again.
    spdlog::warn("a member failed during recovery (attempt {}): {}; recovering again", rep.attempts,
                 mpi::error_string(arc));
    MPIX_Comm_failure_ack(comm_.get());
  }
  rep.lost = before - size_;
  role_ = role_ == Role::kRecovered ? Role::kRecovered : Role::kSurvivor;
  rewatch();
  return rep;
#else
  (void)hook;
  SINEW_THROW(CommFailure,
              "a member of the group failed and this MPI has no ULFM (Sinew was built against an MPI "
              "without MPIX_Comm_shrink); use --elastic restart");
#endif
}

GrowReport Group::grow(int n, std::chrono::milliseconds deadline, const std::function<void()>& spawning) {
  GrowReport rep;
  if (n <= 0) return rep;
  if (spawn_.empty()) {
    // Every member of a group is made the same way (attach() from one main(), or over() with one
    // command), so every member throws here and none is left waiting in the spawn.
    throw SpawnError(fmt::format("cannot start {} new processes: this group has no spawn command (make it "
                                 "with Group::attach(SpawnCommand::of_this_process(argc, argv)) or pass "
                                 "one to Group::over())",
                                 n),
                     SourceLocation::current());
  }
  const bool ft = SINEW_HAVE_ULFM != 0 && mpi::ulfm_enabled();
  // Spawning onto a host whose processes went silent (cut off) would leave the new process unable to
  // join: the members then block in MPI_Intercomm_merge for ever (Open MPI 5.0.7; revoking the link from
  // a watchdog made the merge loop in libnbc). So after such a failure the new processes go to the hosts
  // the group still reaches (MPI_Info "host"; only the root's info counts). Otherwise the runtime chooses
  // (a failed process's free slot), which keeps one process per device on an accelerator cluster.
  // The detector over the current view runs on through the spawn (rebuilt over the grown view at the
  // end, with the new members: they call watch() after attach()).
  std::vector<std::string> reach;
  if (live_) reach = live_->hosts();
  note_silent();
  for (const std::string& h : silent_hosts_) std::erase(reach, h);
  auto call = std::make_shared<SpawnCall>();
  call->errcodes.assign(static_cast<std::size_t>(n), MPI_SUCCESS);
  MPI_Info info = MPI_INFO_NULL;
  if (ft) {
    // The new processes leave by themselves if they cannot join in time (join_deadline(), JoinDeadline).
    MPI_Info_create(&info);
    const std::string env = fmt::format("{}={}", kJoinDeadlineVar, join_deadline(deadline).count());
    MPI_Info_set(info, "PMIX_ENVAR", env.c_str());
    // MPI-4's key: an MPI_Init that fails in a new process (its spawn abandoned) returns an error there
    // instead of aborting the job; the process then leaves (apps/sinew_train.cpp).
    MPI_Info_set(info, "mpi_initial_errhandler", "mpi_errors_return");
    if (!silent_hosts_.empty() && !reach.empty()) {
      const std::string hosts = fmt::format("{}", fmt::join(reach, ","));
      MPI_Info_set(info, "host", hosts.c_str());
      if (rank_ == 0) spdlog::info("spawning onto {} (hosts the group reaches)", hosts);
    }
  }
  // The spawn runs on a private dup of the view, freed by the helper once MPI_Comm_spawn returns. A
  // member that gives up on the spawn goes on with collectives on the view (the agreement below, the
  // detector's allgather, training) while its helper may still be in the spawn's own collectives;
  // on the view itself those two streams would be matched against each other (erroneous MPI: in
  // elastic.spawn-deadline the abandoned spawn then never finished, or a member crashed in
  // ompi_dpm_connect_accept's fragment callback, about 1 run in 10).
  MPI_Comm spawn_comm = comm_.get();
  if (ft) {
    const auto dup_deadline = repair_guard("the communicator duplicate for a spawn");
    const int drc = MPI_Comm_dup(comm_.get(), &spawn_comm);
    if (drc != MPI_SUCCESS) {
      if (info != MPI_INFO_NULL) MPI_Info_free(&info);
      SINEW_THROW(CommFailure, "a member failed before the group could grow: {}", mpi::error_string(drc));
    }
    MPI_Comm_set_errhandler(spawn_comm, MPI_ERRORS_RETURN);
  }
  auto t = Clock::now();
  // `spawning` (a test's fault) runs right before the spawn starts.
  if (spawning) spawning();
  // The helper owns copies of everything it uses: it may outlive this call (abandoned, see the header).
  std::thread([call, cmd = spawn_, n, comm = spawn_comm, ft, info]() mutable {
    std::vector<char*> argv;
    for (auto& a : cmd.args) argv.push_back(a.data());
    argv.push_back(nullptr);
    MPI_Comm inter = MPI_COMM_NULL;
    const int rc =
        MPI_Comm_spawn(cmd.program.c_str(), argv.data(), n, info, 0, comm, &inter, call->errcodes.data());
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    std::lock_guard lock(call->mu);
    call->rc = rc;
    call->inter = inter;
    call->done = true;
    if (call->abandoned && inter != MPI_COMM_NULL) {
      // Returned after the group gave up on it: the new processes must not wait for a merge.
      tell_new_processes(call->inter, false);
      MPI_Comm_free(&call->inter);
    }
    if (ft)
      MPI_Comm_free(&comm);  // the private dup, under the lock: the caller may revoke it (below) until done
    call->cv.notify_all();
  }).detach();
  bool timed_out = false;
  {
    std::unique_lock lock(call->mu);
    if (ft) {
      timed_out = !call->cv.wait_for(lock, deadline, [&] { return call->done; });
      if (timed_out) call->abandoned = true;
    } else {
      // Without ULFM the members cannot agree on giving up: wait as MPI does.
      call->cv.wait(lock, [&] { return call->done; });
    }
  }
  const int rc = timed_out ? MPI_SUCCESS : call->rc;
  MPI_Comm inter = timed_out ? MPI_COMM_NULL : call->inter;
  const std::vector<int> errcodes = timed_out ? std::vector<int>{} : call->errcodes;
  if (timed_out) {
    spdlog::warn("MPI_Comm_spawn of {} processes did not return within {} ms; giving up on it", n,
                 deadline.count());
  }
  std::string why = timed_out ? fmt::format("the spawn did not complete within {} ms", deadline.count())
                    : rc != MPI_SUCCESS ? mpi::error_string(rc)
                                        : "";
  for (int e : errcodes) {
    if (e != MPI_SUCCESS && why.empty()) why = mpi::error_string(e);
  }
#if SINEW_HAVE_ULFM
  if (mpi::ulfm_enabled()) {
    // A member may have died during the spawn: then the spawn succeeded at some members only. Agree
    // (fault-tolerantly) before merging; on failure, revoke the new processes' link so that they stop.
    int flag = why.empty() ? 1 : 0;
    auto agree_deadline = repair_guard("the agreement on a spawn's outcome");
    const int arc = MPIX_Comm_agree(comm_.get(), &flag);
    agree_deadline.release();
    if (arc != MPI_SUCCESS || flag == 0) {
      if (arc != MPI_SUCCESS) {
        // A member died: an abandoned helper still in the spawn's collectives waits for it in vain.
        // Revoking its communicator ends those waits (the root may stay in PMIx_Connect; see the header).
        std::lock_guard lock(call->mu);
        if (!call->done) MPIX_Comm_revoke(spawn_comm);
      }
      if (inter != MPI_COMM_NULL) {
        tell_new_processes(inter, false);
        MPI_Comm_free(&inter);
      }
      if (arc != MPI_SUCCESS) {
        MPIX_Comm_failure_ack(comm_.get());
        SINEW_THROW(CommFailure, "a member failed while the group was growing: {}", mpi::error_string(arc));
      }
      rewatch();  // every member alive, the view unchanged
      throw SpawnError(fmt::format("could not start {} new processes: {}", n,
                                   why.empty() ? "another member's spawn failed" : why),
                       SourceLocation::current());
    }
  }
#endif
  if (!why.empty()) {
    rewatch();
    throw SpawnError(fmt::format("could not start {} new processes: {}", n, why), SourceLocation::current());
  }
  rep.spawn_ms = ms_since(t);
  t = Clock::now();
  auto merge_deadline = repair_guard("the merge with the spawned processes");
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  const int grc = tell_new_processes(inter, true);
  if (grc != MPI_SUCCESS) MPI_Comm_free(&inter);
  mpi::check(grc, "telling the new processes to join");
  MPI_Comm merged = MPI_COMM_NULL;
  const int mrc = MPI_Intercomm_merge(inter, /*high=*/0, &merged);
  MPI_Comm_free(&inter);
  mpi::check(mrc, "MPI_Intercomm_merge");
  mpi::Communicator next(merged);
  std::uint64_t epoch = epoch_ + 1;
  SINEW_MPI(MPI_Bcast(&epoch, 1, MPI_UINT64_T, 0, next.get()));
  rep.merge_ms = ms_since(t);
  merge_deadline.release();
  comm_.destroy();
  adopt(std::move(next));
  epoch_ = epoch;
  rep.added = n;
  if (role_ == Role::kInitial) role_ = Role::kSurvivor;
  // Spawning comes after the spares are used up; the new members are in no pool, so the group has none.
  pool_.destroy();
  spare_ranks_.clear();
  rewatch();
  return rep;
}

namespace {
constexpr int kPoolTag = 7301;  ///< the members' dismissal of the spares
constexpr int kDismiss = 1;

/// What each process of the shrunk pool brings to a reform.
struct PoolEntry {
  std::int32_t member = 0;  ///< 1: a member of the old view; 0: a spare
  std::int32_t leaving = 0;
  std::int32_t old_rank = -1;
  std::int32_t old_size = 0;
  std::int32_t want_size = 0;  ///< the members' (all alike); a spare brings 0
  std::int32_t pad = 0;
  std::uint64_t epoch = 0;
};
const int kDismissMessage = kDismiss;
}  // namespace

std::optional<ShrinkReport> Group::wait_as_spare(std::chrono::milliseconds poll) {
#if SINEW_HAVE_ULFM
  ShrinkReport rep;
  while (spare_) {
    int msg = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(&msg, 1, MPI_INT, MPI_ANY_SOURCE, kPoolTag, pool_.get(), &req);
    for (;;) {
      int done = 0;
      if (rc == MPI_SUCCESS) rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      int cls = MPI_SUCCESS;
      if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
      if (cls == MPIX_ERR_PROC_FAILED_PENDING || cls == MPIX_ERR_PROC_FAILED) {
        // A process of the pool died (a member or another spare). The members will reform if it was
        // one of them; the receive from any source goes on once the failure is acknowledged.
        MPIX_Comm_failure_ack(pool_.get());
        if (cls == MPIX_ERR_PROC_FAILED) {
          rc = MPI_Irecv(&msg, 1, MPI_INT, MPI_ANY_SOURCE, kPoolTag, pool_.get(), &req);
        } else {
          rc = MPI_SUCCESS;
        }
        continue;
      }
      if (rc != MPI_SUCCESS) break;  // revoked: the members reform
      if (done != 0) {
        if (msg == kDismiss) return std::nullopt;
        break;
      }
      std::this_thread::sleep_for(poll);
    }
    mpi::complete_or_cancel(req, std::chrono::milliseconds(0));  // never freed while pending
    rep = reform(0, false);
  }
  return rep;
#else
  (void)poll;
  return std::nullopt;
#endif
}

ShrinkReport Group::reform(int want_size, bool leaving, const RecoveryHook& hook) {
  ShrinkReport rep;
#if SINEW_HAVE_ULFM
  const bool was_member = !spare_;
  rep.from_size = size_;
  const int old_rank = rank_;
  if (live_) live_->recovering();  // as in shrink(): runs on through the reform
  for (;;) {
    ++rep.attempts;
    auto deadline = repair_guard(fmt::format("revoke and shrink of the pool (attempt {})", rep.attempts));
    if (hook && was_member) hook(rep.attempts);
    if (comm_.valid()) MPIX_Comm_revoke(comm_.get());  // members blocked in the view return
    pool_ = mpi::Communicator(revoke_and_shrink(pool_.get(), rep));
    deadline = repair_guard(fmt::format("the new view's split and agreement (attempt {})", rep.attempts));
    const auto t = Clock::now();
    // Who is left, and what each was. A member's entry is the same in every attempt: it describes the
    // view before this change.
    PoolEntry mine;
    mine.member = was_member ? 1 : 0;
    mine.leaving = leaving ? 1 : 0;
    mine.old_rank = old_rank;
    mine.old_size = rep.from_size;
    mine.want_size = was_member ? want_size : 0;
    mine.epoch = epoch_;
    const int n = pool_.size();
    std::vector<PoolEntry> all(static_cast<std::size_t>(n));
    int ok = MPI_Allgather(&mine, sizeof(PoolEntry), MPI_BYTE, all.data(), sizeof(PoolEntry), MPI_BYTE,
                           pool_.get()) == MPI_SUCCESS;
    // The new view: surviving members in their order, then the first spares; the pool keeps all but
    // the leaving ones.
    std::vector<int> key(static_cast<std::size_t>(n), -1);
    int survivors = 0, leavers = 0, from_size = 0, want = 0;
    std::uint64_t epoch = 0;
    for (int r = 0; r < n; ++r) {
      const auto& e = all[static_cast<std::size_t>(r)];
      if (e.member == 0) continue;
      from_size = std::max(from_size, e.old_size);
      want = std::max(want, e.want_size);
      epoch = std::max(epoch, e.epoch);
      if (e.leaving != 0) {
        ++leavers;
      } else {
        key[static_cast<std::size_t>(r)] = e.old_rank;
        ++survivors;
      }
    }
    // The spares left idle, by their rank in the new pool (the split keeps the order and drops only the
    // leaving processes, which are members).
    const int promote = std::max(0, want - survivors);
    int promoted = 0, kept = 0;
    std::vector<int> idle;
    for (int r = 0; r < n; ++r) {
      const auto& e = all[static_cast<std::size_t>(r)];
      const int new_rank = e.leaving != 0 ? -1 : kept++;
      if (e.member != 0) continue;
      if (promoted < promote) {
        key[static_cast<std::size_t>(r)] = INT_MAX / 2 + r;
        ++promoted;
      } else {
        idle.push_back(new_rank);
      }
    }
    const int me = pool_.rank();
    MPI_Comm next_pool = MPI_COMM_NULL, view = MPI_COMM_NULL;
    if (ok != 0) ok = MPI_Comm_split(pool_.get(), leaving ? MPI_UNDEFINED : 0, me, &next_pool) == MPI_SUCCESS;
    if (ok != 0) {
      const int k = key[static_cast<std::size_t>(me)];
      ok = MPI_Comm_split(pool_.get(), k >= 0 ? 0 : MPI_UNDEFINED, std::max(k, 0), &view) == MPI_SUCCESS;
    }
    // A process that failed here interrupts the others still inside these collectives.
    if (ok == 0) MPIX_Comm_revoke(pool_.get());
    const int arc = MPIX_Comm_agree(pool_.get(), &ok);
    rep.agree_ms += ms_since(t);
    deadline.release();
    if (arc != MPI_SUCCESS || ok == 0) {
      if (next_pool != MPI_COMM_NULL) MPI_Comm_free(&next_pool);
      if (view != MPI_COMM_NULL) MPI_Comm_free(&view);
      spdlog::warn("a process failed while the pool was reforming (attempt {}): {}; reforming again",
                   rep.attempts, mpi::error_string(arc != MPI_SUCCESS ? arc : MPI_ERR_OTHER));
      MPIX_Comm_failure_ack(pool_.get());
      continue;
    }
    rep.from_size = from_size;
    rep.lost = from_size - survivors - leavers;
    rep.promoted = promoted;
    comm_.destroy();
    spare_ranks_ = std::move(idle);
    pool_ = next_pool != MPI_COMM_NULL ? mpi::Communicator(next_pool) : mpi::Communicator();
    epoch_ = epoch + 1;
    if (view != MPI_COMM_NULL) {
      adopt(mpi::Communicator(view));
      if (spare_) {
        spare_ = false;
        role_ = Role::kRecovered;
      } else if (role_ == Role::kInitial) {
        role_ = Role::kSurvivor;
      }
    } else {
      rank_ = -1;  // a spare still, or a member that left
      size_ = spare_ ? survivors + promoted : 0;
    }
    break;
  }
  rewatch();
  return rep;
#else
  (void)want_size;
  (void)leaving;
  (void)hook;
  SINEW_THROW(CommFailure, "hot spares need ULFM");
#endif
}

RepairWatch::Guard Group::repair_guard(std::string what, std::chrono::milliseconds extra) const {
  // A silent member is noticed within the stall timeout (Liveness); without the detector, ULFM's own
  // report of a dead process takes about as long as its default.
  const auto detect = watch_.count() > 0 ? watch_ : kDefaultDetect;
  return RepairWatch::process().arm(std::move(what), repair_deadline(size_ + spares(), detect) + extra);
}

void Group::watch(std::chrono::milliseconds timeout) {
  watch_ = timeout;
  rewatch();
}

void Group::note_silent() {
  if (!live_) return;
  for (std::string& h : live_->silent_hosts()) {
    if (std::find(silent_hosts_.begin(), silent_hosts_.end(), h) == silent_hosts_.end())
      silent_hosts_.push_back(std::move(h));
  }
}

void Group::unwatch() {
  note_silent();
  live_.reset();
}

void Group::rewatch() {
  unwatch();
  if (watch_.count() <= 0) return;
  const mpi::Communicator& over = pool_.valid() ? pool_ : comm_;
  if (!over.valid()) return;
  const auto deadline = repair_guard("the failure detector's set-up over the new view");
  live_ = std::make_unique<Liveness>(over, watch_);
}

void Group::dismiss_spares() {
  if (!pool_.valid() || spare_) return;
  // Every member tells every spare, so that the spares leave even if a member dies now; a spare that
  // died is simply not told (the error is expected and ignored). The sends are small (eager): they
  // complete at once.
  std::vector<MPI_Request> reqs(spare_ranks_.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < reqs.size(); ++i)
    MPI_Isend(&kDismissMessage, 1, MPI_INT, spare_ranks_[i], kPoolTag, pool_.get(), &reqs[i]);
  for (auto& r : reqs) mpi::complete_or_cancel(r, std::chrono::milliseconds(1000));
}

void Group::split_leave(bool leaving) {
  unwatch();
  MPI_Comm next = MPI_COMM_NULL;
  auto deadline = repair_guard("the split for leaving members");
  SINEW_MPI(MPI_Comm_split(comm_.get(), leaving ? MPI_UNDEFINED : 0, rank_, &next));
  deadline.release();
  comm_.destroy();
  ++epoch_;
  if (leaving) {
    rank_ = -1;
    size_ = 0;
    return;
  }
  adopt(mpi::Communicator(next));
  if (role_ == Role::kInitial) role_ = Role::kSurvivor;
  rewatch();
}

}  // namespace sinew::membership
