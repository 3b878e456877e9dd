// Stop and leave signals (train/control.hpp): one caught before training starts (Signals::catch_early, in
// main) is kept for the trainer's Signals, which restores the original handlers when it ends; a later
// Signals starts afresh. launch_env.sh checks the same with real processes under mpirun.
#include <gtest/gtest.h>

#include <csignal>

#include "sinew/train/control.hpp"

namespace sinew::train {
namespace {

using Handler = void (*)(int);

Handler handler_of(int sig) {
  struct sigaction sa {};
  sigaction(sig, nullptr, &sa);
  return sa.sa_handler;
}

TEST(Signals, CaughtBeforeTrainingIsKeptForTheTrainer) {
  const Handler usr1 = handler_of(SIGUSR1), term = handler_of(SIGTERM), usr2 = handler_of(SIGUSR2);
  Signals::catch_early();
  EXPECT_NE(handler_of(SIGUSR1), usr1);
  EXPECT_NE(handler_of(SIGTERM), term);
  EXPECT_NE(handler_of(SIGUSR2), usr2);
  Signals::catch_early();             // a second call changes nothing
  ASSERT_EQ(std::raise(SIGUSR1), 0);  // the handler runs before raise returns: no default action
  EXPECT_EQ(Signals::stop(), SIGUSR1);
  EXPECT_FALSE(Signals::leave());
  {
    const Signals trainer;  // the trainer's: keeps what arrived during the start-up
    EXPECT_EQ(Signals::stop(), SIGUSR1);
    ASSERT_EQ(std::raise(SIGUSR2), 0);
    EXPECT_TRUE(Signals::leave());
    ASSERT_EQ(std::raise(SIGTERM), 0);
    EXPECT_EQ(Signals::stop(), SIGTERM);
  }
  // The handlers from before catch_early() are back.
  EXPECT_EQ(handler_of(SIGUSR1), usr1);
  EXPECT_EQ(handler_of(SIGTERM), term);
  EXPECT_EQ(handler_of(SIGUSR2), usr2);
  {
    const Signals next;  // another trainer in the same process: nothing received yet
    EXPECT_EQ(Signals::stop(), 0);
    EXPECT_FALSE(Signals::leave());
  }
  EXPECT_EQ(handler_of(SIGUSR1), usr1);
}

}  // namespace
}  // namespace sinew::train
