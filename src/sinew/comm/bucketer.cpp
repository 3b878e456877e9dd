#include "sinew/comm/bucketer.hpp"

#include <algorithm>

#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::comm {

BucketLayout::BucketLayout(const std::vector<Slice>& ready_order, std::size_t n, std::size_t bucket_bytes,
                           const char* who)
    : who_(who) {
  if (ready_order.empty()) SINEW_THROW(InvalidArgument, "{}: no gradient ranges", who);
  std::size_t covered = 0;
  const std::size_t target = std::max<std::size_t>(bucket_bytes / sizeof(float), 1);
  for (const Slice& r : ready_order) {
    if (r.count == 0 || r.offset + r.count > n) {
      SINEW_THROW(InvalidArgument, "{}: range [{}, {}) is empty or outside the {} gradients", who, r.offset,
                  r.offset + r.count, n);
    }
    covered += r.count;
    const bool adjacent =
        !buckets_.empty() && (r.offset + r.count == buckets_.back().range.offset ||
                              buckets_.back().range.offset + buckets_.back().range.count == r.offset);
    if (buckets_.empty() || !adjacent || buckets_.back().range.count >= target) {
      buckets_.push_back({r, 1});
    } else {
      Bucket& b = buckets_.back();
      b.range.offset = std::min(b.range.offset, r.offset);
      b.range.count += r.count;
      ++b.ranges_total;
    }
    bucket_of_offset_.emplace_back(r.offset, buckets_.size() - 1);
  }
  if (covered != n) {
    SINEW_THROW(InvalidArgument, "{}: ranges cover {} of {} gradients; they must cover each exactly once",
                who, covered, n);
  }
  std::sort(bucket_of_offset_.begin(), bucket_of_offset_.end());
  ready_.assign(buckets_.size(), 0);
}

BucketLayout::Arrival BucketLayout::arrive(std::size_t offset) {
  const std::size_t b = bucket_of(offset);
  SINEW_ENFORCE(ready_[b] < buckets_[b].ranges_total, "{}: range at offset {} arrived twice in one step",
                who_, offset);
  return {b, ++ready_[b] == buckets_[b].ranges_total};
}

std::vector<Slice> BucketLayout::ranges() const {
  std::vector<Slice> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.range);
  return out;
}

void BucketLayout::rearm() { std::fill(ready_.begin(), ready_.end(), 0); }

std::size_t BucketLayout::bucket_of(std::size_t offset) const {
  const auto it = std::lower_bound(bucket_of_offset_.begin(), bucket_of_offset_.end(),
                                   std::make_pair(offset, std::size_t{0}));
  if (it == bucket_of_offset_.end() || it->first != offset) {
    SINEW_THROW(InvalidArgument, "{}: range at offset {} is not one of the registered ranges", who_, offset);
  }
  return it->second;
}

GradientBucketer::GradientBucketer(Backend& backend, std::span<float> grads,
                                   const std::vector<Slice>& ready_order, BucketOptions opts)
    : backend_(backend),
      grads_(grads),
      opts_(std::move(opts)),
      layout_(ready_order, grads.size(), opts_.bucket_bytes, "bucketer") {
  if (opts_.overlap) thread_ = std::thread([this] { run(); });
}

GradientBucketer::~GradientBucketer() {
  bool stuck = false;
  {
    std::unique_lock lock(mu_);
    stop_ = true;
    cv_.notify_all();
    // After an abort without ULFM nothing can interrupt a blocked collective: do not wait for it forever.
    stuck = !cv_.wait_for(lock, std::chrono::seconds(5), [&] { return !busy_; });
  }
  if (!thread_.joinable()) return;
  if (stuck) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void GradientBucketer::mark_ready(Slice r, CUevent_st* ready) {
  SINEW_ENFORCE(ready == nullptr, "a device gradient range was reported to the host bucketer");
  bool notify = false;
  {
    std::lock_guard lock(mu_);
    notify = layout_.arrive(r.offset).complete;
    if (notify) pending_.fetch_add(1, std::memory_order_release);
  }
  if (!notify || !opts_.overlap) return;
  cv_.notify_all();
  if (opts_.max_backlog == 0) return;
  // The backlog: complete buckets from the next one to reduce on (only those the thread can take now; a later
  // complete bucket behind an incomplete one waits for backward, which must not wait for it).
  std::unique_lock lock(mu_);
  const auto backlog = [&] { return first_incomplete() - reduced_; };
  if (!cv_.wait_for(lock, opts_.op.timeout,
                    [&] { return stop_ || error_ != nullptr || backlog() <= opts_.max_backlog; })) {
    lock.unlock();
    backend_.abort();
    SINEW_THROW(Timeout,
                "gradient buckets waited more than {} ms for the communication thread; a peer is dead, "
                "stopped or far behind",
                opts_.op.timeout.count());
  }
}

void GradientBucketer::reduce(std::size_t b, bool blocking) {
  const Slice r = layout_.buckets()[b].range;
  const auto start = Clock::now();
  const Buffer buf = Buffer::of(grads_.subspan(r.offset, r.count));
  if (opts_.reduce) {
    opts_.reduce(grads_.subspan(r.offset, r.count), r.offset);
  } else if (blocking) {
    backend_.allreduce_blocking(buf, ReduceOp::kSum);
  } else {
    backend_.allreduce(buf, ReduceOp::kSum, opts_.op)->wait(opts_.op.timeout);
  }
  const double ms = seconds_since(start) * 1e3;
  std::lock_guard lock(mu_);
  comm_ms_ += ms;
  if (++reduced_ == num_buckets()) reduced_all_.store(true, std::memory_order_release);
}

std::size_t GradientBucketer::first_incomplete() const {
  std::size_t b = reduced_;  // (buckets before it were reduced, so complete)
  while (b < num_buckets() && layout_.complete(b)) ++b;
  return b;
}

// (By value: the communication thread's override keeps it.)
// NOLINTNEXTLINE(performance-unnecessary-value-param)
Bucketer::Ticket Bucketer::post_in_order(std::function<void()> fn) {
  auto t = std::make_shared<InOrder>();
  try {
    fn();
  } catch (...) {
    t->error = std::current_exception();
  }
  t->done = true;
  return t;
}

void Bucketer::wait_in_order(const Ticket& t) {
  SINEW_ENFORCE(t && t->done, "a collective between the gradient buckets was waited for before it ran");
  if (t->error) std::rethrow_exception(t->error);
}

Bucketer::Ticket GradientBucketer::post_in_order(std::function<void()> fn) {
  if (!opts_.overlap) return Bucketer::post_in_order(std::move(fn));
  auto task = std::make_shared<InOrder>();
  task->fn = std::move(fn);
  {
    std::lock_guard lock(mu_);
    task->before = first_incomplete();
    tasks_.push_back(task);
  }
  cv_.notify_all();
  return task;
}

void GradientBucketer::wait_in_order(const Ticket& task) {
  if (!opts_.overlap) return Bucketer::wait_in_order(task);
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, opts_.op.timeout, [&] { return task->done; })) {
    const auto it = std::find(tasks_.begin(), tasks_.end(), task);
    if (it != tasks_.end()) tasks_.erase(it);
    lock.unlock();
    backend_.abort();  // with ULFM a collective blocked in the task (or a bucket before it) returns
    SINEW_THROW(Timeout,
                "a collective between the gradient buckets did not complete within {} ms; a peer is dead, "
                "stopped or far behind",
                opts_.op.timeout.count());
  }
  if (task->error) std::rethrow_exception(task->error);
}

void GradientBucketer::cancel_in_order(const Ticket& task) {
  std::unique_lock lock(mu_);
  const auto it = std::find(tasks_.begin(), tasks_.end(), task);
  if (it != tasks_.end()) {  // not started: it never will
    tasks_.erase(it);
    task->done = true;
    return;
  }
  // Running (or done): a collective of a group that failed ends with the failure, at the latest when the
  // backend is aborted past the deadline.
  if (!cv_.wait_for(lock, opts_.op.timeout, [&] { return task->done; })) {
    lock.unlock();
    backend_.abort();
    lock.lock();
    cv_.wait_for(lock, opts_.op.timeout, [&] { return task->done; });
  }
}

void GradientBucketer::run() {
  for (;;) {
    std::size_t b = 0;
    // Poll briefly (yielding the core) before sleeping: the next bucket often completes within
    // microseconds, and a condition-variable wake-up costs tens of them.
    const auto spin_until = Clock::now() + std::chrono::microseconds(200);
    while (pending_.load(std::memory_order_acquire) == 0 && Clock::now() < spin_until) {
      std::this_thread::yield();
    }
    {
      std::unique_lock lock(mu_);
      const auto task_due = [&] { return !tasks_.empty() && tasks_.front()->before <= reduced_; };
      cv_.wait(lock, [&] {
        return stop_ || task_due() ||
               (error_ == nullptr && reduced_ < num_buckets() && layout_.complete(reduced_));
      });
      if (stop_) return;
      if (task_due()) {
        const auto task = tasks_.front();
        tasks_.pop_front();
        busy_ = true;
        lock.unlock();
        try {
          task->fn();
        } catch (...) {
          task->error = std::current_exception();
        }
        lock.lock();
        task->done = true;
        busy_ = false;
        lock.unlock();
        cv_.notify_all();
        continue;
      }
      b = reduced_;
      pending_.fetch_sub(1, std::memory_order_relaxed);
      busy_ = true;
    }
    try {
      reduce(b, /*blocking=*/true);
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void GradientBucketer::finish() {
  const auto start = Clock::now();
  if (!opts_.overlap) {
    for (std::size_t b = 0; b < num_buckets(); ++b) {
      SINEW_ENFORCE(layout_.complete(b), "bucket {} not complete at finish()", b);
      reduce(b, /*blocking=*/false);
    }
  } else {
    // The last bucket usually completes within a few hundred microseconds of finish(): poll briefly
    // (yielding the core) before sleeping, since a condition-variable wake-up costs tens of microseconds.
    const auto spin_until = Clock::now() + std::chrono::microseconds(500);
    while (!reduced_all_.load(std::memory_order_acquire) && Clock::now() < spin_until)
      std::this_thread::yield();
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, opts_.op.timeout,
                      [&] { return error_ != nullptr || reduced_ == num_buckets(); })) {
      const std::size_t done = reduced_;
      lock.unlock();
      backend_.abort();  // with ULFM the blocked allreduce now returns, here and at the peers
      SINEW_THROW(Timeout,
                  "gradient allreduce did not complete within {} ms ({} of {} buckets done); a peer is dead, "
                  "stopped or far behind",
                  opts_.op.timeout.count(), done, num_buckets());
    }
    if (error_) {
      auto e = std::exchange(error_, nullptr);
      reduced_ = 0;
      reduced_all_.store(false, std::memory_order_relaxed);
      pending_.store(0, std::memory_order_relaxed);
      layout_.rearm();
      lock.unlock();
      std::rethrow_exception(e);
    }
  }
  std::lock_guard lock(mu_);
  last_exposed_ms_ = seconds_since(start) * 1e3;
  last_comm_ms_ = comm_ms_;
  comm_ms_ = 0;
  reduced_ = 0;
  reduced_all_.store(false, std::memory_order_relaxed);
  pending_.store(0, std::memory_order_relaxed);
  layout_.rearm();
}

}  // namespace sinew::comm
