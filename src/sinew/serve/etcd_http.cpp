#include "sinew/serve/etcd_http.hpp"

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

namespace sinew::serve::etcd_http {

// ---- encoding -------------------------------------------------------------------------------------

constexpr std::string_view kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

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
         std::string_view path, const json& body, bool not_found_ok) {
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

}  // namespace sinew::serve::etcd_http
