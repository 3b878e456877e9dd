// The job's status, told to its launcher (mpi_scripts/sinew-run) as records, not as log text.
//
// sinew-run decides whether a launch has finished, and how to relaunch it, from what the job's processes
// record here: people read the log, the launcher reads these. When the launcher names a directory in the
// environment (SINEW_STATUS_DIR, one per launch; sinew-run sets it and passes it through mpirun with -x, srun
// passes the environment), every process appends one JSON object per line to a file of its own,
// DIR/HOST-PID.jsonl. Without the variable nothing is written.
//
//   event       written by                                            fields beside the common ones
//   start       every process, when its session starts (members,      -
//               hot spares, spawned replacements)
//   complete    rank 0 of the view, once training is over (the        world_size
//               "[sinew] job complete" line is its human twin)
//   relaunch    every process that leaves asking for a relaunch       reason (below), detail
//               (exit code 75), just before it leaves
//   cut-off     a process without a quorum, just before it fences     -
//               itself (SIGKILL): its host is cut off from the others
//
// Common fields, in this order: event, unix_time (s), host (gethostname), pid, launch_rank (-1: unknown),
// generation (the restart generation, core/launch.hpp), step (the last step this process completed; absent
// before its first). Relaunch reasons:
//
//   failure          restart mode: a rank failed and this survivor cannot recover in place
//   repair-deadline  a repair call stuck inside the MPI library passed its deadline (membership/repair_watch)
//   launcher-gone    the launcher's process on this node is gone (an orphan leaves)
//   min-ranks        fewer ranks than --min-ranks: checkpointed and stopped
//   stop-signal      SIGUSR1/SIGTERM: checkpointed and stopped
//
// How records are written, and why: one write() of the whole line on a descriptor opened with O_APPEND, so
// that a line is never torn by another thread of the process and a reader never sees half of one; no lock
// around the write, no allocation after the line is formatted, so that the repair watch's thread can write
// and _Exit at once while every other thread is stuck. No fsync, but for the complete record: the launcher
// watches for it while the job still runs (--exit-grace), and an NFS client holds written data until a
// close or a sync. A file of its own per process: O_APPEND is not atomic between NFS clients, and the files
// of a launch that is over are never written again (a late orphan writes into its own launch's directory).
// The directory is never created here: where it is missing (a node that does not share it), the process
// warns once on stderr and records nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "sinew/core/names.hpp"

namespace sinew::status {

/// The environment variable that names the directory of the records (set by the launcher, per launch).
inline constexpr const char* kDirVariable = "SINEW_STATUS_DIR";

/// Why a process leaves for a relaunch (the `reason` of a relaunch record).
enum class Reason : std::uint8_t { kFailure, kRepairDeadline, kLauncherGone, kMinRanks, kStopSignal };
inline constexpr NameTable<Reason, 5> kReasonNames{{{Reason::kFailure, "failure"},
                                                    {Reason::kRepairDeadline, "repair-deadline"},
                                                    {Reason::kLauncherGone, "launcher-gone"},
                                                    {Reason::kMinRanks, "min-ranks"},
                                                    {Reason::kStopSignal, "stop-signal"}}};

/// Who writes: carried by every record.
struct Identity {
  std::string host;      ///< gethostname(): the name a hostfile uses
  std::int64_t pid = 0;  ///< getpid()
  int launch_rank = -1;  ///< the rank in its launch (core/launch.hpp); -1 unknown
  int generation = 0;    ///< the restart generation
};

/// One process's records. Thread-safe; every method is noexcept (a record that cannot be written is lost,
/// with one warning on stderr, never an error of the job).
class Writer {
 public:
  /// Records into `dir`/HOST-PID.jsonl; an empty `dir` writes nothing.
  Writer(std::string dir, Identity who);
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();

  /// Whether records are written (a directory was named, and writing has not failed).
  [[nodiscard]] bool enabled() const noexcept;
  /// The file of the records ("" when no directory was named).
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// The last step this process completed: the `step` of every later record.
  void set_step(std::int64_t step) noexcept { step_.store(step, std::memory_order_relaxed); }
  /// Opens the file and writes the start record, once (later calls do nothing).
  void start() noexcept;
  /// Training is over: the job has its result (rank 0 of the view).
  void complete(int world_size) noexcept;
  /// This process leaves for a relaunch (exit code 75) for `why`; `detail` says more, for people.
  void relaunch(Reason why, std::string_view detail) noexcept;
  /// This process is cut off from the others and fences itself.
  void cut_off() noexcept;

 private:
  /// Writes one whole record line (with one write()); `sync`: fdatasync after it.
  void write_line(const std::string& line, bool sync) noexcept;
  /// The descriptor, opened on first use; -1 if disabled.
  int descriptor() noexcept;

  std::string dir_, path_;
  Identity who_;
  std::atomic<std::int64_t> step_{-1};
  std::once_flag started_;
  std::mutex open_mu_;
  std::atomic<int> fd_{-1};
  std::atomic<bool> failed_{false};
};

/// This process's writer: SINEW_STATUS_DIR from launch::current() (read at the start of main()), the
/// process's host, pid, launch rank and generation. Built on first use and never destroyed (the repair
/// watch's thread may write while the process exits).
Writer& process();

}  // namespace sinew::status
