// Which teachers a student sends its requests to, and in what proportion.
//
// Paddle EDL gives each teacher at most ceil(students / teachers) students, whatever its speed: a slow
// teacher gets as many students as a fast one and becomes the bottleneck. Here each teacher's share of the
// work follows its measured throughput. Lay the teachers' capacities end to end on [0, C) and give student s
// of S the interval [s C / S, (s + 1) C / S): the student sends each teacher the fraction of its requests
// that the teacher covers of its interval. Then
//   - every teacher's load is proportional to its capacity (all students ask equally often), so all
//     teachers finish together and the slowest does not set the pace;
//   - each boundary between two students cuts at most one teacher, so there are at most T + S - 1
//     student-teacher pairs in all: with equal teachers a student talks to at most ceil(T / S) + 1 of
//     them and a teacher serves at most ceil(S / T) + 1 students;
//   - every student computes the same layout from the same registry listing, without talking to the others.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace sinew::distill {

/// One teacher's part of a student's requests.
struct Share {
  std::size_t teacher = 0;  ///< index into the capacities given to assign()
  double fraction = 0;      ///< of this student's requests, > 0; a student's fractions sum to 1
};

/// The shares of student `student` of `students` (0 <= student < students) over teachers of the given
/// capacities (samples/s, in one agreed order). A capacity that is not known yet (<= 0: a teacher that has
/// not served) counts as the mean of the known ones (1 if none is known). Empty when there is no teacher.
/// Throws InvalidArgument when student >= students.
std::vector<Share> assign(std::span<const double> capacities, std::size_t students, std::size_t student);

/// Picks teachers for successive requests so that each gets its share (smooth weighted round-robin:
/// deterministic, and any window of requests is within one request of the exact proportions).
class RoundRobin {
 public:
  RoundRobin() = default;
  explicit RoundRobin(std::vector<Share> shares);
  /// The next request's teacher (Share::teacher); throws InternalError when there are no shares.
  std::size_t next();
  [[nodiscard]] const std::vector<Share>& shares() const noexcept { return shares_; }

 private:
  std::vector<Share> shares_;
  std::vector<double> credit_;
};

}  // namespace sinew::distill
