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

TEST(Pages, MoveFloatsMovesTheWholePagesAtTheSameOffsetWithinAPage) {
  const std::size_t n = 4096 * kPage;  // 16 MiB with 4 KiB pages
  const MappedFloats a(n + 8 * kPage), b(n + 8 * kPage);
  const auto src = a.span(), dst = b.span();
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = 1.f + static_cast<float>(i % 100003);
  dst[0] = -1.f;
  // Source and destination 100 elements into a page, at different pages.
  const auto from = src.subspan(3 * kPage + 100, n), to = dst.subspan(5 * kPage + 100, n);
  const std::size_t resident = resident_bytes();
  const std::size_t moved = move_floats(from, to);
  EXPECT_EQ(moved, (n / kPage - 1) * kPage * sizeof(float));  // all but the two partial pages
  EXPECT_LT(resident_bytes(), resident + (1u << 20));         // nothing taken fresh for them
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(to[i], 1.f + static_cast<float>((3 * kPage + 100 + i) % 100003)) << i;
  EXPECT_EQ(dst[0], -1.f);
  EXPECT_EQ(dst[5 * kPage + 99], 0.f);  // before `to`, in its first (copied) page: untouched
  // The source's moved pages read as zero; its partial pages and what lies outside keep their values.
  EXPECT_EQ(src[4 * kPage], 0.f);
  EXPECT_EQ(src[3 * kPage + n - 1], 0.f);
  EXPECT_EQ(src[3 * kPage + n], 1.f + static_cast<float>((3 * kPage + n) % 100003));
  EXPECT_EQ(src[3 * kPage + 100], 1.f + static_cast<float>((3 * kPage + 100) % 100003));
  EXPECT_EQ(src[3 * kPage + 99], 1.f + static_cast<float>((3 * kPage + 99) % 100003));
  src[4 * kPage] = 7.f;  // and take writes again
  EXPECT_EQ(src[4 * kPage], 7.f);
}

TEST(Pages, MoveFloatsCopiesAtAnotherOffsetAndAcrossMappings) {
  const std::size_t n = 2048 * kPage;
  const MappedFloats a(n + 4 * kPage), b(n + 4 * kPage), c(2 * n + 8 * kPage);
  const auto src = a.span(), dst = b.span(), two = c.span();
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  // Different offsets within a page: copied.
  EXPECT_EQ(move_floats(src.subspan(10, n), dst.subspan(11, n)), 0u);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(dst[11 + i], static_cast<float>(10 + i)) << i;
  // Part of `two` takes pages moved in from `a`: a range of it across the seam then spans two mappings, which
  // a move in one piece may refuse (then it moves 2 MiB at a time, and copies the piece across the seam).
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < two.size(); ++i) two[i] = -static_cast<float>(i);
  const std::size_t part = 1000 * kPage;  // (the seam inside a 2 MiB piece)
  EXPECT_EQ(move_floats(src.subspan(kPage, part), two.subspan(kPage, part)), part * sizeof(float));
  const MappedFloats d(2 * n + 8 * kPage);
  const auto out = d.span();
  const auto whole = two.subspan(kPage / 2, 2 * n);
  EXPECT_GT(move_floats(whole, out.subspan(kPage / 2, 2 * n)), 0u);
  for (std::size_t i = 0; i < 2 * n; ++i) {
    const std::size_t e = kPage / 2 + i;  // the element of `two` it came from
    const float want = e >= kPage && e < kPage + part ? static_cast<float>(e) : -static_cast<float>(e);
    ASSERT_EQ(out[kPage / 2 + i], want) << i;
  }
}
