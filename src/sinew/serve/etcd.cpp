#include "sinew/serve/etcd.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/serve/etcd_http.hpp"

namespace sinew::serve {

using namespace etcd_http;  // NOLINT(google-build-using-namespace): the wire's helpers, internal to etcd*.cpp

// ---- Etcd -----------------------------------------------------------------------------------------

Etcd::Etcd(std::string endpoint, std::chrono::milliseconds timeout, const std::atomic<bool>* cancel)
    : endpoint_(endpoint_checked(std::move(endpoint))), timeout_(timeout), cancel_(cancel) {
  if (timeout_.count() <= 0)
    SINEW_THROW(InvalidArgument, "etcd client of {}: the timeout must be positive, got {} ms", endpoint_,
                timeout_.count());
}

std::int64_t Etcd::grant(int ttl_s) {
  if (ttl_s < 1) SINEW_THROW(InvalidArgument, "etcd lease of {} s: the TTL must be at least 1 s", ttl_s);
  constexpr std::string_view path = "/v3/lease/grant";
  const json doc = rpc(endpoint_, timeout_, cancel_, path, {{"TTL", std::to_string(ttl_s)}});
  // LeaseGrantResponse carries its own "error" string besides the gateway's errors.
  const std::int64_t id = decoded(endpoint_, path, doc, [](const json& d) { return integer(d, "ID"); });
  if (id == 0) SINEW_THROW(ServiceError, "etcd at {} granted no lease: '{}'", endpoint_, excerpt(doc.dump()));
  return id;
}

std::int64_t Etcd::try_keep_alive(std::int64_t lease) {
  constexpr std::string_view path = "/v3/lease/keepalive";
  // A stream in gRPC; the gateway answers one request with one line {"result": {...}}. A lease that is
  // gone is no error there: the result just has no TTL (0).
  const json doc = rpc(endpoint_, timeout_, cancel_, path, {{"ID", std::to_string(lease)}});
  return decoded(endpoint_, path, doc, [](const json& d) {
    const json& r = d.contains("result") ? d.at("result") : d;
    return std::max<std::int64_t>(integer(r, "TTL"), 0);
  });
}

std::int64_t Etcd::keep_alive(std::int64_t lease) {
  const std::int64_t ttl = try_keep_alive(lease);
  if (ttl <= 0)
    SINEW_THROW(ServiceError, "lease {:x} is gone from etcd at {} (expired or revoked): grant a new one",
                lease, endpoint_);
  return ttl;
}

void Etcd::revoke(std::int64_t lease) {
  // etcd 3.4 serves this as /v3/lease/revoke and (older name) /v3/kv/lease/revoke.
  rpc(endpoint_, timeout_, cancel_, "/v3/lease/revoke", {{"ID", std::to_string(lease)}},
      /*not_found_ok=*/true);
}

void Etcd::put(const std::string& key, const std::string& value, std::int64_t lease) {
  json body = {{"key", base64(key)}, {"value", base64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  rpc(endpoint_, timeout_, cancel_, "/v3/kv/put", body);
}

std::vector<KeyValue> Etcd::list(const std::string& prefix, std::int64_t* revision) {
  constexpr std::string_view path = "/v3/kv/range";
  const std::string start = prefix.empty() ? std::string(1, '\0') : prefix;
  const json doc = rpc(endpoint_, timeout_, cancel_, path,
                       {{"key", base64(start)}, {"range_end", base64(prefix_end(prefix))}});
  return decoded(endpoint_, path, doc, [&](const json& d) {
    std::vector<KeyValue> out;
    if (d.contains("kvs"))
      for (const json& kv : d.at("kvs")) out.push_back(key_value(kv));
    // etcd returns keys in byte order already; sorting makes it a property of this function.
    std::sort(out.begin(), out.end(), [](const KeyValue& a, const KeyValue& b) { return a.key < b.key; });
    if (revision != nullptr) *revision = integer(d.at("header"), "revision");
    return out;
  });
}

std::optional<std::string> Etcd::get(const std::string& key) {
  constexpr std::string_view path = "/v3/kv/range";
  const json doc = rpc(endpoint_, timeout_, cancel_, path, {{"key", base64(key)}});
  return decoded(endpoint_, path, doc, [&](const json& d) -> std::optional<std::string> {
    if (!d.contains("kvs") || d.at("kvs").empty()) return std::nullopt;
    return key_value(d.at("kvs").at(0)).value;
  });
}

void Etcd::erase(const std::string& key) {
  rpc(endpoint_, timeout_, cancel_, "/v3/kv/deleterange", {{"key", base64(key)}});
}

bool Etcd::healthy() noexcept {
  try {
    const Reply r = request(endpoint_, timeout_, cancel_, "/health", nullptr);
    if (r.status != 200) return false;
    const json doc = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    return doc.is_object() && doc.contains("health") && doc["health"] == "true";
  } catch (...) {
    return false;
  }
}

// ---- Registration ---------------------------------------------------------------------------------

struct Registration::State {
  State(std::string endpoint, std::string k, std::string v, int ttl)
      : key(std::move(k)),
        ttl_s(ttl),
        period(std::int64_t{ttl} * 1000 / 3),
        // A refresh must end well before the lease does; a slow one is retried.
        etcd(std::move(endpoint),
             std::clamp(milliseconds(std::int64_t{ttl} * 1000 / 2), milliseconds(500), milliseconds(2000)),
             &stop),
        value(std::move(v)) {}

  const std::string key;
  const int ttl_s;
  const milliseconds period;
  std::atomic<bool> stop{false};
  Etcd etcd;
  std::mutex mu;
  std::condition_variable cv;
  std::string value;   // guarded by mu
  bool dirty = false;  // guarded by mu: value changed since the last put
  std::atomic<bool> alive{false};
  std::atomic<std::int64_t> lease{0};
  std::thread worker;

  /// Grants a lease and puts the current value under it.
  void register_now() {
    const std::int64_t id = etcd.grant(ttl_s);
    lease = id;
    std::string v;
    {
      const std::lock_guard lock(mu);
      v = value;
      dirty = false;
    }
    try {
      etcd.put(key, v, id);
    } catch (...) {
      const std::lock_guard lock(mu);
      dirty = true;
      throw;
    }
  }

  void run() {
    auto next_refresh = Clock::now() + period;
    const milliseconds retry = std::min(period, milliseconds(500));
    bool failing = false;  // since the last success: then a changed value waits for the retry too
    std::unique_lock lock(mu);
    while (true) {
      cv.wait_until(lock, next_refresh,
                    [&] { return stop.load() || (dirty && !failing) || Clock::now() >= next_refresh; });
      if (stop) return;
      const bool due = Clock::now() >= next_refresh;
      lock.unlock();
      try {
        if (due) {
          next_refresh = Clock::now() + period;
          if (lease == 0 || etcd.try_keep_alive(lease) == 0) {
            const std::int64_t old = lease;
            register_now();
            spdlog::warn(
                "registry: {} at {} lost its lease {:x} (etcd restarted, or a pause longer than {} s); "
                "registered again under lease {:x}",
                key, etcd.endpoint(), old, ttl_s, lease.load());
          }
        }
        std::string v;
        bool put = false;
        {
          const std::lock_guard guard(mu);
          if (dirty) {
            v = value;
            dirty = false;
            put = true;
          }
        }
        if (put) {
          try {
            etcd.put(key, v, lease);
          } catch (...) {
            const std::lock_guard guard(mu);
            dirty = true;
            throw;
          }
        }
        if (failing) spdlog::info("registry: {} refreshed at {} again", key, etcd.endpoint());
        alive = true;
        failing = false;
      } catch (const std::exception& e) {
        if (stop) return;
        alive = false;
        if (!failing) spdlog::warn("registry: cannot refresh {} ({}); retrying", key, message_of(e));
        failing = true;
        // The next attempt checks the lease first: a failed put may mean that it is gone.
        next_refresh = Clock::now() + retry;
      }
      lock.lock();
    }
  }
};

Registration::Registration(std::string endpoint, std::string key, std::string value, int ttl_s) {
  if (ttl_s < 1)
    SINEW_THROW(InvalidArgument, "registration of {}: the TTL must be at least 1 s, got {}", key, ttl_s);
  state_ = std::make_unique<State>(std::move(endpoint), std::move(key), std::move(value), ttl_s);
  state_->register_now();
  state_->alive = true;
  state_->worker = std::thread([s = state_.get()] { s->run(); });
}

Registration::~Registration() {
  {
    const std::lock_guard lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->worker.join();  // prompt: a call in flight is cancelled by `stop`
  if (const std::int64_t lease = state_->lease; lease != 0) {
    try {
      Etcd(state_->etcd.endpoint(), milliseconds(1000)).revoke(lease);
    } catch (const std::exception& e) {  // the key expires with its lease anyway
      spdlog::debug("registry: revoking the lease of {}: {}", state_->key, e.what());
    }
  }
}

void Registration::update(std::string value) {
  {
    const std::lock_guard lock(state_->mu);
    if (state_->value == value) return;
    state_->value = std::move(value);
    state_->dirty = true;
  }
  state_->cv.notify_all();
}

bool Registration::alive() const noexcept { return state_->alive; }
const std::string& Registration::key() const noexcept { return state_->key; }
std::int64_t Registration::lease() const noexcept { return state_->lease; }

}  // namespace sinew::serve
