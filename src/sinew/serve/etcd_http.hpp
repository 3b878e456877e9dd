// The etcd client's wire (internal to serve/etcd*.cpp): the JSON gateway's encodings (base64 keys, int64 as
// strings), libcurl transfers with deadlines and cancellation, and the gateway's error answers.
#pragma once

#include <curl/curl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "sinew/core/error.hpp"
#include "sinew/serve/etcd.hpp"

namespace sinew::serve::etcd_http {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// An answer of etcd that does not have the expected shape; turned into a ServiceError naming the call.
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

struct Reply {
  long status = 0;
  std::string body;
};

std::string base64(std::string_view in);

std::string unbase64(std::string_view in);

/// A 64-bit integer field of an answer: a string (protobuf's JSON for int64) or a number; 0 when absent
/// (the gateway omits default values).
std::int64_t integer(const json& obj, const char* field);

std::string bytes(const json& obj, const char* field);

KeyValue key_value(const json& kv);

/// The end of the key range of a prefix (etcd's range_end): the prefix with its last byte that is not
/// 0xff incremented; "\0" (every key) for an empty prefix or one of 0xff bytes only.
std::string prefix_end(std::string p);

/// An exception's message, without the [file:line] of an Error.
std::string message_of(const std::exception& e);

/// A short, printable excerpt of an answer, for error messages.
std::string excerpt(std::string_view s);

std::string endpoint_checked(std::string ep);

void curl_init_once();

std::size_t on_data(char* data, std::size_t size, std::size_t n, void* user) noexcept;

/// libcurl calls this about once a second even while nothing arrives: how a blocked call notices a
/// cancellation.
int on_progress(void* user, curl_off_t /*dltotal*/, curl_off_t /*dlnow*/, curl_off_t /*ultotal*/,
                curl_off_t /*ulnow*/) noexcept;

/// Options shared by every transfer. `timeout` 0: none (the watch stream).
void setup(Handle& h, const std::string& url, milliseconds connect_timeout, milliseconds timeout, Sink& sink,
           std::array<char, CURL_ERROR_SIZE>& error);

void set_body(Handle& h, const std::string& body);

[[noreturn]] void transfer_failed(const std::string& endpoint, std::string_view path, Handle& h, CURLcode rc,
                                  const std::array<char, CURL_ERROR_SIZE>& error, const Sink& sink,
                                  milliseconds timeout);

/// One bounded request: POST `body` (JSON) to endpoint + path, or GET when `body` is null.
Reply request(const std::string& endpoint, milliseconds timeout, const std::atomic<bool>* cancel,
              std::string_view path, const std::string* body);

/// The gRPC status code (3 InvalidArgument, 5 NotFound, ...) and message of an error answer:
/// {"error": "...", "message": "...", "code": N}, or {"error": {...}} on a stream.
std::pair<int, std::string> error_of(const json& doc);

/// The JSON answer of an RPC of the gateway. Throws ServiceError for a transport failure, an error answer
/// (unless `not_found_ok` and the error is NotFound: then null is returned) or an unreadable one.
json rpc(const std::string& endpoint, milliseconds timeout, const std::atomic<bool>* cancel,
         std::string_view path, const json& body, bool not_found_ok = false);

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

}  // namespace sinew::serve::etcd_http
