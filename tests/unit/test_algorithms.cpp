// Algorithm pieces that need no group: shift_one's pairing, and the option checks of --algorithm.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include <set>
#include <utility>

#include "sinew/algo/algorithm.hpp"
#include "sinew/core/error.hpp"
#include "sinew/train/config.hpp"

using namespace sinew;

TEST(ShiftOne, EachRoundIsAMatchingAndEveryPairMeetsOnce) {
  for (int n : {2, 4, 6, 8, 16}) {
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < n - 1; ++round) {
      for (int r = 0; r < n; ++r) {
        const int p = algo::shift_one_peer(r, n, round);
        ASSERT_GE(p, 0) << "n " << n << " round " << round << " rank " << r;
        ASSERT_NE(p, r);
        ASSERT_EQ(algo::shift_one_peer(p, n, round), r) << "not symmetric: n " << n << " round " << round;
        if (r < p) {
          EXPECT_TRUE(met.insert({r, p}).second) << "pair met twice: " << r << "," << p;
        }
      }
    }
    EXPECT_EQ(met.size(), static_cast<std::size_t>(n * (n - 1) / 2)) << n;
    // The pairing changes every round and repeats after n - 1 rounds.
    for (int r = 0; r < n; ++r) EXPECT_EQ(algo::shift_one_peer(r, n, 0), algo::shift_one_peer(r, n, n - 1));
    if (n > 2) {
      EXPECT_NE(algo::shift_one_peer(0, n, 0), algo::shift_one_peer(0, n, 1));
    }
  }
}

TEST(ShiftOne, OddSizesLeaveOneRankOutPerRound) {
  for (int n : {1, 3, 5, 7}) {
    for (int round = 0; round < 2 * n; ++round) {
      int out = 0;
      for (int r = 0; r < n; ++r) {
        const int p = algo::shift_one_peer(r, n, round);
        if (p < 0) {
          ++out;
          continue;
        }
        ASSERT_LT(p, n);
        ASSERT_EQ(algo::shift_one_peer(p, n, round), r);
      }
      EXPECT_EQ(out, 1) << "n " << n << " round " << round;
    }
  }
  EXPECT_THROW(algo::shift_one_peer(4, 4, 0), InternalError);
}

TEST(AlgorithmNames, MatchTheOptionsChoices) {
  for (const auto& [kind, name] : algo::kAlgorithmNames) {
    train::Config c;
    c.algorithm = kind;
    if (kind == algo::Kind::kQAdam) c.optimizer = "adam";
    EXPECT_NO_THROW(train::validate(c)) << name;
    // The command line takes every name of the one list, and its help lists each with its summary.
    const std::string arg = "--algorithm=" + std::string(name);
    const char* argv[] = {"sinew-train", arg.c_str(), "--optimizer",
                          kind == algo::Kind::kQAdam ? "adam" : "sgd"};
    const auto parsed = train::parse_command_line(4, argv);
    ASSERT_TRUE(parsed.config.has_value()) << name;
    EXPECT_EQ(parsed.config->algorithm, kind) << name;
  }
  const char* help[] = {"sinew-train", "--help"};
  const std::string text = train::parse_command_line(2, help).text;
  for (const auto& [kind, name] : algo::kAlgorithmNames)
    EXPECT_NE(text.find(std::string(name) + ": "), std::string::npos) << name;
}

TEST(AlgorithmNames, EveryAlgorithmHasItsRowInTheDocs) {
  std::ifstream in(std::string(SINEW_SOURCE_DIR) + "/docs/algorithms.md");
  ASSERT_TRUE(in) << "docs/algorithms.md";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [kind, name] : algo::kAlgorithmNames)
    EXPECT_NE(doc.find("| `" + std::string(name) + "` |"), std::string::npos)
        << name << " has no row in the table";
}

TEST(AlgorithmNames, AnUnknownNameIsRefusedWithTheList) {
  const char* argv[] = {"sinew-train", "--algorithm", "gossip"};
  try {
    (void)train::parse_command_line(3, argv);
    ADD_FAILURE() << "accepted --algorithm gossip";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--algorithm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("low_precision_decentralized"), std::string::npos) << e.what();
  }
}

TEST(AlgorithmOptions, BadValuesAreNamed) {
  auto bad = [](auto&& edit, const char* needle) {
    train::Config c;
    edit(c);
    try {
      train::validate(c);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  };
  bad([](train::Config& c) { c.algorithm = algo::Kind::kQAdam; }, "--optimizer adam");
  bad([](train::Config& c) { c.peer_selection = "two"; }, "--peer-selection");
  bad([](train::Config& c) { c.compress_chunk = 0; }, "--compress-chunk");
  bad([](train::Config& c) { c.comm_interval = 0; }, "--comm-interval");
  bad([](train::Config& c) { c.sync_interval_ms = 0; }, "--sync-interval-ms");
  bad([](train::Config& c) { c.qadam_warmup_steps = 0; }, "--qadam-warmup-steps");
  bad([](train::Config& c) { c.bytegrad_bits = 3; }, "--bytegrad-bits");
  bad(
      [](train::Config& c) {
        c.bytegrad_bits = 2;
        c.compress_chunk = 2046;  // not a multiple of 4 elements per byte
      },
      "--compress-chunk");
  bad([](train::Config& c) { c.powersgd_rank = 0; }, "--powersgd-rank");
  bad([](train::Config& c) { c.powersgd_warmup_steps = -1; }, "--powersgd-warmup-steps");
  // --allreduce is typed: a bad name is refused while parsing, naming the option.
  const char* argv[] = {"sinew-train", "--allreduce", "tree"};
  try {
    (void)train::parse_command_line(3, argv);
    ADD_FAILURE() << "accepted: --allreduce tree";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("--allreduce"), std::string::npos) << e.message();
  }
}
