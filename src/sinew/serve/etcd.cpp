#include "sinew/serve/etcd.hpp"

#include <curl/curl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "sinew/core/error.hpp"

namespace sinew::serve {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- encoding -------------------------------------------------------------------------------------

constexpr std::string_view kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// An answer of etcd that does not have the expected shape; turned into a ServiceError naming the call.
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const auto n = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i]) << 16U |
                                              static_cast<unsigned char>(in[i + 1]) << 8U |
                                              static_cast<unsigned char>(in[i + 2]));
    out += kBase64[n >> 18U];
    out += kBase64[(n >> 12U) & 63U];
    out += kBase64[(n >> 6U) & 63U];
    out += kBase64[n & 63U];
  }
  if (i < in.size()) {
    const bool two = i + 1 < in.size();
    const auto n = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i]) << 16U |
                                              (two ? static_cast<unsigned char>(in[i + 1]) << 8U : 0U));
    out += kBase64[n >> 18U];
    out += kBase64[(n >> 12U) & 63U];
    out += two ? kBase64[(n >> 6U) & 63U] : '=';
    out += '=';
  }
  return out;
}

std::string unbase64(std::string_view in) {
  static const std::array<int, 256> table = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    for (std::size_t i = 0; i < kBase64.size(); ++i)
      t[static_cast<unsigned char>(kBase64[i])] = static_cast<int>(i);
    return t;
  }();
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  std::string out;
  out.reserve(in.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    const int v = table[static_cast<unsigned char>(c)];
    if (v < 0) throw Malformed(fmt::format("invalid base64 '{}'", in));
    acc = (acc << 6U) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> static_cast<unsigned>(bits)) & 0xFFU);
    }
  }
  return out;
}

/// A 64-bit integer field of an answer: a string (protobuf's JSON for int64) or a number; 0 when absent
/// (the gateway omits default values).
std::int64_t integer(const json& obj, const char* field) {
  const auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  throw Malformed(fmt::format("field '{}' is not an integer: {}", field, it->dump()));
}

std::string bytes(const json& obj, const char* field) {
  const auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_string()) throw Malformed(fmt::format("field '{}' is not a string: {}", field, it->dump()));
  return unbase64(it->get_ref<const std::string&>());
}

KeyValue key_value(const json& kv) {
  KeyValue out;
  out.key = bytes(kv, "key");
  out.value = bytes(kv, "value");
  out.lease = integer(kv, "lease");
  out.mod_revision = integer(kv, "mod_revision");
  return out;
}

/// The end of the key range of a prefix (etcd's range_end): the prefix with its last byte that is not
/// 0xff incremented; "\0" (every key) for an empty prefix or one of 0xff bytes only.
std::string prefix_end(std::string p) {
  while (!p.empty()) {
    const auto c = static_cast<unsigned char>(p.back());
    if (c < 0xFF) {
      p.back() = static_cast<char>(c + 1);
      return p;
    }
    p.pop_back();
  }
  return std::string(1, '\0');
}

/// An exception's message, without the [file:line] of an Error.
std::string message_of(const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  return err != nullptr ? err->message() : e.what();
}

/// A short, printable excerpt of an answer, for error messages.
std::string excerpt(std::string_view s) {
  std::string out(s.substr(0, 200));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  if (s.size() > 200) out += "...";
  return out;
}

std::string endpoint_checked(std::string ep) {
  const std::string given = ep;
  auto bad = [&](std::string_view why) {
    SINEW_THROW(InvalidArgument,
                "etcd endpoint '{}' {}: expected http://HOST:PORT, e.g. http://127.0.0.1:2379", given, why);
  };
  if (!ep.empty() && ep.back() == '/') ep.pop_back();
  const std::size_t sep = ep.find("://");
  if (sep == std::string::npos) bad("has no scheme");
  const std::string scheme = ep.substr(0, sep);
  if (scheme != "http" && scheme != "https") bad("is not http:// or https://");
  const std::string authority = ep.substr(sep + 3);
  if (authority.empty()) bad("has no host");
  if (authority.find_first_of("/?#@ \t\r\n") != std::string::npos) bad("has a path, query or user name");
  std::string host = authority;
  std::string port;
  if (authority.front() == '[') {  // [IPv6]:PORT
    const std::size_t close = authority.find(']');
    if (close == std::string::npos) bad("has an unclosed '['");
    host = authority.substr(0, close + 1);
    const std::string rest = authority.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') bad("has junk after the IPv6 address");
    if (!rest.empty()) port = rest.substr(1);
  } else if (const std::size_t colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (port.empty()) bad("has an empty port");
  }
  if (host.empty() || host == "[]") bad("has no host");
  if (!port.empty()) {
    int p = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535)
      bad("has an invalid port");
  }
  return ep;
}

// ---- HTTP -----------------------------------------------------------------------------------------

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Not thread-safe in libcurl before 7.84, hence once, before any handle exists.
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      SINEW_THROW(ServiceError,
                  "libcurl could not be initialised (curl_global_init): the etcd client is unusable");
  });
}

/// A CURL easy handle and its header list, freed together.
class Handle {
 public:
  Handle() : curl_(curl_easy_init()) {
    if (curl_ == nullptr) SINEW_THROW(ServiceError, "curl_easy_init failed (out of memory?)");
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&&) = delete;
  Handle& operator=(Handle&&) = delete;
  ~Handle() {
    curl_easy_cleanup(curl_);
    curl_slist_free_all(headers_);
  }
  CURL* get() const noexcept { return curl_; }
  void header(const char* h) {
    curl_slist* l = curl_slist_append(headers_, h);
    if (l == nullptr) SINEW_THROW(ServiceError, "curl_slist_append failed (out of memory?)");
    headers_ = l;
  }
  curl_slist* headers() const noexcept { return headers_; }

 private:
  CURL* curl_;
  curl_slist* headers_ = nullptr;
};

/// What a transfer's callbacks see.
struct Sink {
  std::string body;
  bool overflow = false;
  const std::atomic<bool>* cancel = nullptr;
  /// Streaming (the watch): called with the data instead of appending it to body; returns false to
  /// abort the transfer.
  std::function<bool(std::string_view)> stream;
};

std::size_t on_data(char* data, std::size_t size, std::size_t n, void* user) noexcept {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t len = size * n;
  if (sink->stream) {
    try {
      return sink->stream(std::string_view(data, len)) ? len : 0;
    } catch (...) {  // never through C code
      return 0;
    }
  }
  if (sink->body.size() + len > Etcd::kMaxResponse) {
    sink->overflow = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  sink->body.append(data, len);
  return len;
}

/// libcurl calls this about once a second even while nothing arrives: how a blocked call notices a
/// cancellation.
int on_progress(void* user, curl_off_t /*dltotal*/, curl_off_t /*dlnow*/, curl_off_t /*ultotal*/,
                curl_off_t /*ulnow*/) noexcept {
  const auto* sink = static_cast<const Sink*>(user);
  return sink->cancel != nullptr && sink->cancel->load() ? 1 : 0;
}

/// Options shared by every transfer. `timeout` 0: none (the watch stream).
void setup(Handle& h, const std::string& url, milliseconds connect_timeout, milliseconds timeout, Sink& sink,
           std::array<char, CURL_ERROR_SIZE>& error) {
  CURL* c = h.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  // etcd is reached directly: an http_proxy meant for the internet must not capture 127.0.0.1:2379.
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error.data());
  if (!sink.stream)
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(Etcd::kMaxResponse));
  if (sink.cancel != nullptr) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &sink);
  }
}

void set_body(Handle& h, const std::string& body) {
  h.header("Content-Type: application/json");
  h.header("Expect:");  // no 100-continue round trip
  curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, h.headers());
  curl_easy_setopt(h.get(), CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(h.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
}

[[noreturn]] void transfer_failed(const std::string& endpoint, std::string_view path, Handle& h, CURLcode rc,
                                  const std::array<char, CURL_ERROR_SIZE>& error, const Sink& sink,
                                  milliseconds timeout) {
  long os_errno = 0;
  curl_easy_getinfo(h.get(), CURLINFO_OS_ERRNO, &os_errno);
  std::string why = error[0] != '\0' ? std::string(error.data()) : curl_easy_strerror(rc);
  // "Connection refused" says more than curl's "Failed to connect to 127.0.0.1 port 2379 after 0 ms".
  if (rc == CURLE_COULDNT_CONNECT && os_errno != 0)
    why = std::error_code(os_errno, std::generic_category()).message();
  if (rc == CURLE_ABORTED_BY_CALLBACK && sink.cancel != nullptr && sink.cancel->load())
    SINEW_THROW(ServiceError, "request {} to etcd at {} cancelled: the client is shutting down", path,
                endpoint);
  if (sink.overflow || rc == CURLE_FILESIZE_EXCEEDED)
    SINEW_THROW(
        ServiceError,
        "the answer of etcd at {} to {} exceeds {} MiB: list a narrower prefix, or keep fewer keys under it",
        endpoint, path, Etcd::kMaxResponse >> 20U);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    SINEW_THROW(ServiceError,
                "etcd at {} did not answer {} within {} ms ({}): check that it runs and is not overloaded",
                endpoint, path, timeout.count(), why);
  SINEW_THROW(ServiceError, "etcd at {} unreachable ({}): start it, or pass the right --registry", endpoint,
              why);
}

struct Reply {
  long status = 0;
  std::string body;
};

/// One bounded request: POST `body` (JSON) to endpoint + path, or GET when `body` is null.
Reply request(const std::string& endpoint, milliseconds timeout, const std::atomic<bool>* cancel,
              std::string_view path, const std::string* body) {
  curl_init_once();
  Handle h;
  Sink sink;
  sink.cancel = cancel;
  std::array<char, CURL_ERROR_SIZE> error{};
  setup(h, endpoint + std::string(path), timeout, timeout, sink, error);
  if (body != nullptr) set_body(h, *body);
  const CURLcode rc = curl_easy_perform(h.get());
  if (rc != CURLE_OK) transfer_failed(endpoint, path, h, rc, error, sink, timeout);
  Reply r;
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &r.status);
  r.body = std::move(sink.body);
  return r;
}

/// The gRPC status code (3 InvalidArgument, 5 NotFound, ...) and message of an error answer:
/// {"error": "...", "message": "...", "code": N}, or {"error": {...}} on a stream.
std::pair<int, std::string> error_of(const json& doc) {
  const json& e = doc.contains("error") && doc["error"].is_object() ? doc["error"] : doc;
  std::string msg = e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : "";
  if (msg.empty() && e.contains("error") && e["error"].is_string()) msg = e["error"].get<std::string>();
  const int code = e.contains("code") && e["code"].is_number_integer() ? e["code"].get<int>() : 0;
  return {code, msg};
}

constexpr int kNotFound = 5;  // gRPC status code

/// The JSON answer of an RPC of the gateway. Throws ServiceError for a transport failure, an error answer
/// (unless `not_found_ok` and the error is NotFound: then null is returned) or an unreadable one.
json rpc(const std::string& endpoint, milliseconds timeout, const std::atomic<bool>* cancel,
         std::string_view path, const json& body, bool not_found_ok = false) {
  const std::string text = body.dump();
  const Reply r = request(endpoint, timeout, cancel, path, &text);
  json doc = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    SINEW_THROW(ServiceError,
                "etcd at {} gave an unreadable answer to {} (HTTP {}): '{}': is that endpoint etcd?",
                endpoint, path, r.status, excerpt(r.body));
  if (r.status != 200 || doc.contains("error")) {
    const auto [code, msg] = error_of(doc);
    if (not_found_ok && code == kNotFound) return nullptr;
    SINEW_THROW(ServiceError, "etcd at {} refused {}: {} (HTTP {}, code {})", endpoint, path,
                msg.empty() ? excerpt(r.body) : msg, r.status, code);
  }
  return doc;
}

/// Runs `decode` on an answer; a Malformed or JSON type error becomes a ServiceError naming the call.
template <class F>
auto decoded(const std::string& endpoint, std::string_view path, const json& doc, F&& decode) {
  try {
    return std::forward<F>(decode)(doc);
  } catch (const Malformed& e) {
    SINEW_THROW(ServiceError, "etcd at {} gave an unexpected answer to {}: {}: '{}'", endpoint, path,
                e.what(), excerpt(doc.dump()));
  } catch (const json::exception& e) {
    SINEW_THROW(ServiceError, "etcd at {} gave an unexpected answer to {}: {}: '{}'", endpoint, path,
                e.what(), excerpt(doc.dump()));
  }
}

}  // namespace

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
