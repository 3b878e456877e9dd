// The launch environment: who started this process (srun, mpirun/prterun, another PMIx or PMI launcher, or
// nobody), its rank and size in that launch, the Slurm job it runs in, and the restart generation. It is
// read from the variables the launcher set before the process started, once (current()), so that every
// layer sees the same values and nothing reads the environment after MPI_Init or a thread started.
//
//   launcher   variables                                           rank / size
//   open-mpi   OMPI_COMM_WORLD_RANK or PRTE_LAUNCHED (mpirun,      OMPI_COMM_WORLD_RANK/_SIZE, else PMIX_RANK
//              prterun; also under Slurm, where the daemons run
//              in an srun step)
//   slurm      SLURM_STEP_ID (or SLURM_STEPID) with SLURM_PROCID   SLURM_PROCID / SLURM_STEP_NUM_TASKS
//              (srun starts the process itself)                    (else SLURM_NTASKS)
//   pmix       PMIX_RANK (another PMIx launcher)                   PMIX_RANK / unknown
//   pmi        PMI_RANK (MPICH's Hydra)                            PMI_RANK / PMI_SIZE
//   none       none of these (a singleton)                         unknown
//
// The Slurm job (SLURM_JOB_ID; array job and task, node list) is independent of the launcher: mpirun in a
// batch script is launcher open-mpi in a Slurm job. The batch script's own environment (SLURM_PROCID=0,
// no step id) is a Slurm job without a launcher.
//
// Restart generation: a relaunch of the same training. Two things relaunch it: Slurm requeues the job
// (SLURM_RESTART_COUNT = 1, 2, ...) and mpi_scripts/sinew-supervise relaunches mpirun inside it
// (SINEW_RESTART_GENERATION = 1, 2, ..., from 0 again in every run of the batch script). Both can happen in
// one job, so they combine into one number, ordered first by the restart count, then by Sinew's
// generation:
//
//   generation = SLURM_RESTART_COUNT * 1000 + SINEW_RESTART_GENERATION     (SINEW_RESTART_GENERATION < 1000)
//
// e.g. 0 (first launch), 1, 2 (sinew-supervise relaunches), 1000 (requeued), 1001 (relaunched after the
// requeue). Any generation > 0 is a relaunch: metrics are appended, injected faults do not fire again, and
// the audit orders the records of successive launches by it (mpi_scripts/check-audit.py).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "sinew/core/names.hpp"

namespace sinew::launch {

enum class Launcher : std::uint8_t { kNone, kSlurm, kOpenMpi, kPmix, kPmi };
inline constexpr NameTable<Launcher, 5> kLauncherNames{{{Launcher::kNone, "none"},
                                                        {Launcher::kSlurm, "slurm"},
                                                        {Launcher::kOpenMpi, "open-mpi"},
                                                        {Launcher::kPmix, "pmix"},
                                                        {Launcher::kPmi, "pmi"}}};

/// Sinew generations per Slurm restart in the combined generation (see the file comment).
inline constexpr int kGenerationsPerRestart = 1000;
/// The largest SLURM_RESTART_COUNT whose combined generation fits an int.
inline constexpr int kMaxRestartCount = (2147483647 - (kGenerationsPerRestart - 1)) / kGenerationsPerRestart;

/// The Slurm job this process runs in.
struct SlurmJob {
  std::string job_id;         ///< SLURM_JOB_ID (SLURM_JOBID on old Slurm): unique, also per array task
  std::string array_job_id;   ///< SLURM_ARRAY_JOB_ID; empty outside a job array
  std::string array_task_id;  ///< SLURM_ARRAY_TASK_ID; empty outside a job array
  std::string node_list;      ///< SLURM_JOB_NODELIST (SLURM_NODELIST), e.g. "node[01-04]"; may be empty
  std::string step_id;  ///< SLURM_STEP_ID (SLURM_STEPID): set in an srun step, empty in the batch script
};

struct Launch {
  Launcher launcher = Launcher::kNone;
  int rank = -1;  ///< this process's rank in its launch (not its rank in the training group); -1: unknown
  int size = -1;  ///< processes in the launch; -1: unknown
  std::string pmix_namespace;     ///< PMIX_NAMESPACE; empty if not set
  std::optional<SlurmJob> slurm;  ///< set when SLURM_JOB_ID is
  int restart_count = 0;          ///< SLURM_RESTART_COUNT (0 if unset): how often Slurm requeued the job
  int sinew_generation = 0;       ///< SINEW_RESTART_GENERATION (0 if unset): sinew-supervise's relaunches
  std::string node;               ///< SLURMD_NODENAME, else (current() only) the host name
  /// SINEW_STATUS_DIR: where the launcher (sinew-run) reads this launch's status records (core/status.hpp);
  /// empty if not set.
  std::string status_dir;
  /// Why SLURM_RESTART_COUNT or SINEW_RESTART_GENERATION cannot be used (not a whole number, too large);
  /// empty if both can. restart_generation() and the %r pattern throw it, nothing else does.
  std::string problem;

  /// Whether a launcher started this process (it then has peers that started the same way).
  [[nodiscard]] bool launched() const noexcept { return launcher != Launcher::kNone; }
  /// The launch rank, 0 when unknown (a singleton): which process prints what all would print.
  [[nodiscard]] int rank_or_zero() const noexcept { return rank >= 0 ? rank : 0; }
  /// The combined restart generation (file comment). Throws InvalidArgument if `problem` is set.
  [[nodiscard]] int restart_generation() const;
  /// One line for the log: "open-mpi rank 0 of 4, Slurm job 1234 (restart 1)".
  [[nodiscard]] std::string describe() const;
};

/// An environment lookup like std::getenv: the value of the variable, or nullptr if it is not set.
using Lookup = std::function<const char*(const char* name)>;

/// The launch environment as `lookup` sees it. Never throws: malformed ranks and sizes read as unknown,
/// malformed generation variables are recorded in Launch::problem. Empty values count as unset.
Launch parse(const Lookup& lookup);

/// This process's launch environment, read with std::getenv on the first call (call it at the start of
/// main(), before MPI_Init and before any thread starts) and the same object afterwards.
const Launch& current();

/// restart_count * 1000 + sinew_generation; throws InvalidArgument naming the variable if the restart
/// count is outside [0, kMaxRestartCount] or Sinew's generation outside [0, 999].
int encode_generation(int restart_count, int sinew_generation);
/// The inverse: {restart_count, sinew_generation}. `generation` must be >= 0.
std::pair<int, int> decode_generation(int generation);

/// Expands the patterns of a path option: %j the Slurm job id, %r the Slurm restart count (0 outside a
/// requeued job), %% a literal %. Throws InvalidArgument naming `option` for %j outside a Slurm job, for
/// any other %x and for a lone % at the end.
std::string expand_path(std::string_view value, std::string_view option, const Launch& env);

}  // namespace sinew::launch
