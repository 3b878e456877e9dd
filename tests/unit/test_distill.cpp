// Distillation pieces that need no teacher service: the loss and its gradient, the balancer, and the
// Distiller's waiting policies over a source that answers late or not at all.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/distill/balancer.hpp"
#include "sinew/distill/distiller.hpp"
#include "sinew/model/loss.hpp"

using namespace sinew;
using model::Matrix;

namespace {

/// log softmax(v / T)_i in double, written out the textbook way (no shared code with loss.cpp).
double log_softmax(const std::vector<double>& v, double t, std::size_t i) {
  double m = v[0];
  for (double x : v) m = std::max(m, x);
  double s = 0;
  for (double x : v) s += std::exp((x - m) / t);
  return (v[i] - m) / t - std::log(s);
}

/// The reference loss of one sample: alpha CE + (1 - alpha) T^2 KL(p_teacher || q_student).
double reference(const std::vector<double>& z, const std::vector<double>& tz, int label, double alpha,
                 double t, bool has_teacher) {
  const double ce = -log_softmax(z, 1.0, static_cast<std::size_t>(label));
  if (!has_teacher) return ce;
  double kl = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double lp = log_softmax(tz, t, i);
    kl += std::exp(lp) * (lp - log_softmax(z, t, i));
  }
  return alpha * ce + (1 - alpha) * t * t * kl;
}

}  // namespace

TEST(DistillLoss, MatchesAHandComputation) {
  // Two classes, one sample: z = (1, 0), teacher (0, 1), label 0, alpha 0.25, T 2.
  // p = softmax((0, 1) / 2) = (0.37754, 0.62246); q = softmax((1, 0) / 2) = (0.62246, 0.37754)
  // KL = 0.37754 ln(0.37754 / 0.62246) + 0.62246 ln(0.62246 / 0.37754) = 0.24492 * 0.5 = 0.122459
  // CE = ln(1 + e^-1) = 0.313262; loss = 0.25 * 0.313262 + 0.75 * 4 * 0.122459 = 0.445693
  Matrix z(2, 1);
  z << 1.f, 0.f;
  const std::vector<float> teacher{0.f, 1.f};
  const std::vector<std::int32_t> labels{0};
  Matrix d;
  const float loss = model::distillation_loss(z, labels, teacher, {}, 0.25f, 2.f, d, 1.0);
  EXPECT_NEAR(loss, 0.445693, 2e-5);
  // d/dz0 = 0.25 (0.731059 - 1) + 0.75 * 2 * (0.622459 - 0.377541) = 0.300142; d/dz1 = -d/dz0 (two classes)
  EXPECT_NEAR(d(0, 0), 0.300142, 2e-5);
  EXPECT_NEAR(d(1, 0), -0.300142, 2e-5);
}

TEST(DistillLoss, AgreesWithTheReferenceAndItsGradientWithFiniteDifferences) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int classes = 10, batch = 6;
  Matrix z(classes, batch);
  std::vector<float> teacher(classes * batch);
  std::vector<std::int32_t> labels(batch);
  for (int n = 0; n < batch; ++n) {
    labels[n] = n % classes;
    for (int i = 0; i < classes; ++i) {
      z(i, n) = nd(rng);
      teacher[static_cast<std::size_t>(n * classes + i)] = nd(rng);
    }
  }
  const std::vector<std::uint8_t> has{1, 0, 1, 1, 0, 1};
  const double denom = 17.0;  // a global batch larger than this rank's
  for (const float alpha : {0.f, 0.3f, 1.f}) {
    for (const float t : {1.f, 4.f}) {
      Matrix d;
      const float loss = model::distillation_loss(z, labels, teacher, has, alpha, t, d, denom);
      double want = 0;
      for (int n = 0; n < batch; ++n) {
        std::vector<double> zn(classes), tn(classes);
        for (int i = 0; i < classes; ++i) {
          zn[i] = z(i, n);
          tn[i] = teacher[static_cast<std::size_t>(n * classes + i)];
        }
        want += reference(zn, tn, labels[n], alpha, t, has[n] != 0);
      }
      EXPECT_NEAR(loss, want / denom, 1e-5 * std::max(1.0, want / denom)) << alpha << " " << t;
      // Central differences in double of the reference, for a few entries.
      for (const auto& [i, n] : {std::pair{0, 0}, {3, 1}, {9, 2}, {5, 5}, {labels[3], 3}}) {
        auto f = [&](double delta) {
          std::vector<double> zn(classes), tn(classes);
          for (int k = 0; k < classes; ++k) {
            zn[k] = z(k, n) + (k == i ? delta : 0.0);
            tn[k] = teacher[static_cast<std::size_t>(n * classes + k)];
          }
          return reference(zn, tn, labels[n], alpha, t, has[n] != 0) / denom;
        };
        const double h = 1e-4;
        EXPECT_NEAR(d(i, n), (f(h) - f(-h)) / (2 * h), 1e-5)
            << "alpha " << alpha << " T " << t << " (" << i << "," << n << ")";
      }
    }
  }
}

TEST(DistillLoss, AlphaOneIsCrossEntropyAndBadArgumentsAreRefused) {
  Matrix z(3, 2);
  z << 1, 2, 0, -1, 3, 0.5;
  const std::vector<std::int32_t> labels{2, 0};
  const std::vector<float> teacher{5, 0, 0, 0, 5, 0};
  Matrix d1, d2;
  const float a = model::distillation_loss(z, labels, teacher, {}, 1.f, 3.f, d1, 0);
  const float b = model::softmax_cross_entropy(z, labels, d2, 0);
  EXPECT_NEAR(a, b, 1e-6);
  EXPECT_TRUE(d1.isApprox(d2, 1e-6f));
  EXPECT_THROW(model::distillation_loss(z, labels, teacher, {}, 1.5f, 3.f, d1, 0), InvalidArgument);
  EXPECT_THROW(model::distillation_loss(z, labels, teacher, {}, 0.5f, 0.f, d1, 0), InvalidArgument);
  EXPECT_THROW(model::distillation_loss(z, labels, std::vector<float>(5), {}, 0.5f, 1.f, d1, 0),
               InvalidArgument);
  EXPECT_THROW(
      model::distillation_loss(z, labels, teacher, std::vector<std::uint8_t>(3, 1), 0.5f, 1.f, d1, 0),
      InvalidArgument);
}

TEST(DistillLoss, GlobalDenominatorMakesRankSumsTheSingleRankGradient) {
  // Two ranks with half the batch each and the global denominator sum to one rank with the whole batch.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  Matrix z(4, 8);
  for (int i = 0; i < z.size(); ++i) z.data()[i] = nd(rng);
  std::vector<float> t(32);
  for (auto& v : t) v = nd(rng);
  std::vector<std::int32_t> labels{0, 1, 2, 3, 0, 1, 2, 3};
  Matrix whole, h0, h1;
  const float lw = model::distillation_loss(z, labels, t, {}, 0.5f, 2.f, whole, 8);
  const Matrix z0 = z.leftCols(4), z1 = z.rightCols(4);
  const float l0 =
      model::distillation_loss(z0, std::span(labels).first(4), std::span(t).first(16), {}, 0.5f, 2.f, h0, 8);
  const float l1 =
      model::distillation_loss(z1, std::span(labels).last(4), std::span(t).last(16), {}, 0.5f, 2.f, h1, 8);
  EXPECT_NEAR(lw, l0 + l1, 1e-6);
  EXPECT_TRUE(whole.leftCols(4).isApprox(h0) && whole.rightCols(4).isApprox(h1));
}

// ---- balancer -------------------------------------------------------------------------------------------

namespace {
/// Each teacher's load (requests per student-request-unit) over all students.
std::vector<double> loads(const std::vector<double>& caps, std::size_t students) {
  std::vector<double> load(caps.size(), 0.0);
  for (std::size_t s = 0; s < students; ++s) {
    double sum = 0;
    for (const auto& sh : distill::assign(caps, students, s)) {
      load[sh.teacher] += sh.fraction;
      sum += sh.fraction;
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
  }
  return load;
}
}  // namespace

TEST(Balancer, LoadFollowsCapacityForManyShapes) {
  for (const auto& caps : std::vector<std::vector<double>>{
           {1}, {1, 1}, {1, 3}, {5, 1, 1}, {2, 2, 2, 2}, {100, 10, 1}, {1, 2, 3, 4, 5, 6, 7}}) {
    for (std::size_t students : {1, 2, 3, 4, 7, 16}) {
      const auto load = loads(caps, students);
      double total = 0;
      for (double c : caps) total += c;
      for (std::size_t t = 0; t < caps.size(); ++t) {
        // Every teacher gets students * (its share of the capacity): all of them finish together.
        EXPECT_NEAR(load[t], static_cast<double>(students) * caps[t] / total, 1e-9)
            << caps.size() << " teachers, " << students << " students, teacher " << t;
      }
      // Each boundary between two students cuts at most one teacher: T + S - 1 connections in all.
      std::size_t connections = 0;
      for (std::size_t s = 0; s < students; ++s) {
        const auto n = distill::assign(caps, students, s).size();
        EXPECT_GE(n, 1U);
        connections += n;
      }
      EXPECT_LE(connections, caps.size() + students - 1)
          << caps.size() << " teachers, " << students << " students";
    }
  }
}

TEST(Balancer, BeatsTheCountRuleWhenSpeedsDiffer) {
  // Teachers of 100 and 300 samples/s, 4 students each asking at rate r: EDL's rule gives each teacher 2
  // students, so the slow one needs 2r <= 100 (r <= 50, total 200). Weighted, the slow one carries a quarter
  // of the 4r: r <= 100, total 400.
  const std::vector<double> caps{100, 300};
  const auto load = loads(caps, 4);
  const double r_weighted = std::min(caps[0] / load[0], caps[1] / load[1]);
  const double r_count = std::min(caps[0] / 2, caps[1] / 2);
  EXPECT_NEAR(r_weighted, 100, 1e-9);
  EXPECT_NEAR(r_count, 50, 1e-9);
}

TEST(Balancer, UnknownCapacitiesCountAsTheMeanAndBadStudentIsRefused) {
  const std::vector<double> caps{0, 200, 0, 100};  // two not measured yet: 150 each
  const auto load = loads(caps, 3);
  EXPECT_NEAR(load[0], 3 * 150.0 / 600, 1e-9);
  EXPECT_NEAR(load[1], 3 * 200.0 / 600, 1e-9);
  EXPECT_TRUE(distill::assign({}, 2, 0).empty());
  EXPECT_THROW(distill::assign(caps, 2, 2), InvalidArgument);
}

TEST(Balancer, RoundRobinKeepsTheProportionsInEveryWindow) {
  distill::RoundRobin rr({{0, 0.5}, {1, 0.25}, {2, 0.25}});
  std::map<std::size_t, int> seen;
  for (int i = 0; i < 400; ++i) {
    ++seen[rr.next()];
    if (i % 4 == 3) {  // within one request of exact at every point
      EXPECT_NEAR(seen[0], (i + 1) * 0.5, 1.0);
      EXPECT_NEAR(seen[1], (i + 1) * 0.25, 1.0);
    }
  }
  EXPECT_EQ(seen[0], 200);
  EXPECT_EQ(seen[1], 100);
  EXPECT_EQ(seen[2], 100);
  distill::RoundRobin empty;
  EXPECT_THROW(empty.next(), InternalError);
}

// ---- the Distiller's policies -------------------------------------------------------------------------

namespace {
/// A source whose answer is the sample index in every class, after `delay`; or a ServiceError when
/// `fail` is set. Stands for a slow or dead teacher in the policy tests (the real service is tested in
/// tests/serve and by the cli.distill tests).
class ScriptedSource final : public distill::LogitSource {
 public:
  std::atomic<int> delay_ms{0};
  std::atomic<bool> fail{false};
  std::atomic<int> calls{0};
  void fetch(std::span<const std::size_t> indices, distill::Clock::time_point deadline,
             std::vector<float>& out) override {
    ++calls;
    const auto until = distill::Clock::now() + std::chrono::milliseconds(delay_ms.load());
    while (distill::Clock::now() < until) {
      if (distill::Clock::now() >= deadline) SINEW_THROW(ServiceError, "scripted teacher: deadline exceeded");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (fail) SINEW_THROW(ServiceError, "scripted teacher: unavailable");
    out.clear();
    for (const std::size_t i : indices)
      for (int c = 0; c < classes(); ++c) out.push_back(static_cast<float>(i));
  }
  [[nodiscard]] int classes() const override { return 3; }
  [[nodiscard]] std::string describe() const override { return "scripted"; }
};
}  // namespace

TEST(Distiller, PrefetchedLogitsArriveAndAreUsedOnce) {
  auto src = std::make_unique<ScriptedSource>();
  auto* s = src.get();
  distill::Distiller d({}, std::move(src), 100);
  const std::vector<std::size_t> a{5, 6, 7};
  d.prefetch(a);
  d.prefetch(a);  // asked already: no second request
  std::vector<float> out;
  std::vector<std::uint8_t> has;
  const auto r = d.take(a, out, has);
  EXPECT_EQ(r.missing, 0U);
  EXPECT_EQ(s->calls.load(), 1);
  ASSERT_EQ(out.size(), 9U);
  EXPECT_EQ(out[0], 5.f);
  EXPECT_EQ(out[8], 7.f);
  EXPECT_EQ(has, (std::vector<std::uint8_t>{1, 1, 1}));
  // Used: taking them again asks again.
  d.take(a, out, has);
  EXPECT_EQ(s->calls.load(), 2);
}

TEST(Distiller, LabelsPolicyGivesUpAfterTheTimeoutAndSaysWhy) {
  auto src = std::make_unique<ScriptedSource>();
  src->fail = true;
  distill::DistillOptions o;
  o.timeout = std::chrono::milliseconds(300);
  distill::Distiller d(o, std::move(src), 10);
  std::vector<float> out;
  std::vector<std::uint8_t> has;
  const std::vector<std::size_t> a{1, 2};
  const auto r = d.take(a, out, has);
  EXPECT_EQ(r.missing, 2U);
  EXPECT_NE(r.reason.find("unavailable"), std::string::npos) << r.reason;
  EXPECT_LT(r.wait_ms, 1000);  // a failed request ends the wait; it does not sit out the whole timeout
  EXPECT_EQ(has, (std::vector<std::uint8_t>{0, 0}));
  EXPECT_EQ(d.totals().missing, 2);
}

TEST(Distiller, LabelsPolicyBoundsTheWaitForASlowTeacher) {
  auto src = std::make_unique<ScriptedSource>();
  src->delay_ms = 5000;
  distill::DistillOptions o;
  o.timeout = std::chrono::milliseconds(200);
  distill::Distiller d(o, std::move(src), 10);
  std::vector<float> out;
  std::vector<std::uint8_t> has;
  const std::vector<std::size_t> a{3};
  const auto t0 = distill::Clock::now();
  const auto r = d.take(a, out, has);
  const double ms = std::chrono::duration<double, std::milli>(distill::Clock::now() - t0).count();
  EXPECT_EQ(r.missing, 1U);
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 2000);
}

TEST(Distiller, WaitPolicyAsksAgainUntilTheTeacherIsBack) {
  auto src = std::make_unique<ScriptedSource>();
  auto* s = src.get();
  s->fail = true;
  distill::DistillOptions o;
  o.timeout = std::chrono::milliseconds(100);
  o.max_wait = std::chrono::milliseconds(10000);
  o.on_missing = distill::OnMissing::kWait;
  distill::Distiller d(o, std::move(src), 10);
  std::thread heal([s] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    s->fail = false;
  });
  std::vector<float> out;
  std::vector<std::uint8_t> has;
  const std::vector<std::size_t> a{4, 9};
  const auto r = d.take(a, out, has);
  heal.join();
  EXPECT_EQ(r.missing, 0U);
  EXPECT_GE(r.wait_ms, 350);
  EXPECT_GT(s->calls.load(), 1);
  EXPECT_EQ(out[3], 9.f);
}

TEST(Distiller, RefusesBadOptions) {
  distill::DistillOptions o;
  o.alpha = 2;
  EXPECT_THROW(distill::Distiller(o, std::make_unique<ScriptedSource>(), 1), InvalidArgument);
  EXPECT_THROW(distill::Distiller({}, nullptr, 1), InvalidArgument);
}
