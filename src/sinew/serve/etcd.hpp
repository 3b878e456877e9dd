// The registry of distillation: a small etcd v3 client over etcd's JSON gateway (HTTP/1.1, libcurl).
//
// Teachers register themselves as keys under a lease (Registration): the key lives while its process
// refreshes the lease and disappears a TTL after the process dies, or at once when it stops cleanly.
// Students watch the prefix (PrefixWatch) and always see the complete, current set of teachers.
//
// Wire format (etcd 3.4's gateway, /v3/...): keys and values are base64 in JSON, 64-bit integers are
// strings, fields with default values are omitted (a missing number is 0). Every call is bounded by a
// timeout; every failure is a ServiceError that names the endpoint and says what to do.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sinew::serve {

/// One key of etcd.
struct KeyValue {
  std::string key, value;
  std::int64_t lease = 0;         ///< the lease the key is attached to, 0 for none
  std::int64_t mod_revision = 0;  ///< the store revision of the key's last change
  bool operator==(const KeyValue&) const = default;
};

/// A client of one etcd endpoint. Thread-safe: every call uses its own connection (a CURL handle).
class Etcd {
 public:
  static constexpr std::size_t kMaxResponse = std::size_t{16} << 20;  ///< a larger answer is an error

  /// `endpoint`: "http://HOST:PORT" (or https); a trailing '/' is dropped. Throws InvalidArgument for
  /// anything else. Every call gives up after `timeout` (ServiceError). When `cancel` is given, calls
  /// also give up (ServiceError) soon after *cancel becomes true: how a background thread that uses the
  /// client is stopped promptly. *cancel must outlive the client.
  explicit Etcd(std::string endpoint, std::chrono::milliseconds timeout = std::chrono::seconds(2),
                const std::atomic<bool>* cancel = nullptr);

  [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// A new lease of `ttl_s` seconds (>= 1); its id.
  std::int64_t grant(int ttl_s);
  /// Refreshes the lease; the seconds it has left. Throws ServiceError when it is gone (expired, revoked).
  std::int64_t keep_alive(std::int64_t lease);
  /// keep_alive() that returns 0 when the lease is gone instead of throwing (it still throws when etcd
  /// cannot be used).
  std::int64_t try_keep_alive(std::int64_t lease);
  /// Ends the lease and deletes its keys. A lease that is already gone is not an error.
  void revoke(std::int64_t lease);
  /// Sets key = value, attached to `lease` when non-zero (ServiceError if that lease is gone).
  void put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  /// All keys that start with `prefix` (every key if it is empty), sorted by key; `*revision` (if given):
  /// the store revision the listing shows, from which a watch continues at revision + 1.
  std::vector<KeyValue> list(const std::string& prefix, std::int64_t* revision = nullptr);
  /// The value of `key`, nullopt if there is none.
  std::optional<std::string> get(const std::string& key);
  /// Deletes `key`; no error when it does not exist.
  void erase(const std::string& key);
  /// GET /health: whether etcd answers and reports itself healthy. Never throws.
  bool healthy() noexcept;

 private:
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  const std::atomic<bool>* cancel_;
};

/// Keeps key = value registered under a lease of ttl_s seconds: grants the lease and puts the key (in
/// the constructor, which throws ServiceError when it cannot), then a background thread refreshes the
/// lease every ttl_s/3 and puts the value again promptly when update() changed it. If the lease was lost
/// (etcd restarted without its data, a pause longer than the TTL), it registers again under a new lease
/// and logs a warning. The destructor revokes the lease (the key disappears at once) and joins the
/// thread; it takes at most about a second when etcd is gone.
class Registration {
 public:
  Registration(std::string endpoint, std::string key, std::string value, int ttl_s);
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration();

  /// The value to publish from now on.
  void update(std::string value);
  /// Whether the last refresh (or put) succeeded.
  [[nodiscard]] bool alive() const noexcept;
  [[nodiscard]] const std::string& key() const noexcept;
  /// The current lease (changes when it registers again).
  [[nodiscard]] std::int64_t lease() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Watches every key under a prefix. After the initial listing and after each change, it calls
/// on_change with the complete, current list (sorted by key), from its own thread (never two calls at
/// once). Changes come from etcd's watch stream, started at the listing's revision + 1 so that no event
/// is lost. When the stream breaks (etcd restarted, compaction), it reconnects with a backoff of at most
/// 1 s and lists again, calling on_change only if the list changed. The constructor does not wait for
/// etcd. The destructor stops it within about a second.
class PrefixWatch {
 public:
  PrefixWatch(std::string endpoint, std::string prefix,
              std::function<void(const std::vector<KeyValue>&)> on_change);
  PrefixWatch(const PrefixWatch&) = delete;
  PrefixWatch& operator=(const PrefixWatch&) = delete;
  ~PrefixWatch();

  /// The latest list (empty until the first listing succeeded).
  [[nodiscard]] std::vector<KeyValue> snapshot() const;
  /// Whether the watch stream is connected (the list is current).
  [[nodiscard]] bool connected() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace sinew::serve
