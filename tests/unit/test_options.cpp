// The elasticity options: fault specs and job-server schedules parse exactly, and bad ones are refused
// with a message naming the option (bad_input.sh checks the exit code of sinew-train). The path options
// expand %j and %r from a given launch environment (test_launch.cpp: the expansion itself).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/launch.hpp"
#include "sinew/train/config.hpp"

namespace sinew::train {
namespace {

TEST(Options, ParseFault) {
  const auto f = fault::parse_fault("2:allreduce:30");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.point, fault::Point::kAllreduce);
  EXPECT_EQ(f.step, 30);
  EXPECT_EQ(fault::parse_fault("0:checkpoint-write:1").point, fault::Point::kCheckpointWrite);
  EXPECT_EQ(fault::parse_fault("1:before-commit:10").point, fault::Point::kBeforeCommit);
  for (const char* bad : {"", "2", "2:allreduce", "x:forward:3", "1:fly:3", "1:forward:0", "-1:forward:3",
                          "1:forward:3x", "1 :forward:3", "1:before-commit:"}) {
    EXPECT_THROW((void)fault::parse_fault(bad), InvalidArgument) << bad;
  }
  try {
    (void)fault::parse_fault("1:fly:3");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--inject-fault"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("before-manifest"), std::string::npos) << e.what();
  }
}

TEST(Options, FaultsParsedOnceWithTheOptions) {
  const char* argv[] = {"sinew-train", "--inject-fault", "2:forward:5", "--inject-fault",
                        "0:before-fsync:10"};
  const auto r = parse_command_line(5, argv);
  ASSERT_TRUE(r.config);
  ASSERT_EQ(r.config->inject_fault.size(), 2u);
  EXPECT_EQ(r.config->inject_fault[1].point, fault::Point::kBeforeFsync);
  const char* bad[] = {"sinew-train", "--inject-fault", "2:fly:5"};
  EXPECT_THROW((void)parse_command_line(3, bad), InvalidArgument);
}

TEST(Options, PlanKeepsThisProcessFaultsOnly) {
  // A plan holds only its launch rank's faults, and none at all in a relaunch: at() must not kill here.
  const std::vector<fault::Fault> faults = {{1, fault::Point::kForward, 3}};
  EXPECT_TRUE(fault::Plan(faults, 0, 0).empty());
  EXPECT_TRUE(fault::Plan(faults, 1, 1).empty());
  EXPECT_TRUE(fault::Plan(faults, -1, 0).empty());
  EXPECT_FALSE(fault::Plan(faults, 1, 0).empty());
  fault::Plan(faults, 1, 0).at(fault::Point::kBackward, 3);  // another point: survives
  fault::Plan(faults, 1, 0).at(fault::Point::kForward, 4);   // another step: survives
}

TEST(Options, ParseResizeSchedule) {
  const auto s = parse_resize_schedule("10:2,20:4,35:3");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1], (std::pair<std::int64_t, int>{20, 4}));
  EXPECT_TRUE(parse_resize_schedule("").empty());
  for (const char* bad : {"10", "10:0", "0:2", "10:2,5:3", "10:2,10:3", "a:b", "10:2x"}) {
    EXPECT_THROW((void)parse_resize_schedule(bad), InvalidArgument) << bad;
  }
}

TEST(Options, ElasticDefaultsValidate) {
  Config c;
  EXPECT_EQ(c.elastic, ElasticMode::kInplace);
  EXPECT_NO_THROW(validate(c));
  c.min_ranks = 0;
  EXPECT_THROW(validate(c), InvalidArgument);
  c.min_ranks = 3;
  c.max_ranks = 2;
  EXPECT_THROW(validate(c), InvalidArgument);
}

TEST(Options, ShardPrefetchIsBoundedInUnits) {
  Config c;
  EXPECT_EQ(c.shard_prefetch, 1);
  for (const int units : {0, 8}) {
    c.shard_prefetch = units;
    EXPECT_NO_THROW(validate(c)) << units;
  }
  for (const int units : {-1, 9}) {
    c.shard_prefetch = units;
    EXPECT_THROW(validate(c), InvalidArgument) << units;
  }
  // Named where it does nothing: refused, naming the stage it is for.
  const char* other[] = {"sinew-train", "--shard", "optimizer", "--shard-prefetch", "2"};
  try {
    (void)parse_command_line(5, other);
    ADD_FAILURE() << "--shard-prefetch with --shard optimizer was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("is for --shard parameters"), std::string::npos) << e.message();
  }
  const char* zero3[] = {"sinew-train", "--shard", "parameters", "--shard-prefetch", "2"};
  EXPECT_EQ(parse_command_line(5, zero3).config->shard_prefetch, 2);
}

TEST(Options, ChoicesAreTyped) {
  const char* argv[] = {"sinew-train", "--elastic", "restart", "--lr-scaling", "sqrt"};
  const auto r = parse_command_line(5, argv);
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->elastic, ElasticMode::kRestart);
  EXPECT_EQ(r.config->lr_scaling, LrScaling::kSqrt);
  const char* bad[] = {"sinew-train", "--lr-scaling", "cubic"};
  try {
    (void)parse_command_line(3, bad);
    ADD_FAILURE() << "--lr-scaling cubic was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("--lr-scaling: unknown value 'cubic'; use one of none, linear, sqrt"),
        std::string::npos)
        << e.what();
  }
}

/// The distillation options: one teacher source, values in range, and a wait that stays inside the
/// collectives' deadline; each refusal names its option.
TEST(Options, DistillationChecks) {
  auto refused = [](const Config& c, const std::string& option) {
    try {
      validate(c);
      ADD_FAILURE() << "accepted; expected a message about " << option;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  };
  Config c;
  EXPECT_FALSE(distilling(c));
  c.distill_table = "t.h5";
  EXPECT_TRUE(distilling(c));
  EXPECT_NO_THROW(validate(c));
  c.distill_registry = "http://127.0.0.1:2379";
  refused(c, "one teacher source");
  c.distill_table.clear();
  c.distill_alpha = 1.5f;
  refused(c, "--distill-alpha");
  c.distill_alpha = 0.5f;
  c.distill_temperature = 0;
  refused(c, "--distill-temperature");
  c.distill_temperature = 2;
  c.distill_on_missing = "skip";
  refused(c, "--distill-on-missing");
  c.distill_on_missing = "wait";
  c.distill_max_wait_ms = 500;  // below the request timeout
  refused(c, "--distill-max-wait-ms");
  c.distill_max_wait_ms = 60000;
  c.distill_job = "a/b";
  refused(c, "--distill-job");
  c.distill_job = "j";
  EXPECT_NO_THROW(validate(c));
  c.device = "cuda";
  if (SINEW_HAVE_CUDA != 0) refused(c, "CPU only");
}

/// --device cuda refuses what would silently run on the host, naming the option and what to use.
TEST(Options, DeviceCudaRefusesCpuOnlyChoices) {
  struct Case {
    std::vector<const char*> args;
    const char* needle;
  };
  const std::vector<Case> cases{
      {{"--algorithm", "decentralized"}, "--algorithm decentralized runs on the CPU only"},
      {{"--model", "cnn"}, "supports the models logreg and mlp"},
      {{"--allreduce", "ring"}, "--allreduce ring runs on the CPU only"},
      {{"--algorithm", "bytegrad", "--error-feedback", "true"}, "--error-feedback runs on the CPU only"},
      {{"--shard", "parameters"}, "--shard parameters: not on a GPU"},
      {{"--shard", "gradients", "--algorithm", "bytegrad"}, "not on a GPU (its quantised reduce-scatter"},
      {{}, nullptr},  // the plain run: accepted with CUDA support
      {{"--shard", "optimizer", "--algorithm", "bytegrad"}, nullptr},  // sharded state on the GPU
      {{"--shard", "gradients", "--shard-replicas", "2"}, nullptr},
  };
  for (const auto& c : cases) {
    std::vector<const char*> argv{"sinew-train", "--device", "cuda"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string refused;  // parse_command_line validates
    try {
      (void)parse_command_line(static_cast<int>(argv.size()), argv.data());
    } catch (const InvalidArgument& e) {
      refused = e.message();
    }
    if (SINEW_HAVE_CUDA == 0) {  // a CPU-only build refuses --device cuda itself (or the choice, first)
      const bool named = c.needle != nullptr && refused.find(c.needle) != std::string::npos;
      EXPECT_TRUE(named || refused.find("no GPU support") != std::string::npos) << refused;
    } else if (c.needle == nullptr) {
      EXPECT_EQ(refused, "");
    } else {
      EXPECT_NE(refused.find(c.needle), std::string::npos) << "for " << c.needle << ": " << refused;
    }
  }
}

/// A launch environment from the given variables (launch::parse), never this process's.
launch::Launch launch_with(const std::map<std::string, std::string>& vars) {
  return launch::parse([&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

/// The message of the InvalidArgument that parse_command_line throws for argv ("" if none).
std::string refusal(std::vector<const char*> argv, const launch::Launch& env) {
  argv.insert(argv.begin(), "sinew-train");
  try {
    (void)parse_command_line(static_cast<int>(argv.size()), argv.data(), env);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(Options, PathOptionsExpandTheLaunchPatterns) {
  const auto slurm = launch_with({{"SLURM_JOB_ID", "31"}, {"SLURM_RESTART_COUNT", "1"}});
  const char* argv[] = {"sinew-train", "--checkpoint-dir", "/scratch/%j/ckpt",
                        "--metrics",   "m-%j-%r.jsonl",    "--audit-dir",
                        "audit-%j",    "--resume",         "/old/%j/ckpt-0000000010"};
  const auto r = parse_command_line(9, argv, slurm);
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->checkpoint_dir, "/scratch/31/ckpt");
  EXPECT_EQ(r.config->metrics, "m-31-1.jsonl");
  EXPECT_EQ(r.config->audit_dir, "audit-31");
  EXPECT_EQ(r.config->resume, "/old/31/ckpt-0000000010");
  // Defaults and paths without patterns are left alone, outside Slurm too.
  const char* plain[] = {"sinew-train", "--metrics", "run.jsonl", "--checkpoint-dir", "100%%"};
  const auto p = parse_command_line(5, plain, launch_with({}));
  ASSERT_TRUE(p.config);
  EXPECT_EQ(p.config->metrics, "run.jsonl");
  EXPECT_EQ(p.config->checkpoint_dir, "100%");
  EXPECT_EQ(p.config->resume, "auto");
  EXPECT_EQ(p.config->audit_dir, "");
  // Refused with the option named: %j outside a Slurm job, unknown patterns.
  const std::string j = refusal({"--metrics", "run-%j.jsonl"}, launch_with({}));
  EXPECT_NE(j.find("--metrics 'run-%j.jsonl': %j is the Slurm job id, but SLURM_JOB_ID is not set"),
            std::string::npos)
      << j;
  const std::string q = refusal({"--checkpoint-dir", "c-%q"}, slurm);
  EXPECT_NE(q.find("--checkpoint-dir 'c-%q': unknown pattern '%q'"), std::string::npos) << q;
  EXPECT_NE(refusal({"--audit-dir", "a-%"}, slurm).find("--audit-dir 'a-%': ends in a lone '%'"),
            std::string::npos);
  EXPECT_NE(refusal({"--resume", "x/%J"}, slurm).find("--resume 'x/%J'"), std::string::npos);
  // --help needs no Slurm job, and documents the patterns.
  const char* help[] = {"sinew-train", "--help"};
  const auto h = parse_command_line(2, help, launch_with({}));
  EXPECT_FALSE(h.config);
  EXPECT_NE(h.text.find("%j: Slurm job id"), std::string::npos);
}

TEST(Options, BooleanOptionsWorkBare) {
  // A bare flag is true and never takes the next option for its value; a value still works.
  const char* bare[] = {"sinew-train", "--find-unused-parameters", "--epochs", "2", "--shuffle", "false",
                        "--overlap"};
  const auto r = parse_command_line(7, bare, launch_with({}));
  ASSERT_TRUE(r.config);
  EXPECT_TRUE(r.config->find_unused_parameters);
  EXPECT_EQ(r.config->epochs, 2);
  EXPECT_FALSE(r.config->shuffle);
  EXPECT_TRUE(r.config->overlap);
  const char* valued[] = {"sinew-train", "--find-unused-parameters", "false", "--progress=false"};
  const auto v = parse_command_line(4, valued, launch_with({}));
  ASSERT_TRUE(v.config);
  EXPECT_FALSE(v.config->find_unused_parameters);
  EXPECT_FALSE(v.config->progress);
  // A non-boolean option without its value is still refused, naming it.
  EXPECT_NE(refusal({"--epochs", "--lr", "0.1"}, launch_with({})).find("epochs"), std::string::npos);
}

}  // namespace
}  // namespace sinew::train
