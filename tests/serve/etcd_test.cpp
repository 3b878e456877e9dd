// The etcd client (src/sinew/serve/etcd.*) against a real etcd: the one whose endpoint is in SINEW_ETCD
// (tests/serve/with_etcd.sh starts a private one; ctest serve.etcd). Without it, the tests that need etcd
// are skipped. Every wait is a poll with a deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/serve/etcd.hpp"

namespace sinew::serve {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string etcd_endpoint() {
  const char* e = std::getenv("SINEW_ETCD");  // NOLINT(concurrency-mt-unsafe)
  return e != nullptr ? e : "";
}

#define NEED_ETCD()                                                                              \
  do {                                                                                           \
    if (etcd_endpoint().empty()) GTEST_SKIP() << "SINEW_ETCD is not set (with_etcd.sh sets it)"; \
  } while (false)

/// A key prefix of its own for each test (and each run: etcd may outlive a test binary).
std::string fresh_prefix() {
  static std::atomic<int> n{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "/sinew-test/" + std::to_string(::getpid()) + "-" + std::to_string(n++) + "/" + info->name() + "/";
}

/// Polls `ok` every 20 ms until it holds or `limit` passed; whether it held.
bool eventually(const std::function<bool()>& ok, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (true) {
    if (ok()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> keys_of(const std::vector<KeyValue>& list) {
  std::vector<std::string> out;
  out.reserve(list.size());
  for (const KeyValue& kv : list) out.push_back(kv.key);
  return out;
}

/// A port of 127.0.0.1 on which nothing listens (bound, then closed).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// A server that accepts connections (the kernel does, from the backlog) and never answers.
class Silent {
 public:
  Silent() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
  }
  Silent(const Silent&) = delete;
  Silent& operator=(const Silent&) = delete;
  ~Silent() { ::close(fd_); }
  [[nodiscard]] std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  int port_ = 0;
};

/// Records what a PrefixWatch reports.
struct Seen {
  std::mutex mu;
  std::vector<std::vector<KeyValue>> calls;
  void operator()(const std::vector<KeyValue>& list) {
    const std::lock_guard lock(mu);
    calls.push_back(list);
  }
  std::vector<std::string> last_keys() {
    const std::lock_guard lock(mu);
    return calls.empty() ? std::vector<std::string>{} : keys_of(calls.back());
  }
  std::size_t count() {
    const std::lock_guard lock(mu);
    return calls.size();
  }
};

// ---- the client -----------------------------------------------------------------------------------

TEST(EtcdClient, BadUrlIsInvalidArgument) {
  for (const char* bad :
       {"", "127.0.0.1:2379", "ftp://127.0.0.1:2379", "http://", "http://:2379", "http://127.0.0.1:99999",
        "http://127.0.0.1:", "http://127.0.0.1:2379/v3", "http://127.0.0.1:x", "http://[::1"}) {
    EXPECT_THROW(Etcd{bad}, InvalidArgument) << bad;
  }
  EXPECT_EQ(Etcd("http://127.0.0.1:2379/").endpoint(), "http://127.0.0.1:2379");
  EXPECT_EQ(Etcd("https://etcd.example:2379").endpoint(), "https://etcd.example:2379");
  EXPECT_EQ(Etcd("http://[::1]:2379").endpoint(), "http://[::1]:2379");
  EXPECT_THROW(Etcd("http://127.0.0.1:2379", milliseconds(0)), InvalidArgument);
  // Registration and PrefixWatch check theirs too, before any thread starts.
  EXPECT_THROW(Registration("nope", "k", "v", 2), InvalidArgument);
  EXPECT_THROW(PrefixWatch("nope", "p/", [](const std::vector<KeyValue>&) {}), InvalidArgument);
}

TEST(EtcdClient, WrongEndpointGivesServiceErrorNamingIt) {
  const std::string ep = "http://127.0.0.1:" + std::to_string(closed_port());
  Etcd etcd(ep);
  const auto t0 = Clock::now();
  try {
    etcd.put("k", "v");
    FAIL() << "put to " << ep << " did not throw";
  } catch (const ServiceError& e) {
    EXPECT_NE(e.message().find(ep), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("unreachable"), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), ExitCode::kService);
  }
  EXPECT_THROW(etcd.list("p/"), ServiceError);
  EXPECT_THROW(etcd.grant(2), ServiceError);
  EXPECT_FALSE(etcd.healthy());
  EXPECT_LT(seconds_since(t0), 2.0);  // refused at once, no retries
  EXPECT_THROW(Registration(ep, "k", "v", 2), ServiceError);
}

TEST(EtcdClient, SilentServerTimesOut) {
  const Silent server;
  Etcd etcd(server.endpoint(), milliseconds(300));
  const auto t0 = Clock::now();
  try {
    etcd.put("k", "v");
    FAIL() << "no timeout";
  } catch (const ServiceError& e) {
    EXPECT_NE(e.message().find(server.endpoint()), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("did not answer"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 1.5);
  EXPECT_FALSE(etcd.healthy());
}

TEST(EtcdClient, CancelStopsACallInFlight) {
  const Silent server;
  std::atomic<bool> cancel{false};
  Etcd etcd(server.endpoint(), seconds(30), &cancel);
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(200));
    cancel = true;
  });
  const auto t0 = Clock::now();
  EXPECT_THROW(etcd.get("k"), ServiceError);
  EXPECT_LT(seconds_since(t0), 2.0);
  canceller.join();
}

TEST(EtcdClient, WatchOfSilentOrDeadEtcdStopsPromptly) {
  const Silent silent;
  for (const std::string& ep : {silent.endpoint(), "http://127.0.0.1:" + std::to_string(closed_port())}) {
    Seen seen;
    auto w = std::make_unique<PrefixWatch>(ep, "p/", std::ref(seen));
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_TRUE(w->snapshot().empty());
    EXPECT_FALSE(w->connected());
    EXPECT_EQ(seen.count(), 0U);
    const auto t0 = Clock::now();
    w.reset();
    EXPECT_LT(seconds_since(t0), 1.5) << ep;
  }
}

TEST(EtcdClient, Healthy) {
  NEED_ETCD();
  EXPECT_TRUE(Etcd(etcd_endpoint()).healthy());
}

// ---- keys -----------------------------------------------------------------------------------------

TEST(EtcdKv, PutGetListErase) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string p = fresh_prefix();
  EXPECT_EQ(etcd.get(p + "a"), std::nullopt);
  etcd.put(p + "b", "2");
  etcd.put(p + "a", "1");
  etcd.put(p + "c/d", "3");
  etcd.put(p.substr(0, p.size() - 1) + "x", "outside");  // shares all but the last byte of the prefix
  etcd.put(p + "a", "1 again");
  EXPECT_EQ(etcd.get(p + "a"), "1 again");
  EXPECT_EQ(etcd.get(p + "c/d"), "3");

  std::int64_t rev = 0;
  const auto list = etcd.list(p, &rev);
  ASSERT_EQ(keys_of(list), (std::vector<std::string>{p + "a", p + "b", p + "c/d"}));
  EXPECT_EQ(list[0].value, "1 again");
  EXPECT_EQ(list[1].value, "2");
  EXPECT_EQ(list[0].lease, 0);
  EXPECT_GT(list[0].mod_revision, list[1].mod_revision);  // put last
  EXPECT_GE(rev, list[0].mod_revision);

  etcd.erase(p + "a");
  etcd.erase(p + "a");  // no error
  EXPECT_EQ(etcd.get(p + "a"), std::nullopt);
  std::int64_t rev2 = 0;
  EXPECT_EQ(keys_of(etcd.list(p, &rev2)), (std::vector<std::string>{p + "b", p + "c/d"}));
  EXPECT_GT(rev2, rev);
  etcd.erase(p + "b");
  etcd.erase(p + "c/d");
  EXPECT_TRUE(etcd.list(p).empty());
  EXPECT_EQ(etcd.get(p.substr(0, p.size() - 1) + "x"), "outside");
  etcd.erase(p.substr(0, p.size() - 1) + "x");
}

TEST(EtcdKv, BinaryKeysAndValuesRoundTrip) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string p = fresh_prefix();
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  // Lengths 0..4 cover every padding of base64; an empty value is a field the gateway omits.
  const std::vector<std::string> values = {"",    std::string(1, '\0'), "\xff\xfe",
                                           "abc", "\x01\x02\x03\x04",   all};
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::string key = p + std::string(1, '\0') + "\xff" + std::to_string(i);
    etcd.put(key, values[i]);
    const auto got = etcd.get(key);
    ASSERT_TRUE(got.has_value()) << i;
    EXPECT_EQ(*got, values[i]) << i;
  }
  const auto list = etcd.list(p);
  ASSERT_EQ(list.size(), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(list[i].value, values[i]) << i;
  for (const KeyValue& kv : list) etcd.erase(kv.key);
  EXPECT_TRUE(etcd.list(p).empty());
}

TEST(EtcdKv, PrefixEndingInFFBytes) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string p = fresh_prefix();
  const std::string q = p + "\xff\xff";  // the range end increments the byte before the 0xff run
  etcd.put(q + "1", "in");
  etcd.put(q, "in too");
  etcd.put(p + "\xfe", "out");
  etcd.put(p + "\xff\xfe", "out");
  EXPECT_EQ(keys_of(etcd.list(q)), (std::vector<std::string>{q, q + "1"}));
  for (const KeyValue& kv : etcd.list(p)) etcd.erase(kv.key);
}

TEST(EtcdKv, ResponseSizeIsCapped) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint(), seconds(10));
  const std::string p = fresh_prefix();
  const std::string value(std::size_t{1} << 20, 'x');                   // etcd takes requests up to 1.5 MiB
  const std::size_t n = Etcd::kMaxResponse / value.size() * 3 / 4 + 1;  // > 16 MiB once in base64
  for (std::size_t i = 0; i < n; ++i) etcd.put(p + std::to_string(i), value);
  try {
    (void)etcd.list(p);
    ADD_FAILURE() << "a listing of " << n << " MiB was not refused";
  } catch (const ServiceError& e) {
    EXPECT_NE(e.message().find("exceeds 16 MiB"), std::string::npos) << e.what();
  }
  EXPECT_EQ(etcd.get(p + "0")->size(), value.size());  // one key is fine
  for (std::size_t i = 0; i < n; ++i) etcd.erase(p + std::to_string(i));
}

// ---- leases ---------------------------------------------------------------------------------------

TEST(EtcdLease, KeyDisappearsWhenKeepAliveStops) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string key = fresh_prefix() + "k";
  const std::int64_t lease = etcd.grant(2);
  ASSERT_NE(lease, 0);
  etcd.put(key, "v", lease);
  EXPECT_EQ(etcd.list(key).at(0).lease, lease);
  // Refreshed, the key outlives its TTL.
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(milliseconds(600));
    const std::int64_t ttl = etcd.keep_alive(lease);
    EXPECT_GE(ttl, 1);
    EXPECT_LE(ttl, 2);
  }
  EXPECT_EQ(etcd.get(key), "v");
  // Not refreshed, it goes (measured ~2.2 s).
  const auto t0 = Clock::now();
  EXPECT_TRUE(eventually([&] { return !etcd.get(key).has_value(); }, seconds(4)));
  EXPECT_GT(seconds_since(t0), 1.0);
  EXPECT_EQ(etcd.try_keep_alive(lease), 0);
  try {
    etcd.keep_alive(lease);
    ADD_FAILURE() << "keep_alive of an expired lease did not throw";
  } catch (const ServiceError& e) {
    EXPECT_NE(e.message().find("gone"), std::string::npos) << e.what();
  }
  EXPECT_THROW(etcd.put(key, "v", lease), ServiceError);
  EXPECT_NO_THROW(etcd.revoke(lease));  // already gone: no error
}

TEST(EtcdLease, RevokeDeletesItsKeysAtOnce) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string p = fresh_prefix();
  const std::int64_t lease = etcd.grant(30);
  etcd.put(p + "1", "a", lease);
  etcd.put(p + "2", "b", lease);
  etcd.put(p + "3", "c");
  EXPECT_EQ(etcd.list(p).size(), 3U);
  etcd.revoke(lease);
  EXPECT_EQ(keys_of(etcd.list(p)), std::vector<std::string>{p + "3"});
  EXPECT_EQ(etcd.try_keep_alive(lease), 0);
  etcd.erase(p + "3");
  EXPECT_THROW(etcd.grant(0), InvalidArgument);
}

// ---- Registration ---------------------------------------------------------------------------------

TEST(EtcdRegistration, KeyLivesPastItsTtlFollowsUpdatesAndGoesAtOnce) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string key = fresh_prefix() + "teacher-0";
  auto reg = std::make_unique<Registration>(etcd_endpoint(), key, "v1", 2);
  EXPECT_EQ(reg->key(), key);
  EXPECT_EQ(etcd.get(key), "v1");  // registered when the constructor returns
  EXPECT_TRUE(reg->alive());
  const std::int64_t lease = reg->lease();
  EXPECT_EQ(etcd.list(key).at(0).lease, lease);
  std::this_thread::sleep_for(milliseconds(3000));  // > TTL: refreshed
  EXPECT_EQ(etcd.get(key), "v1");
  EXPECT_TRUE(reg->alive());
  EXPECT_EQ(reg->lease(), lease);

  reg->update("v2");
  EXPECT_TRUE(eventually([&] { return etcd.get(key) == "v2"; }, milliseconds(1000)));
  EXPECT_EQ(etcd.list(key).at(0).lease, lease);

  const auto t0 = Clock::now();
  reg.reset();
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_EQ(etcd.get(key), std::nullopt);  // revoked, not left to expire
  EXPECT_EQ(etcd.try_keep_alive(lease), 0);
}

TEST(EtcdRegistration, RegistersAgainWhenItsLeaseIsLost) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string key = fresh_prefix() + "teacher-0";
  Registration reg(etcd_endpoint(), key, "v", 2);
  const std::int64_t lease = reg.lease();
  etcd.revoke(lease);  // as if etcd had lost it
  EXPECT_EQ(etcd.get(key), std::nullopt);
  // Noticed at the next refresh (every 2/3 s).
  EXPECT_TRUE(eventually([&] { return etcd.get(key) == "v"; }, seconds(2)));
  EXPECT_NE(reg.lease(), lease);
  EXPECT_EQ(etcd.list(key).at(0).lease, reg.lease());
  EXPECT_TRUE(eventually([&] { return reg.alive(); }, seconds(1)));
}

// ---- PrefixWatch ----------------------------------------------------------------------------------

TEST(EtcdWatch, SeesNewChangedAndDeletedKeys) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string p = fresh_prefix();
  etcd.put(p + "a", "1");
  Seen seen;
  auto w = std::make_unique<PrefixWatch>(etcd_endpoint(), p, std::ref(seen));
  // The initial listing.
  ASSERT_TRUE(eventually([&] { return seen.count() >= 1; }, seconds(2)));
  EXPECT_EQ(seen.last_keys(), std::vector<std::string>{p + "a"});
  EXPECT_EQ(keys_of(w->snapshot()), std::vector<std::string>{p + "a"});
  ASSERT_TRUE(eventually([&] { return w->connected(); }, seconds(2)));

  etcd.put(p + "b", "2");
  etcd.put(p.substr(0, p.size() - 1) + "z", "outside");
  EXPECT_TRUE(eventually(
      [&] {
        return seen.last_keys() == std::vector<std::string>{p + "a", p + "b"};
      },
      seconds(2)));
  etcd.put(p + "a", "1'");
  EXPECT_TRUE(
      eventually([&] { return !w->snapshot().empty() && w->snapshot()[0].value == "1'"; }, seconds(2)));
  etcd.erase(p + "a");
  EXPECT_TRUE(eventually([&] { return seen.last_keys() == std::vector<std::string>{p + "b"}; }, seconds(2)));
  EXPECT_EQ(w->snapshot().at(0).value, "2");
  {  // a registration's key comes and goes with it
    Registration reg(etcd_endpoint(), p + "c", "3", 2);
    EXPECT_TRUE(eventually([&] { return keys_of(w->snapshot()).size() == 2; }, seconds(2)));
    EXPECT_EQ(w->snapshot().at(1).lease, reg.lease());
  }
  EXPECT_TRUE(
      eventually([&] { return keys_of(w->snapshot()) == std::vector<std::string>{p + "b"}; }, seconds(2)));
  // Every call had the complete list: never the outside key.
  {
    const std::lock_guard lock(seen.mu);
    for (const auto& call : seen.calls)
      for (const KeyValue& kv : call) EXPECT_EQ(kv.key.rfind(p, 0), 0U) << kv.key;
  }
  const auto t0 = Clock::now();
  w.reset();
  EXPECT_LT(seconds_since(t0), 1.5);
  etcd.erase(p + "b");
  etcd.erase(p.substr(0, p.size() - 1) + "z");
}

TEST(EtcdWatch, NoEventLostBetweenListingAndWatch) {
  NEED_ETCD();
  Etcd etcd(etcd_endpoint());
  const std::string p = fresh_prefix();
  Seen seen;
  PrefixWatch w(etcd_endpoint(), p, std::ref(seen));
  // Puts race the listing and the start of the stream.
  std::vector<std::string> want;
  for (int i = 0; i < 50; ++i) {
    const std::string key = p + (i < 10 ? "0" : "") + std::to_string(i);
    etcd.put(key, "v");
    want.push_back(key);
  }
  EXPECT_TRUE(eventually([&] { return keys_of(w.snapshot()) == want; }, seconds(2)));
  for (const std::string& k : want) etcd.erase(k);
  EXPECT_TRUE(eventually([&] { return w.snapshot().empty(); }, seconds(2)));
}

// ---- etcd restarted -------------------------------------------------------------------------------

/// Runs hpc/etcd/etcd.sh on the test's etcd (SINEW_ETCD_DIR, from with_etcd.sh).
int etcd_sh(const std::string& args) {
  const std::string cmd = "bash " SINEW_SOURCE_DIR "/hpc/etcd/etcd.sh " + args + " >/dev/null";
  return std::system(cmd.c_str());  // NOLINT(concurrency-mt-unsafe)
}

TEST(EtcdRestart, RegistrationAndWatchSurviveAnEtcdThatLostItsData) {
  NEED_ETCD();
  const char* dir = std::getenv("SINEW_ETCD_DIR");  // NOLINT(concurrency-mt-unsafe)
  if (dir == nullptr) GTEST_SKIP() << "SINEW_ETCD_DIR is not set (with_etcd.sh sets it)";
  const std::string ep = etcd_endpoint();
  const std::string port = ep.substr(ep.rfind(':') + 1);
  Etcd etcd(ep);
  const std::string p = fresh_prefix();
  Seen seen;
  PrefixWatch w(ep, p, std::ref(seen));
  Registration reg(ep, p + "teacher", "v", 2);
  auto doomed = std::make_unique<Registration>(ep, p + "doomed", "v", 2);
  ASSERT_TRUE(eventually([&] { return w.connected() && w.snapshot().size() == 2; }, seconds(2)));

  // down removes the data: the new etcd knows neither the key nor the lease.
  ASSERT_EQ(etcd_sh(std::string("down --dir ") + dir), 0);
  EXPECT_TRUE(eventually([&] { return !reg.alive(); }, seconds(2)));
  EXPECT_FALSE(w.connected());
  reg.update("v2");  // while etcd is down: put once it is back
  const auto t0 = Clock::now();
  doomed.reset();  // bounded although etcd is gone
  EXPECT_LT(seconds_since(t0), 1.5);
  ASSERT_EQ(etcd_sh(std::string("up --dir ") + dir + " --port " + port), 0);
  ASSERT_TRUE(etcd.healthy());

  // The registration puts its key back under a new lease; the watch lists again and follows.
  EXPECT_TRUE(eventually([&] { return etcd.get(p + "teacher") == "v2"; }, seconds(3)));
  EXPECT_TRUE(eventually([&] { return reg.alive(); }, seconds(1)));
  EXPECT_TRUE(eventually([&] { return w.connected(); }, seconds(3)));
  EXPECT_TRUE(eventually([&] { return keys_of(w.snapshot()) == std::vector<std::string>{p + "teacher"}; },
                         seconds(2)));
  EXPECT_EQ(w.snapshot().at(0).lease, reg.lease());
  etcd.put(p + "after", "x");
  EXPECT_TRUE(eventually([&] { return w.snapshot().size() == 2; }, seconds(2)));
  etcd.erase(p + "after");
}

}  // namespace
}  // namespace sinew::serve
