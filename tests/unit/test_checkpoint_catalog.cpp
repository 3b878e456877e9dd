// The checkpoint catalog: the naming scheme (one place) and what scan(), scan_uncommitted() and find_latest()
// make of a directory. Valid checkpoints themselves are written by tests/mpi/checkpoint_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "sinew/checkpoint/catalog.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {
namespace {

TEST(CheckpointCatalog, NamesFollowTheDocumentedScheme) {
  EXPECT_EQ(checkpoint_name(120), "ckpt-0000000120");
  EXPECT_EQ(partial_name(120), "ckpt-0000000120.partial");
  EXPECT_EQ(shard_name(1, 4), "shard-00001-of-00004.h5");
  EXPECT_EQ(kManifestFile, "manifest.h5");
  EXPECT_EQ(kManifestChecksumFile, "manifest.h5.crc32");
  EXPECT_EQ(kCommitFile, "COMMITTED");
  EXPECT_EQ(checkpoint_path("/d", 7), "/d/ckpt-0000000007");
  EXPECT_EQ(checkpoint_name(120, 1), "ckpt-0000000120");
  EXPECT_EQ(checkpoint_path("/d", 7, 3), "/d/ckpt-0000000007.3");
  EXPECT_EQ(partial_path("/d", 7), "/d/ckpt-0000000007.partial");
}

TEST(CheckpointCatalog, StepOfAcceptsExactlyTheSchemesNames) {
  EXPECT_EQ(step_of("ckpt-0000000120"), 120);
  EXPECT_EQ(step_of(checkpoint_name(9999999999)), 9999999999);
  EXPECT_EQ(step_of("ckpt-0000000120.partial", /*partial=*/true), 120);
  for (const char* bad :
       {"", "ckpt-", "ckpt-120", "ckpt-00000001200", "ckpt-000000012x", "ckpt-0000000120.partial",
        "xckpt-0000000120", "CKPT-0000000120", "ckpt-0000000120/"}) {
    EXPECT_FALSE(step_of(bad)) << bad;
  }
  EXPECT_FALSE(step_of("ckpt-0000000120", /*partial=*/true));
  EXPECT_FALSE(step_of("ckpt-0000000120.partia", /*partial=*/true));
}

TEST(CheckpointCatalog, LaterAttemptsHaveOneNameEach) {
  EXPECT_EQ(step_of("ckpt-0000000120.2"), 120);
  const auto n = parse_name(checkpoint_name(120, 17));
  ASSERT_TRUE(n);
  EXPECT_EQ(n->step, 120);
  EXPECT_EQ(n->attempt, 17);
  EXPECT_FALSE(n->partial);
  EXPECT_EQ(parse_name("ckpt-0000000120")->attempt, 1);
  EXPECT_TRUE(parse_name("ckpt-0000000120.partial")->partial);
  // ".1" is the plain name; leading zeros would give one attempt two names.
  for (const char* bad : {"ckpt-0000000120.1", "ckpt-0000000120.02", "ckpt-0000000120.", "ckpt-0000000120.x",
                          "ckpt-0000000120.2.3", "ckpt-0000000120.9999999"}) {
    EXPECT_FALSE(parse_name(bad)) << bad;
  }
}

class CatalogDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sinew-catalog-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

/// A directory with a commit record (its contents are not checked by scan() without `check`).
void committed(const std::string& path) {
  fs::create_directories(path);
  std::ofstream(fs::path(path) / kCommitFile) << "manifest.h5 00000000 0\n";
}

TEST_F(CatalogDir, ScanListsCommittedCheckpointsNewestFirstAndIgnoresTheRest) {
  for (const std::int64_t s : {10, 30, 20}) committed(checkpoint_path(dir_.string(), s));
  fs::create_directories(partial_path(dir_.string(), 40));
  fs::create_directories(checkpoint_path(dir_.string(), 35));  // no commit record
  fs::create_directories(dir_ / "ckpt-12");                    // not the scheme's name
  std::ofstream(dir_ / checkpoint_name(50)) << "x";            // a file, not a directory
  const auto all = scan(dir_.string(), /*check=*/false);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 30);
  EXPECT_EQ(all[1].step, 20);
  EXPECT_EQ(all[2].step, 10);
  EXPECT_TRUE(all[0].valid);
  EXPECT_EQ(all[0].path, checkpoint_path(dir_.string(), 30));
  const auto partial = scan_uncommitted(dir_.string());
  ASSERT_EQ(partial.size(), 2u);
  EXPECT_EQ(partial[0].step, 40);
  EXPECT_EQ(partial[1].step, 35);
  EXPECT_FALSE(partial[0].valid);
  EXPECT_FALSE(partial[0].reason.empty());
}

TEST_F(CatalogDir, ACheckpointIsCommittedByItsRecordOrAnEarlierVersionsChecksumFile) {
  const std::string a = checkpoint_path(dir_.string(), 1), b = checkpoint_path(dir_.string(), 2),
                    c = checkpoint_path(dir_.string(), 3);
  fs::create_directories(a);
  committed(b);
  fs::create_directories(c);
  std::ofstream(fs::path(c) / kManifestChecksumFile) << "00000000 0\n";
  EXPECT_FALSE(is_committed(a));
  EXPECT_TRUE(is_committed(b));
  EXPECT_TRUE(is_committed(c));
  EXPECT_FALSE(is_committed(partial_path(dir_.string(), 4)));
}

TEST_F(CatalogDir, TheNewestAttemptOfAStepComesFirst) {
  committed(checkpoint_path(dir_.string(), 5));
  committed(checkpoint_path(dir_.string(), 5, 2));
  committed(checkpoint_path(dir_.string(), 4, 3));
  const auto all = scan(dir_.string(), /*check=*/false);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].path, checkpoint_path(dir_.string(), 5, 2));
  EXPECT_EQ(all[1].path, checkpoint_path(dir_.string(), 5));
  EXPECT_EQ(all[2].attempt, 3);
}

TEST_F(CatalogDir, FindLatestSkipsCheckpointsThatDoNotVerify) {
  // A committed directory without its manifest, and one without a commit record: each is skipped with its
  // reason; the missing manifest is waited for as long as allowed, and named.
  committed(checkpoint_path(dir_.string(), 10));
  fs::create_directories(checkpoint_path(dir_.string(), 20));
  int waits = 0;
  FindOptions fo;
  fo.wait_s = 0.2;
  fo.on_wait = [&](const Entry& e) {
    ++waits;
    EXPECT_EQ(e.step, 10);
    ASSERT_EQ(e.missing.size(), 1u);
    EXPECT_NE(e.missing[0].find("manifest.h5"), std::string::npos);
  };
  const Latest l = find_latest(dir_.string(), fo);
  EXPECT_FALSE(l.found);
  EXPECT_EQ(waits, 1);
  ASSERT_EQ(l.skipped.size(), 2u);
  EXPECT_EQ(l.skipped[0].step, 20);
  EXPECT_NE(l.skipped[0].reason.find("not committed"), std::string::npos) << l.skipped[0].reason;
  EXPECT_NE(l.skipped[1].reason.find("manifest"), std::string::npos) << l.skipped[1].reason;
  EXPECT_EQ(l.skipped[1].missing.size(), 1u);
}

TEST(CheckpointCatalog, AMissingDirectoryHoldsNoCheckpoints) {
  EXPECT_TRUE(scan("/nonexistent/sinew-catalog", true).empty());
  EXPECT_TRUE(scan_uncommitted("/nonexistent/sinew-catalog").empty());
  EXPECT_FALSE(find_latest("/nonexistent/sinew-catalog").found);
}

}  // namespace
}  // namespace sinew::checkpoint
