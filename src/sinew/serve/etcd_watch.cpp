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

// ---- PrefixWatch ----------------------------------------------------------------------------------

struct PrefixWatch::State {
  State(std::string endpoint, std::string p, std::function<void(const std::vector<KeyValue>&)> f)
      : prefix(std::move(p)), on_change(std::move(f)), etcd(std::move(endpoint), milliseconds(2000), &stop) {}

  const std::string prefix;
  const std::function<void(const std::vector<KeyValue>&)> on_change;
  std::atomic<bool> stop{false};
  Etcd etcd;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<KeyValue> list;  // guarded by mu
  bool listed = false;         // guarded by mu
  std::atomic<bool> connected{false};
  std::thread worker;

  // The watch thread's own.
  std::map<std::string, KeyValue> keys;
  std::string pending;  // a partial line of the stream
  std::string failure;  // why the stream ended, when it did on its own
  std::int64_t listed_revision = 0;

  /// Publishes `keys` as the list; calls on_change if it differs from the last one (or is the first).
  void publish(bool always) {
    std::vector<KeyValue> now;
    now.reserve(keys.size());
    for (const auto& [k, kv] : keys) now.push_back(kv);  // std::map: sorted by key
    {
      const std::lock_guard lock(mu);
      if (listed && !always && now == list) return;
      list = now;
      listed = true;
    }
    try {
      on_change(now);
    } catch (const std::exception& e) {
      spdlog::error("registry: the watcher of {} on {} threw: {}", prefix, etcd.endpoint(), e.what());
    }
  }

  /// One line of the watch stream; false ends the stream (`failure` says why).
  bool line(std::string_view text) {
    const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      failure = fmt::format("unreadable watch answer '{}'", excerpt(text));
      return false;
    }
    if (doc.contains("error")) {
      failure = fmt::format("watch refused: {}", error_of(doc).second);
      return false;
    }
    try {
      const json& r = doc.at("result");
      if (r.value("canceled", false)) {  // e.g. compacted past our revision: list again
        failure =
            fmt::format("watch cancelled by etcd (compact revision {}, {})", integer(r, "compact_revision"),
                        r.value("cancel_reason", std::string("no reason given")));
        return false;
      }
      if (r.value("created", false)) {
        // An etcd that restarted without its data between our listing and this watch counts from 1
        // again: the watch would wait for a revision far ahead and miss everything before it.
        if (const std::int64_t now = integer(r.at("header"), "revision"); now < listed_revision) {
          failure = fmt::format("the store's revision went back from {} to {} (etcd lost its data)",
                                listed_revision, now);
          return false;
        }
        connected = true;
      }
      if (!r.contains("events") || r.at("events").empty()) return true;
      for (const json& ev : r.at("events")) {
        KeyValue kv = key_value(ev.at("kv"));
        if (ev.value("type", std::string("PUT")) == "DELETE")
          keys.erase(kv.key);
        else
          keys[kv.key] = std::move(kv);
      }
    } catch (const std::exception& e) {  // Malformed, json::exception
      failure = fmt::format("unexpected watch answer ({}): '{}'", e.what(), excerpt(text));
      return false;
    }
    publish(/*always=*/true);
    return true;
  }

  bool data(std::string_view chunk) {
    pending.append(chunk);
    std::size_t at = 0;
    for (std::size_t nl; (nl = pending.find('\n', at)) != std::string::npos; at = nl + 1) {
      if (nl > at && !line(std::string_view(pending).substr(at, nl - at))) return false;
    }
    pending.erase(0, at);
    if (pending.size() > Etcd::kMaxResponse) {
      failure = fmt::format("a watch message exceeds {} MiB", Etcd::kMaxResponse >> 20U);
      return false;
    }
    return true;
  }

  /// Streams the changes after `revision` until the stream ends or `stop`. Throws ServiceError.
  void watch(std::int64_t revision) {
    curl_init_once();
    Handle h;
    Sink sink;
    sink.cancel = &stop;
    sink.stream = [this](std::string_view chunk) { return data(chunk); };
    std::array<char, CURL_ERROR_SIZE> error{};
    constexpr std::string_view path = "/v3/watch";
    setup(h, etcd.endpoint() + std::string(path), etcd.timeout(), milliseconds(0), sink, error);
    // The stream is idle while nothing changes: TCP keep-alive notices a peer that vanished.
    curl_easy_setopt(h.get(), CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h.get(), CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(h.get(), CURLOPT_TCP_KEEPINTVL, 5L);
    const std::string body = json{{"create_request",
                                   {{"key", base64(prefix.empty() ? std::string(1, '\0') : prefix)},
                                    {"range_end", base64(prefix_end(prefix))},
                                    {"start_revision", std::to_string(revision + 1)}}}}
                                 .dump();
    set_body(h, body);
    pending.clear();
    failure.clear();
    listed_revision = revision;
    const CURLcode rc = curl_easy_perform(h.get());
    connected = false;
    if (!failure.empty())
      SINEW_THROW(ServiceError, "etcd at {}: watch of '{}': {}", etcd.endpoint(), prefix, failure);
    if (rc != CURLE_OK) transfer_failed(etcd.endpoint(), path, h, rc, error, sink, etcd.timeout());
    SINEW_THROW(ServiceError, "etcd at {} closed the watch of '{}'", etcd.endpoint(), prefix);
  }

  void run() {
    milliseconds backoff(100);
    bool warned = false;
    while (!stop) {
      try {
        std::int64_t revision = 0;
        const std::vector<KeyValue> now = etcd.list(prefix, &revision);
        keys.clear();
        for (const KeyValue& kv : now) keys.emplace(kv.key, kv);
        publish(/*always=*/false);
        if (warned) spdlog::info("registry: watching {} on {} again", prefix, etcd.endpoint());
        warned = false;
        backoff = milliseconds(100);
        watch(revision);
      } catch (const std::exception& e) {
        if (stop) return;
        if (!warned)
          spdlog::warn("registry: watch of {} interrupted ({}); reconnecting", prefix, message_of(e));
        warned = true;
      }
      std::unique_lock lock(mu);
      cv.wait_for(lock, backoff, [&] { return stop.load(); });
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
  }
};

PrefixWatch::PrefixWatch(std::string endpoint, std::string prefix,
                         std::function<void(const std::vector<KeyValue>&)> on_change)
    : state_(std::make_unique<State>(std::move(endpoint), std::move(prefix), std::move(on_change))) {
  if (!state_->on_change)
    SINEW_THROW(InvalidArgument, "PrefixWatch of '{}' needs a callback", state_->prefix);
  state_->worker = std::thread([s = state_.get()] { s->run(); });
}

PrefixWatch::~PrefixWatch() {
  {
    const std::lock_guard lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->worker.join();  // prompt: the stream and any call in flight are cancelled by `stop`
}

std::vector<KeyValue> PrefixWatch::snapshot() const {
  const std::lock_guard lock(state_->mu);
  return state_->list;
}

bool PrefixWatch::connected() const noexcept { return state_->connected; }

}  // namespace sinew::serve
