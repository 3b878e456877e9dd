#include "sinew/comm/backend.hpp"

#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::comm {

void poll_until_complete(Work& w, std::chrono::milliseconds timeout, std::string_view what,
                         const std::uint64_t* progress) {
  const auto start = Clock::now();
  // Saturating: a timeout past the clock's range (milliseconds::max()) means no deadline.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - start);
  const auto deadline = timeout >= room ? Clock::time_point::max() : start + timeout;
  auto phase = start;  // when the last progress was seen
  std::uint64_t seen = progress != nullptr ? *progress : 0;
  for (int spins = 0;; ++spins) {
    if (w.test()) return;
    if (progress != nullptr && *progress != seen) {
      seen = *progress;
      phase = Clock::now();
      spins = 0;
      continue;
    }
    if (spins > 64) {
      const auto now = Clock::now();
      if (now > deadline) {
        SINEW_THROW(Timeout, "{} did not complete within {} ms; a peer is dead, stopped or far behind", what,
                    timeout.count());
      }
      // A long wait (a slow link, a peer still computing) polls less often, leaving the core to the
      // ranks and threads that share it; a short one stays responsive.
      if (now - phase > std::chrono::milliseconds(2)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::yield();
      }
    }
  }
}

namespace {

class AllOf final : public Work {
 public:
  explicit AllOf(std::vector<std::unique_ptr<Work>> works) : works_(std::move(works)) {}
  bool test() override {
    for (; done_ < works_.size(); ++done_)
      if (!works_[done_]->test()) return false;
    return true;
  }
  void wait(std::chrono::milliseconds timeout) override {
    const auto start = Clock::now();
    for (; done_ < works_.size(); ++done_) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      works_[done_]->wait(timeout > spent ? timeout - spent : std::chrono::milliseconds(0));
    }
  }
  void abort() noexcept override {
    for (auto& w : works_) w->abort();
  }

 private:
  std::vector<std::unique_ptr<Work>> works_;
  std::size_t done_ = 0;  // works_[0, done_) have completed
};

class Done final : public Work {
 public:
  bool test() override { return check(); }
  void wait(std::chrono::milliseconds) override { check(); }
  void abort() noexcept override { aborted_ = true; }

 private:
  bool check() const {
    if (aborted_) SINEW_THROW(CommFailure, "a fill that was given up");
    return true;
  }
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Work> all_of(std::vector<std::unique_ptr<Work>> works) {
  std::erase(works, nullptr);
  return std::make_unique<AllOf>(std::move(works));
}

std::unique_ptr<Work> Backend::exchange(std::span<const Message> sends, std::span<const Message> recvs,
                                        const Options& opts) {
  if (sends.empty() && recvs.empty()) return nullptr;
  std::vector<std::unique_ptr<Work>> works;
  works.reserve(sends.size() + recvs.size());
  for (const Message& m : recvs) works.push_back(recv(m.buf, m.peer, opts));
  for (const Message& m : sends) works.push_back(send(m.buf, m.peer, opts));
  return all_of(std::move(works));
}

std::unique_ptr<Work> Backend::fill(Buffer buf, std::uint8_t byte) {
  std::memset(buf.data, byte, buf.bytes());
  return std::make_unique<Done>();
}

std::unique_ptr<Work> Backend::reduce_scatter(Buffer, Buffer, std::span<const std::size_t>, ReduceOp,
                                              const Options&) {
  SINEW_THROW(InvalidArgument, "the {} backend has no reduce-scatter of uneven blocks", name());
}

std::unique_ptr<Work> Backend::allgather_v(Buffer, std::span<const std::size_t>, const Options&) {
  SINEW_THROW(InvalidArgument, "the {} backend has no all-gather of uneven blocks", name());
}

std::string Backend::share_sync(const std::string& bytes, bool have, const Options& opts) {
  // The lowest rank that has them: a min over (have ? rank : size).
  std::int64_t v[1] = {have ? rank() : size()};
  allreduce_sync(Buffer::of(std::span<std::int64_t>(v)), ReduceOp::kMin, opts);
  const int root = static_cast<int>(v[0]);
  if (root >= size()) return {};
  std::int64_t len[1] = {static_cast<std::int64_t>(bytes.size())};
  broadcast_sync(Buffer::of(std::span<std::int64_t>(len)), root, opts);
  std::string out = rank() == root ? bytes : std::string(static_cast<std::size_t>(len[0]), '\0');
  if (!out.empty()) broadcast_sync(Buffer::of(std::as_writable_bytes(std::span<char>(out))), root, opts);
  return out;
}

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 1;
}

}  // namespace sinew::comm
