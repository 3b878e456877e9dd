// Memory that keeps its addresses while it gives pages back (core/pages.hpp): what sharded parameters rely
// on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstddef>
#include <span>

#include "sinew/core/pages.hpp"

using namespace sinew;

namespace {
const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) / sizeof(float);
}  // namespace

TEST(Pages, MappedMemoryIsZeroAndTakesNothingUntilWritten) {
  const std::size_t before = resident_bytes();
  const MappedFloats m(64u << 20);  // 256 MiB of address space
  const auto p = m.span();
  for (std::size_t i = 0; i < p.size(); i += kPage * 1024) ASSERT_EQ(p[i], 0.f);  // reads: the zero page
  EXPECT_LT(resident_bytes(), before + (32u << 20));
}

TEST(Pages, ReleaseGivesWholePagesBackAndKeepsTheEdges) {
  const MappedFloats m(64 * kPage);
  const auto p = m.span();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = 1.f + static_cast<float>(i);
  const std::size_t resident = resident_bytes();
  // From the middle of page 3 to the middle of page 60: pages 4..59 go, the halves of 3 and 60 stay.
  const std::size_t from = 3 * kPage + kPage / 2, to = 60 * kPage + kPage / 2;
  release_pages(p.subspan(from, to - from));
  EXPECT_LT(resident_bytes(), resident);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const bool gone = i >= 4 * kPage && i < 60 * kPage;
    ASSERT_EQ(p[i], gone ? 0.f : 1.f + static_cast<float>(i)) << i;
  }
  // The released pages take writes again, at the same addresses.
  p[10 * kPage] = 5.f;
  EXPECT_EQ(p[10 * kPage], 5.f);
}

TEST(Pages, ZeroPagesZeroesTheEdgesToo) {
  const MappedFloats m(16 * kPage);
  const auto p = m.span();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = 2.f;
  const std::size_t from = kPage / 3, to = 15 * kPage + 7;
  zero_pages(p.subspan(from, to - from));
  for (std::size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], i >= from && i < to ? 0.f : 2.f) << i;
  zero_pages(p.subspan(5, 3));  // smaller than a page: written
  for (std::size_t i = 5; i < 8; ++i) EXPECT_EQ(p[i], 0.f);
}
