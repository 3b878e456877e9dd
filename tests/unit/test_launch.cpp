// The launch environment (core/launch.hpp): launchers recognised from their variables, the Slurm job, the
// combined restart generation, and the %j/%r patterns of the path options (test_options.cpp: the options
// that expand them). Every case feeds its own
// variables through a lookup; nothing reads or changes this process's environment.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "sinew/core/error.hpp"
#include "sinew/core/launch.hpp"

namespace sinew::launch {
namespace {

using Vars = std::map<std::string, std::string>;

Launch parse_vars(const Vars& vars) {
  return parse([&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

/// The message of the InvalidArgument that `f` throws ("" and a test failure if it throws none).
template <class F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.exit_code(), ExitCode::kUsage);
    return e.message();
  }
  ADD_FAILURE() << "no InvalidArgument thrown";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Launch, NothingSetIsASingleton) {
  const Launch l = parse_vars({});
  EXPECT_EQ(l.launcher, Launcher::kNone);
  EXPECT_FALSE(l.launched());
  EXPECT_EQ(l.rank, -1);
  EXPECT_EQ(l.size, -1);
  EXPECT_EQ(l.rank_or_zero(), 0);
  EXPECT_FALSE(l.slurm);
  EXPECT_EQ(l.restart_count, 0);
  EXPECT_EQ(l.sinew_generation, 0);
  EXPECT_EQ(l.restart_generation(), 0);
  EXPECT_TRUE(l.problem.empty());
  EXPECT_EQ(l.describe(), "none");
}

TEST(Launch, OpenMpi) {
  // What Open MPI 5's mpirun sets (measured), with a hot spare's size.
  const Launch l = parse_vars({{"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "5"},
                               {"PMIX_RANK", "3"},
                               {"PMIX_NAMESPACE", "prterun-host-123@1"},
                               {"PRTE_LAUNCHED", "1"}});
  EXPECT_EQ(l.launcher, Launcher::kOpenMpi);
  EXPECT_TRUE(l.launched());
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.size, 5);
  EXPECT_EQ(l.pmix_namespace, "prterun-host-123@1");
  EXPECT_FALSE(l.slurm);
  EXPECT_EQ(l.describe(), "open-mpi rank 3 of 5");
  // A program under prterun that is not an Open MPI one: PRRTE's PMIx rank.
  const Launch p = parse_vars({{"PRTE_LAUNCHED", "1"}, {"PMIX_RANK", "2"}});
  EXPECT_EQ(p.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.size, -1);
}

TEST(Launch, OpenMpiInsideSlurmTakesOpenMpisRank) {
  // mpirun in a batch script: a process on another node inherits the srun step of Open MPI's daemons,
  // whose SLURM_PROCID is the daemon's, not the process's.
  const Launch l = parse_vars({{"OMPI_COMM_WORLD_RANK", "6"},
                               {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"SLURM_JOB_ID", "4242"},
                               {"SLURM_STEP_ID", "0"},
                               {"SLURM_PROCID", "1"},
                               {"SLURM_NTASKS", "2"},
                               {"SLURM_JOB_NODELIST", "node[1-2]"},
                               {"SLURMD_NODENAME", "node2"}});
  EXPECT_EQ(l.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(l.rank, 6);
  EXPECT_EQ(l.size, 8);
  ASSERT_TRUE(l.slurm);
  EXPECT_EQ(l.slurm->job_id, "4242");
  EXPECT_EQ(l.slurm->node_list, "node[1-2]");
  EXPECT_EQ(l.slurm->step_id, "0");
  EXPECT_EQ(l.node, "node2");
  EXPECT_EQ(l.describe(), "open-mpi rank 6 of 8, Slurm job 4242");
}

TEST(Launch, SrunStep) {
  // srun --mpi=pmix: Slurm's rank and the step's size, whatever the wire-up sets besides.
  const Launch l = parse_vars({{"SLURM_JOB_ID", "77"},
                               {"SLURM_STEP_ID", "2"},
                               {"SLURM_PROCID", "5"},
                               {"SLURM_STEP_NUM_TASKS", "6"},
                               {"SLURM_NTASKS", "12"},
                               {"PMIX_RANK", "5"},
                               {"PMIX_NAMESPACE", "slurm.pmix.77.2"}});
  EXPECT_EQ(l.launcher, Launcher::kSlurm);
  EXPECT_EQ(l.rank, 5);
  EXPECT_EQ(l.size, 6);
  EXPECT_EQ(l.pmix_namespace, "slurm.pmix.77.2");
  // Old Slurm's names, and the job's task count when the step's is missing.
  const Launch old = parse_vars({{"SLURM_JOBID", "78"},
                                 {"SLURM_STEPID", "0"},
                                 {"SLURM_PROCID", "1"},
                                 {"SLURM_NTASKS", "2"},
                                 {"SLURM_NODELIST", "n1,n2"}});
  EXPECT_EQ(old.launcher, Launcher::kSlurm);
  EXPECT_EQ(old.rank, 1);
  EXPECT_EQ(old.size, 2);
  ASSERT_TRUE(old.slurm);
  EXPECT_EQ(old.slurm->job_id, "78");
  EXPECT_EQ(old.slurm->node_list, "n1,n2");
}

TEST(Launch, BatchScriptIsASlurmJobWithoutLauncher) {
  // sinew-train run by the batch script itself: SLURM_PROCID=0 but no step, so no peers to meet.
  const Launch l = parse_vars({{"SLURM_JOB_ID", "90"},
                               {"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "4"},
                               {"SLURM_ARRAY_JOB_ID", "88"},
                               {"SLURM_ARRAY_TASK_ID", "2"}});
  EXPECT_EQ(l.launcher, Launcher::kNone);
  EXPECT_FALSE(l.launched());
  ASSERT_TRUE(l.slurm);
  EXPECT_EQ(l.slurm->job_id, "90");
  EXPECT_EQ(l.slurm->array_job_id, "88");
  EXPECT_EQ(l.slurm->array_task_id, "2");
  EXPECT_TRUE(l.slurm->step_id.empty());
  EXPECT_EQ(l.describe(), "none, Slurm job 90 (array 88_2)");
}

TEST(Launch, PmixAndPmi) {
  const Launch x = parse_vars({{"PMIX_RANK", "4"}, {"PMIX_NAMESPACE", "ns"}});
  EXPECT_EQ(x.launcher, Launcher::kPmix);
  EXPECT_EQ(x.rank, 4);
  EXPECT_EQ(x.size, -1);
  const Launch h = parse_vars({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}});
  EXPECT_EQ(h.launcher, Launcher::kPmi);
  EXPECT_EQ(h.rank, 1);
  EXPECT_EQ(h.size, 3);
  EXPECT_EQ(h.describe(), "pmi rank 1 of 3");
}

TEST(Launch, MalformedRanksAreUnknownAndEmptyIsUnset) {
  const Launch l = parse_vars({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "0"}});
  EXPECT_EQ(l.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(l.rank, -1);
  EXPECT_EQ(l.size, -1);
  EXPECT_EQ(l.rank_or_zero(), 0);
  for (const char* bad : {"-1", "+1", " 1", "1 ", "1.0", "99999999999"}) {
    EXPECT_EQ(parse_vars({{"PMI_RANK", bad}}).rank, -1) << bad;
  }
  const Launch e =
      parse_vars({{"OMPI_COMM_WORLD_RANK", ""}, {"SLURM_JOB_ID", ""}, {"SLURM_RESTART_COUNT", ""}});
  EXPECT_EQ(e.launcher, Launcher::kNone);
  EXPECT_FALSE(e.slurm);
  EXPECT_EQ(e.restart_generation(), 0);
}

TEST(Launch, GenerationEncoding) {
  EXPECT_EQ(encode_generation(0, 0), 0);
  EXPECT_EQ(encode_generation(0, 2), 2);
  EXPECT_EQ(encode_generation(1, 0), 1000);
  EXPECT_EQ(encode_generation(1, 1), 1001);
  EXPECT_EQ(encode_generation(3, 999), 3999);
  EXPECT_EQ(encode_generation(kMaxRestartCount, 999), kMaxRestartCount * 1000 + 999);
  EXPECT_GT(kMaxRestartCount, 2000000);
  // Lexicographic: a later restart is always later, whatever Sinew's generation was before it.
  int previous = -1;
  for (int count = 0; count <= 3; ++count) {
    for (const int gen : {0, 1, 2, 500, 999}) {
      const int g = encode_generation(count, gen);
      EXPECT_GT(g, previous) << count << " " << gen;
      previous = g;
      EXPECT_EQ(decode_generation(g), (std::pair<int, int>{count, gen}));
    }
  }
  EXPECT_TRUE(
      contains(usage_error([] { (void)encode_generation(0, 1000); }), "SINEW_RESTART_GENERATION 1000"));
  EXPECT_TRUE(contains(usage_error([] { (void)encode_generation(0, -1); }), "SINEW_RESTART_GENERATION"));
  EXPECT_TRUE(
      contains(usage_error([] { (void)encode_generation(kMaxRestartCount + 1, 0); }), "SLURM_RESTART_COUNT"));
  EXPECT_TRUE(contains(usage_error([] { (void)encode_generation(-1, 0); }), "SLURM_RESTART_COUNT"));
}

TEST(Launch, RestartGenerationFromTheEnvironment) {
  EXPECT_EQ(parse_vars({{"SINEW_RESTART_GENERATION", "2"}}).restart_generation(), 2);
  // A requeued Slurm job is a relaunch like sinew-supervise's, also without sinew-supervise.
  const Launch requeued = parse_vars({{"SLURM_JOB_ID", "5"}, {"SLURM_RESTART_COUNT", "1"}});
  EXPECT_EQ(requeued.restart_count, 1);
  EXPECT_EQ(requeued.restart_generation(), 1000);
  EXPECT_EQ(requeued.describe(), "none, Slurm job 5, restart 1");
  // sinew-supervise relaunching inside the requeued job.
  const Launch both =
      parse_vars({{"SLURM_JOB_ID", "5"}, {"SLURM_RESTART_COUNT", "2"}, {"SINEW_RESTART_GENERATION", "3"}});
  EXPECT_EQ(both.restart_generation(), 2003);
  EXPECT_EQ(both.describe(), "none, Slurm job 5, restart 2, relaunch 3");
}

TEST(Launch, MalformedGenerationsAreReportedWhenUsed) {
  const Launch a = parse_vars({{"SINEW_RESTART_GENERATION", "1000"}});
  EXPECT_EQ(a.sinew_generation, 0);
  EXPECT_FALSE(a.problem.empty());
  const std::string m = usage_error([&] { (void)a.restart_generation(); });
  EXPECT_TRUE(contains(m, "SINEW_RESTART_GENERATION='1000'")) << m;
  EXPECT_TRUE(contains(m, "[0, 999]")) << m;
  EXPECT_TRUE(contains(m, "sinew-supervise")) << m;
  const Launch b = parse_vars({{"SLURM_RESTART_COUNT", "two"}});
  const std::string n = usage_error([&] { (void)b.restart_generation(); });
  EXPECT_TRUE(contains(n, "SLURM_RESTART_COUNT='two'")) << n;
  EXPECT_TRUE(contains(n, "requeues")) << n;
  // Nothing else throws: the rank is still there, and paths without %r expand.
  const Launch c = parse_vars({{"OMPI_COMM_WORLD_RANK", "1"}, {"SLURM_RESTART_COUNT", "-3"}});
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(expand_path("run/ckpt", "--checkpoint-dir", c), "run/ckpt");
  EXPECT_TRUE(contains(usage_error([&] { (void)expand_path("c-%r", "--checkpoint-dir", c); }),
                       "SLURM_RESTART_COUNT='-3'"));
}

TEST(Launch, ExpandPath) {
  const Launch slurm = parse_vars({{"SLURM_JOB_ID", "4242"}, {"SLURM_RESTART_COUNT", "2"}});
  EXPECT_EQ(expand_path("", "--metrics", slurm), "");
  EXPECT_EQ(expand_path("plain/path.jsonl", "--metrics", slurm), "plain/path.jsonl");
  EXPECT_EQ(expand_path("ckpt-%j", "--checkpoint-dir", slurm), "ckpt-4242");
  EXPECT_EQ(expand_path("m-%j-%r.jsonl", "--metrics", slurm), "m-4242-2.jsonl");
  EXPECT_EQ(expand_path("%j%j/%r", "--audit-dir", slurm), "42424242/2");
  EXPECT_EQ(expand_path("100%%/%%j", "--metrics", slurm), "100%/%j");
  // %r is 0 outside a requeued job, and outside Slurm.
  EXPECT_EQ(expand_path("r%r", "--metrics", parse_vars({{"SLURM_JOB_ID", "1"}})), "r0");
  EXPECT_EQ(expand_path("r%r", "--metrics", parse_vars({})), "r0");
  EXPECT_EQ(expand_path("100%%", "--metrics", parse_vars({})), "100%");
}

TEST(Launch, ExpandPathErrorsNameTheOption) {
  const Launch none = parse_vars({});
  const std::string j = usage_error([&] { (void)expand_path("ckpt-%j", "--checkpoint-dir", none); });
  EXPECT_TRUE(contains(j, "--checkpoint-dir 'ckpt-%j'")) << j;
  EXPECT_TRUE(contains(j, "SLURM_JOB_ID is not set")) << j;
  const Launch slurm = parse_vars({{"SLURM_JOB_ID", "1"}});
  const std::string x = usage_error([&] { (void)expand_path("m-%x", "--metrics", slurm); });
  EXPECT_TRUE(contains(x, "--metrics 'm-%x'")) << x;
  EXPECT_TRUE(contains(x, "unknown pattern '%x'")) << x;
  EXPECT_TRUE(contains(x, "%%")) << x;
  const std::string end = usage_error([&] { (void)expand_path("m-%", "--audit-dir", slurm); });
  EXPECT_TRUE(contains(end, "--audit-dir 'm-%'")) << end;
  EXPECT_TRUE(contains(end, "lone '%'")) << end;
  for (const char* bad : {"%A", "%a", "%J", "%R", "%n", "a%/b", "%"}) {
    EXPECT_THROW((void)expand_path(bad, "--metrics", slurm), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace sinew::launch
