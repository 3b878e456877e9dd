#include "sinew/distill/balancer.hpp"

#include <algorithm>

#include "sinew/core/error.hpp"

namespace sinew::distill {

std::vector<Share> assign(std::span<const double> capacities, std::size_t students, std::size_t student) {
  if (student >= students) {
    SINEW_THROW(InvalidArgument, "balancer: student {} of {} does not exist", student, students);
  }
  if (capacities.empty()) return {};
  double known = 0;
  std::size_t n_known = 0;
  for (const double c : capacities) {
    if (c > 0) {
      known += c;
      ++n_known;
    }
  }
  const double fill = n_known > 0 ? known / static_cast<double>(n_known) : 1.0;
  std::vector<double> cap(capacities.begin(), capacities.end());
  for (double& c : cap) c = c > 0 ? c : fill;
  double total = 0;
  for (const double c : cap) total += c;

  // This student's interval of the teachers' line, and the teachers it overlaps.
  const double width = total / static_cast<double>(students);
  const double lo = width * static_cast<double>(student);
  const double hi = student + 1 == students ? total : lo + width;
  std::vector<Share> out;
  double begin = 0;
  for (std::size_t t = 0; t < cap.size(); ++t) {
    const double end = begin + cap[t];
    const double overlap = std::min(end, hi) - std::max(begin, lo);
    // Slivers from rounding (a boundary that falls on a teacher's edge) are not a share.
    if (overlap > width * 1e-9) out.push_back({t, overlap / width});
    begin = end;
  }
  double sum = 0;
  for (const auto& s : out) sum += s.fraction;
  for (auto& s : out) s.fraction /= sum;
  return out;
}

RoundRobin::RoundRobin(std::vector<Share> shares)
    : shares_(std::move(shares)), credit_(shares_.size(), 0.0) {}

std::size_t RoundRobin::next() {
  if (shares_.empty()) SINEW_THROW(InternalError, "balancer: no teacher to pick");
  std::size_t best = 0;
  for (std::size_t i = 0; i < shares_.size(); ++i) {
    credit_[i] += shares_[i].fraction;
    if (credit_[i] > credit_[best]) best = i;
  }
  credit_[best] -= 1.0;
  return shares_[best].teacher;
}

}  // namespace sinew::distill
