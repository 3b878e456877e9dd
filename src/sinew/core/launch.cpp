#include "sinew/core/launch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <system_error>

#include "sinew/core/error.hpp"

namespace sinew::launch {

namespace {

/// The variable's value, nullptr if it is unset or empty.
const char* value_of(const Lookup& lookup, const char* name) {
  const char* v = lookup(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

/// The first of the variables that is set, nullptr if none is.
const char* first_of(const Lookup& lookup, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (const char* v = value_of(lookup, n)) return v;
  }
  return nullptr;
}

/// A whole number in [0, INT_MAX] written in decimal digits only; nullopt otherwise.
std::optional<int> whole_number(const char* text) {
  if (text == nullptr) return std::nullopt;
  const std::string_view s(text);
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

int rank_from(const char* text) { return whole_number(text).value_or(-1); }

int size_from(const char* text) {
  const int v = whole_number(text).value_or(-1);
  return v > 0 ? v : -1;
}

/// A generation variable: 0 if unset; on a malformed value 0 and a message in `problem`.
int generation_var(const Lookup& lookup, const char* name, int max, const char* who_sets_it,
                   std::string& problem) {
  const char* text = value_of(lookup, name);
  if (text == nullptr) return 0;
  const auto v = whole_number(text);
  if (v && *v <= max) return *v;
  if (problem.empty()) {
    problem = fmt::format("{}='{}' is not a whole number in [0, {}] ({}); unset it or fix its value", name,
                          text, max, who_sets_it);
  }
  return 0;
}

bool slurm_step(const Lookup& lookup) {
  return first_of(lookup, {"SLURM_STEP_ID", "SLURM_STEPID"}) != nullptr &&
         value_of(lookup, "SLURM_PROCID") != nullptr;
}

}  // namespace

Launch parse(const Lookup& lookup) {
  Launch l;
  if (const char* ns = value_of(lookup, "PMIX_NAMESPACE")) l.pmix_namespace = ns;
  if (const char* job = first_of(lookup, {"SLURM_JOB_ID", "SLURM_JOBID"})) {
    SlurmJob s;
    s.job_id = job;
    if (const char* v = value_of(lookup, "SLURM_ARRAY_JOB_ID")) s.array_job_id = v;
    if (const char* v = value_of(lookup, "SLURM_ARRAY_TASK_ID")) s.array_task_id = v;
    if (const char* v = first_of(lookup, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"})) s.node_list = v;
    if (const char* v = first_of(lookup, {"SLURM_STEP_ID", "SLURM_STEPID"})) s.step_id = v;
    l.slurm = std::move(s);
  }
  if (const char* v = value_of(lookup, "SLURMD_NODENAME")) l.node = v;
  if (const char* v = value_of(lookup, "SINEW_STATUS_DIR")) l.status_dir = v;

  // Open MPI first: under Slurm, mpirun's processes on other nodes inherit the environment of the srun
  // step that started Open MPI's daemons (SLURM_STEP_ID, and the daemon's SLURM_PROCID, not theirs).
  if (const char* ompi = value_of(lookup, "OMPI_COMM_WORLD_RANK")) {
    l.launcher = Launcher::kOpenMpi;
    l.rank = rank_from(ompi);
    l.size = size_from(value_of(lookup, "OMPI_COMM_WORLD_SIZE"));
  } else if (value_of(lookup, "PRTE_LAUNCHED") != nullptr) {
    l.launcher = Launcher::kOpenMpi;
    l.rank = rank_from(value_of(lookup, "PMIX_RANK"));
  } else if (slurm_step(lookup)) {
    // srun, whatever its wire-up (--mpi=pmix sets PMIX_RANK, pmi2 PMI_RANK: the same rank).
    l.launcher = Launcher::kSlurm;
    l.rank = rank_from(value_of(lookup, "SLURM_PROCID"));
    l.size = size_from(first_of(lookup, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}));
  } else if (const char* pmix = value_of(lookup, "PMIX_RANK")) {
    l.launcher = Launcher::kPmix;
    l.rank = rank_from(pmix);
  } else if (const char* pmi = value_of(lookup, "PMI_RANK")) {
    l.launcher = Launcher::kPmi;
    l.rank = rank_from(pmi);
    l.size = size_from(value_of(lookup, "PMI_SIZE"));
  }

  l.restart_count = generation_var(lookup, "SLURM_RESTART_COUNT", kMaxRestartCount,
                                   "set by Slurm when it requeues a job", l.problem);
  l.sinew_generation = generation_var(lookup, "SINEW_RESTART_GENERATION", kGenerationsPerRestart - 1,
                                      "set by mpi_scripts/sinew-supervise for each relaunch", l.problem);
  return l;
}

const Launch& current() {
  static const Launch launch = [] {
    // Read at the start of main(), before any thread starts, so getenv's lack of thread safety is moot.
    Launch l = parse([](const char* name) { return std::getenv(name); });  // NOLINT(concurrency-mt-unsafe)
    if (l.node.empty()) {
      std::array<char, 256> host{};
      if (::gethostname(host.data(), host.size() - 1) == 0) l.node = host.data();
    }
    return l;
  }();
  return launch;
}

int Launch::restart_generation() const {
  if (!problem.empty()) SINEW_THROW(InvalidArgument, "launch environment: {}", problem);
  return encode_generation(restart_count, sinew_generation);
}

std::string Launch::describe() const {
  std::string out(name_of(kLauncherNames, launcher));
  if (rank >= 0) out += fmt::format(" rank {}", rank);
  if (size > 0) out += fmt::format(" of {}", size);
  if (slurm) {
    out += fmt::format(", Slurm job {}", slurm->job_id);
    if (!slurm->array_job_id.empty())
      out += fmt::format(" (array {}_{})", slurm->array_job_id, slurm->array_task_id);
    if (restart_count > 0) out += fmt::format(", restart {}", restart_count);
  }
  if (sinew_generation > 0) out += fmt::format(", relaunch {}", sinew_generation);
  return out;
}

int encode_generation(int restart_count, int sinew_generation) {
  if (restart_count < 0 || restart_count > kMaxRestartCount) {
    SINEW_THROW(InvalidArgument, "SLURM_RESTART_COUNT {} is outside [0, {}]", restart_count,
                kMaxRestartCount);
  }
  if (sinew_generation < 0 || sinew_generation >= kGenerationsPerRestart) {
    SINEW_THROW(InvalidArgument,
                "SINEW_RESTART_GENERATION {} is outside [0, {}]: the restart generation is "
                "SLURM_RESTART_COUNT * {} + SINEW_RESTART_GENERATION",
                sinew_generation, kGenerationsPerRestart - 1, kGenerationsPerRestart);
  }
  return restart_count * kGenerationsPerRestart + sinew_generation;
}

std::pair<int, int> decode_generation(int generation) {
  SINEW_ENFORCE(generation >= 0, "a restart generation is never negative, got {}", generation);
  return {generation / kGenerationsPerRestart, generation % kGenerationsPerRestart};
}

std::string expand_path(std::string_view value, std::string_view option, const Launch& env) {
  std::string out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%') {
      out += value[i];
      continue;
    }
    if (i + 1 == value.size()) {
      SINEW_THROW(InvalidArgument, "{} '{}': ends in a lone '%'; write %% for a literal %", option, value);
    }
    const char c = value[++i];
    if (c == '%') {
      out += '%';
    } else if (c == 'j') {
      if (!env.slurm) {
        SINEW_THROW(InvalidArgument,
                    "{} '{}': %j is the Slurm job id, but SLURM_JOB_ID is not set (this is not a Slurm job); "
                    "use %j only in jobs started by sbatch, salloc or srun, or write the path without it",
                    option, value);
      }
      out += env.slurm->job_id;
    } else if (c == 'r') {
      if (!env.problem.empty()) SINEW_THROW(InvalidArgument, "{} '{}': %r: {}", option, value, env.problem);
      out += fmt::format("{}", env.restart_count);
    } else {
      SINEW_THROW(
          InvalidArgument,
          "{} '{}': unknown pattern '%{}'; only %j (Slurm job id), %r (Slurm restart count) and %% (a "
          "literal %) expand",
          option, value, c);
    }
  }
  return out;
}

}  // namespace sinew::launch
