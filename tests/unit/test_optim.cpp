// Optimizers against values computed by hand (in double, from PyTorch's update rules) and learning-rate
// schedules at chosen steps.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/optim/lr_schedule.hpp"
#include "sinew/optim/optimizer.hpp"

namespace sinew::optim {
namespace {

using Vec3 = std::array<double, 3>;

constexpr std::array<float, 3> kStart = {1.f, -2.f, 3.f};
constexpr std::array<float, 3> kGrad = {0.5f, -1.f, 2.f};  // the same gradient at every step

/// Runs `expected.size()` steps from kStart with gradient kGrad and compares every step.
void expect_trajectory(const OptimizerOptions& opts, float lr, const std::vector<Vec3>& expected) {
  auto opt = make_optimizer(opts, 3);
  std::array<float, 3> p = kStart;
  for (std::size_t s = 0; s < expected.size(); ++s) {
    opt->step(p, kGrad, lr);
    EXPECT_EQ(opt->steps(), static_cast<std::int64_t>(s + 1));
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(p[i], expected[s][i], 2e-6 * std::max(1.0, std::abs(expected[s][i])))
          << opts.name << " step " << s + 1 << " element " << i;
    }
  }
}

OptimizerOptions sgd(float momentum, float weight_decay, bool nesterov) {
  OptimizerOptions o;
  o.name = "sgd";
  o.momentum = momentum;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  return o;
}

OptimizerOptions adam(float beta1, float beta2, float eps, float weight_decay) {
  OptimizerOptions o;
  o.name = "adam";
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  return o;
}

TEST(Optim, SgdPlain) {
  // p -= lr * g
  expect_trajectory(sgd(0.f, 0.f, false), 0.1f, {{0.95, -1.9, 2.8}, {0.9, -1.8, 2.6}});
  auto opt = make_optimizer(sgd(0.f, 0.f, false), 3);
  EXPECT_EQ(opt->name(), "sgd");
  EXPECT_TRUE(opt->state().empty());  // no momentum buffer
}

TEST(Optim, SgdMomentumWeightDecay) {
  // step 1: d = 0.5 + 0.01*1 = 0.51, buf = 0.51, p = 1 - 0.051 = 0.949
  // step 2: d = 0.5 + 0.00949 = 0.50949, buf = 0.9*0.51 + 0.50949 = 0.96849, p = 0.949 - 0.096849 = 0.852151
  expect_trajectory(
      sgd(0.9f, 0.01f, false), 0.1f,
      {{0.949, -1.898, 2.797}, {0.852151, -1.704302, 2.411503}, {0.714134749, -1.428269498, 1.862144197}});
}

TEST(Optim, SgdNesterov) {
  // step 1: d = 0.51, buf = 0.51, direction = d + 0.9*buf = 0.969, p = 1 - 0.0969 = 0.9031
  expect_trajectory(sgd(0.9f, 0.01f, true), 0.1f,
                    {{0.9031, -1.8062, 2.6143},
                     {0.76507411, -1.53014822, 2.06490283},
                     {0.590209958191, -1.180419916382, 1.368874931623}});
}

TEST(Optim, AdamDefaults) {
  // With a constant gradient, bias-corrected m/sqrt(v) = sign(g): every step moves each element by lr.
  expect_trajectory(adam(0.9f, 0.999f, 1e-8f, 0.f), 0.01f,
                    {{0.99, -1.99, 2.99}, {0.98, -1.98, 2.98}, {0.97, -1.97, 2.97}});
}

TEST(Optim, AdamWeightDecayAndEps) {
  expect_trajectory(adam(0.8f, 0.99f, 1e-3f, 0.1f), 0.01f,
                    {{0.9900166389351082, -1.990008326394671, 2.9900043459365495},
                     {0.9800341770719881, -1.9800170986113057, 2.9800089235295815},
                     {0.9700531964545697, -1.970026606970963, 2.9700138840767756}});
}

TEST(Optim, StateNamesAndSizes) {
  auto s = make_optimizer(sgd(0.9f, 0.f, false), 7);
  auto st = s->state();
  ASSERT_EQ(st.size(), 1U);
  EXPECT_EQ(st[0].first, "momentum");
  EXPECT_EQ(st[0].second.size(), 7U);
  auto a = make_optimizer(adam(0.9f, 0.999f, 1e-8f, 0.f), 7);
  EXPECT_EQ(a->name(), "adam");
  st = a->state();
  ASSERT_EQ(st.size(), 2U);
  EXPECT_EQ(st[0].first, "adam_m");
  EXPECT_EQ(st[1].first, "adam_v");
  EXPECT_EQ(st[0].second.size(), 7U);
  EXPECT_EQ(st[1].second.size(), 7U);
}

TEST(Optim, RestoredStateAndStepsContinueExactly) {
  // What a checkpoint restore does: copy the state buffers and the step count into a fresh optimizer.
  for (const OptimizerOptions& opts : {sgd(0.9f, 0.01f, true), adam(0.9f, 0.999f, 1e-8f, 0.01f)}) {
    auto a = make_optimizer(opts, 3);
    std::array<float, 3> pa = kStart;
    for (int s = 0; s < 3; ++s) a->step(pa, kGrad, 0.05f);

    auto b = make_optimizer(opts, 3);
    auto sa = a->state();
    auto sb = b->state();
    ASSERT_EQ(sa.size(), sb.size());
    for (std::size_t k = 0; k < sa.size(); ++k)
      std::copy(sa[k].second.begin(), sa[k].second.end(), sb[k].second.begin());
    b->set_steps(a->steps());
    std::array<float, 3> pb = pa;

    a->step(pa, kGrad, 0.05f);
    b->step(pb, kGrad, 0.05f);
    EXPECT_EQ(pa, pb) << opts.name;
    EXPECT_EQ(b->steps(), 4);
  }
}

TEST(Optim, BadOptionsThrow) {
  OptimizerOptions unknown;
  unknown.name = "rmsprop";
  EXPECT_THROW(make_optimizer(unknown, 3), InvalidArgument);
  EXPECT_THROW(make_optimizer(sgd(0.f, 0.f, true), 3), InvalidArgument);  // nesterov without momentum
  EXPECT_THROW(make_optimizer(sgd(-0.1f, 0.f, false), 3), InvalidArgument);
  EXPECT_THROW(make_optimizer(sgd(0.9f, -1.f, false), 3), InvalidArgument);
  EXPECT_THROW(make_optimizer(sgd(std::numeric_limits<float>::quiet_NaN(), 0.f, false), 3), InvalidArgument);
  EXPECT_THROW(make_optimizer(adam(1.f, 0.999f, 1e-8f, 0.f), 3), InvalidArgument);
  EXPECT_THROW(make_optimizer(adam(0.9f, -0.1f, 1e-8f, 0.f), 3), InvalidArgument);
  EXPECT_THROW(make_optimizer(adam(0.9f, 0.999f, -1.f, 0.f), 3), InvalidArgument);

  auto opt = make_optimizer(sgd(0.9f, 0.f, false), 3);
  std::array<float, 3> p = kStart;
  std::array<float, 2> short_grad = {1.f, 2.f};
  EXPECT_THROW(opt->step(p, short_grad, 0.1f), InvalidArgument);
  EXPECT_THROW(opt->step(p, kGrad, -0.1f), InvalidArgument);
  EXPECT_THROW(opt->set_steps(-1), InvalidArgument);
  EXPECT_EQ(opt->steps(), 0);
}

// --- learning-rate schedules -----------------------------------------------------------------------------

LrScheduleOptions schedule(const char* kind, float base, std::int64_t warmup) {
  LrScheduleOptions o;
  o.kind = kind;
  o.base_lr = base;
  o.warmup_steps = warmup;
  return o;
}

TEST(Lr, ConstantWithWarmup) {
  const LrSchedule plain(schedule("constant", 0.1f, 0));
  EXPECT_FLOAT_EQ(plain.lr(0), 0.1f);
  EXPECT_FLOAT_EQ(plain.lr(123456), 0.1f);
  const LrSchedule warm(schedule("constant", 0.1f, 4));
  EXPECT_FLOAT_EQ(warm.lr(0), 0.025f);
  EXPECT_FLOAT_EQ(warm.lr(1), 0.05f);
  EXPECT_FLOAT_EQ(warm.lr(3), 0.1f);
  EXPECT_FLOAT_EQ(warm.lr(4), 0.1f);
  EXPECT_EQ(warm.options().warmup_steps, 4);
}

TEST(Lr, StepDecayCountsFromEndOfWarmup) {
  LrScheduleOptions o = schedule("step", 1.f, 0);
  o.step_size = 10;
  o.gamma = 0.5f;
  const LrSchedule s(o);
  EXPECT_FLOAT_EQ(s.lr(0), 1.f);
  EXPECT_FLOAT_EQ(s.lr(9), 1.f);
  EXPECT_FLOAT_EQ(s.lr(10), 0.5f);
  EXPECT_FLOAT_EQ(s.lr(25), 0.25f);
  o.warmup_steps = 5;
  const LrSchedule w(o);
  EXPECT_FLOAT_EQ(w.lr(0), 0.2f);
  EXPECT_FLOAT_EQ(w.lr(4), 1.f);
  EXPECT_FLOAT_EQ(w.lr(14), 1.f);
  EXPECT_FLOAT_EQ(w.lr(15), 0.5f);
}

TEST(Lr, CosineFromBaseToMin) {
  LrScheduleOptions o = schedule("cosine", 1.f, 10);
  o.total_steps = 110;
  o.min_lr = 0.1f;
  const LrSchedule s(o);
  EXPECT_FLOAT_EQ(s.lr(9), 1.f);  // end of warm-up
  EXPECT_FLOAT_EQ(s.lr(10), 1.f);
  EXPECT_FLOAT_EQ(s.lr(35), static_cast<float>(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4))));
  EXPECT_FLOAT_EQ(s.lr(60), 0.55f);
  EXPECT_FLOAT_EQ(s.lr(110), 0.1f);
  EXPECT_FLOAT_EQ(s.lr(1000), 0.1f);
  for (std::int64_t t = 11; t <= 110; ++t) EXPECT_LE(s.lr(t), s.lr(t - 1));
}

TEST(Lr, BadOptionsThrow) {
  EXPECT_THROW(LrSchedule(schedule("constant", -0.1f, 0)), InvalidArgument);
  EXPECT_THROW(LrSchedule(schedule("constant", std::numeric_limits<float>::quiet_NaN(), 0)), InvalidArgument);
  EXPECT_THROW(LrSchedule(schedule("constant", 0.1f, -1)), InvalidArgument);
  EXPECT_THROW(LrSchedule(schedule("linear", 0.1f, 0)), InvalidArgument);
  EXPECT_THROW(LrSchedule(schedule("cosine", 0.1f, 0)), InvalidArgument);  // no total_steps
  LrScheduleOptions cos = schedule("cosine", 0.1f, 100);
  cos.total_steps = 100;  // not beyond warm-up
  EXPECT_THROW(LrSchedule{cos}, InvalidArgument);
  cos.total_steps = 200;
  cos.min_lr = 0.2f;  // above base_lr
  EXPECT_THROW(LrSchedule{cos}, InvalidArgument);
  LrScheduleOptions step = schedule("step", 0.1f, 0);
  step.step_size = 0;
  EXPECT_THROW(LrSchedule{step}, InvalidArgument);
  step.step_size = 10;
  step.gamma = 0.f;
  EXPECT_THROW(LrSchedule{step}, InvalidArgument);
  EXPECT_THROW((void)LrSchedule(schedule("constant", 0.1f, 0)).lr(-1), InvalidArgument);
}

}  // namespace
}  // namespace sinew::optim
