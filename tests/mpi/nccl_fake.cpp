#include "nccl_fake.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <random>

#include <fmt/format.h>

namespace sinew::comm::nccl {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kIdMagic = 0x316b66776e6973ULL;  // "sinewfk1": an id made by a FakeApi
constexpr std::uint64_t kSlots = 4;  // operations in flight per rank (collectives) or per pair (messages)
constexpr std::size_t kAlign = 64;
constexpr std::size_t kRandomIdBytes = 16;

constexpr std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/// The start of a segment. Plain integers, accessed through std::atomic_ref: the memory is shared between
/// processes and zero-filled by ftruncate, which is a valid initial state for every field.
struct Header {
  std::int32_t attached;
  std::int32_t left;
  std::int32_t pids[FakeApi::kMaxRanks];
  std::uint64_t done[FakeApi::kMaxRanks];  ///< collectives completed by each rank
};

struct SlotHeader {
  std::uint64_t seq;    ///< operation (collective) or message number + 1 once posted; 0 while empty
  std::uint64_t bytes;  ///< length of the contribution that follows
};

template <class T>
std::atomic_ref<T> at(T& x) {
  return std::atomic_ref<T>(x);
}

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;  // half precision and fp8: not needed by the backend, not faked
  }
}

template <class T>
void combine(void* out, const void* in, std::size_t count, ncclRedOp_t op) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(in);
  for (std::size_t i = 0; i < count; ++i) {
    switch (op) {
      case ncclMax:
        o[i] = std::max(o[i], x[i]);
        break;
      case ncclMin:
        o[i] = std::min(o[i], x[i]);
        break;
      default:
        o[i] = static_cast<T>(o[i] + x[i]);
        break;
    }
  }
}

void combine(void* out, const void* in, std::size_t count, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8:
      return combine<std::int8_t>(out, in, count, op);
    case ncclUint8:
      return combine<std::uint8_t>(out, in, count, op);
    case ncclInt32:
      return combine<std::int32_t>(out, in, count, op);
    case ncclUint32:
      return combine<std::uint32_t>(out, in, count, op);
    case ncclInt64:
      return combine<std::int64_t>(out, in, count, op);
    case ncclUint64:
      return combine<std::uint64_t>(out, in, count, op);
    case ncclFloat32:
      return combine<float>(out, in, count, op);
    case ncclFloat64:
      return combine<double>(out, in, count, op);
    default:
      return;
  }
}

std::string hex(const unsigned char* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += fmt::format("{:02x}", p[i]);
  return s;
}

}  // namespace

struct FakeApi::Comm {
  enum class State : std::uint8_t { kInitializing, kReady, kFinalizing, kFinalized, kAborted, kDestroyed };
  State state = State::kInitializing;
  int rank = 0;
  int nranks = 1;
  std::string name;
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::size_t stride = 0;  // bytes per slot, header included
  std::size_t consumed_at = 0, coll_at = 0, p2p_at = 0;
  ncclResult_t error = ncclSuccess;
  std::uint64_t collectives = 0;     // enqueued so far: the next one's number
  std::vector<std::uint64_t> sent;   // messages enqueued to each peer
  std::vector<std::uint64_t> recvd;  // receives enqueued from each peer
  bool dead_seen = false;
  Clock::time_point dead_since{};
  Clock::time_point last_check{};

  Header& header() const { return *reinterpret_cast<Header*>(base); }
  /// Messages from `src` that `dst` has consumed.
  std::uint64_t& consumed(int src, int dst) const {
    return reinterpret_cast<std::uint64_t*>(base + consumed_at)[src * nranks + dst];
  }
  SlotHeader& coll_slot(int r, std::uint64_t seq) const {
    return *reinterpret_cast<SlotHeader*>(base + coll_at +
                                          (static_cast<std::size_t>(r) * kSlots + seq % kSlots) * stride);
  }
  SlotHeader& p2p_slot(int src, int dst, std::uint64_t m) const {
    const std::size_t pair =
        static_cast<std::size_t>(src) * static_cast<std::size_t>(nranks) + static_cast<std::size_t>(dst);
    return *reinterpret_cast<SlotHeader*>(base + p2p_at + (pair * kSlots + m % kSlots) * stride);
  }
  static std::byte* data(SlotHeader& s) { return reinterpret_cast<std::byte*>(&s) + sizeof(SlotHeader); }
};

struct FakeApi::Op {
  enum class Kind : std::uint8_t {
    kAllReduce,
    kBroadcast,
    kAllGather,
    kReduce,
    kReduceScatter,
    kSend,
    kRecv,
    kWait,
    kMemset,
    kHold
  };
  Kind kind = Kind::kAllReduce;
  Comm* comm = nullptr;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  int root = 0;  // broadcast and reduce root; peer of send/recv; memset value
  std::uint64_t seq = 0;
  bool posted = false;
  int group = 0;  // the NCCL group it was issued in (FakeApi::groups_), 0: none
  Stream* wait_on = nullptr;
  std::uint64_t wait_target = 0;
};

struct FakeApi::Stream {
  std::deque<Op> queue;
  std::uint64_t enqueued = 0;
  std::uint64_t completed = 0;
  bool held = false;
};

struct FakeApi::Event {
  Stream* stream = nullptr;  // null: never recorded (complete, as in CUDA)
  std::uint64_t target = 0;
};

FakeApi::FakeApi(Config config) : config_(config), default_stream_(std::make_unique<Stream>()) {}

FakeApi::~FakeApi() {
  for (auto& c : comms_) {
    if (c->state == Comm::State::kAborted || c->state == Comm::State::kDestroyed) continue;
    shm_unlink(c->name.c_str());  // leaked by the code under test: still counted, but no file is left behind
    munmap(c->base, c->bytes);
  }
}

FakeApi::Comm* FakeApi::comm_of(ncclComm_t comm, const char* call) {
  const auto it = std::find_if(comms_.begin(), comms_.end(),
                               [&](const auto& c) { return reinterpret_cast<ncclComm_t>(c.get()) == comm; });
  if (it == comms_.end()) {
    misuse_.push_back(fmt::format("{} on a communicator the fake never made", call));
    return nullptr;
  }
  Comm& c = **it;
  if (c.state == Comm::State::kAborted || c.state == Comm::State::kDestroyed) {
    misuse_.push_back(fmt::format("{} on a {} communicator", call,
                                  c.state == Comm::State::kAborted ? "aborted" : "destroyed"));
    return nullptr;
  }
  return &c;
}

FakeApi::Stream* FakeApi::stream_of(cudaStream_t stream) {
  if (stream == nullptr) return default_stream_.get();
  const auto it = streams_.find(stream);
  return it == streams_.end() ? nullptr : it->second.get();
}

ncclResult_t FakeApi::get_unique_id(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &kIdMagic, sizeof(kIdMagic));
  std::random_device rd;
  for (std::size_t i = 0; i < kRandomIdBytes; i += sizeof(unsigned)) {
    const unsigned v = rd();
    std::memcpy(id->internal + sizeof(kIdMagic) + i, &v, sizeof(v));
  }
  return ncclSuccess;
}

ncclResult_t FakeApi::comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                            ncclConfig_t* config) {
  std::lock_guard lock(mu_);
  std::uint64_t magic = 0;
  std::memcpy(&magic, id.internal, sizeof(magic));
  if (comm == nullptr || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks ||
      magic != kIdMagic) {
    return ncclInvalidArgument;
  }
  // The backend uses non-blocking communicators only; a blocking one would make the fake block.
  if (config == nullptr || config->blocking != 0) return ncclInvalidUsage;
  auto c = std::make_unique<Comm>();
  c->rank = rank;
  c->nranks = nranks;
  c->name = "/sinew-fake-nccl-" +
            hex(reinterpret_cast<const unsigned char*>(id.internal) + sizeof(kIdMagic), kRandomIdBytes);
  const auto n = static_cast<std::size_t>(nranks);
  c->stride = round_up(sizeof(SlotHeader) + config_.slot_bytes);
  c->consumed_at = round_up(sizeof(Header));
  c->coll_at = c->consumed_at + round_up(n * n * sizeof(std::uint64_t));
  c->p2p_at = c->coll_at + n * kSlots * c->stride;
  c->bytes = c->p2p_at + n * n * kSlots * c->stride;
  // Every member opens (or creates) and sizes the segment alike: no member has to come first.
  const int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  if (ftruncate(fd, static_cast<off_t>(c->bytes)) != 0) {
    close(fd);
    return ncclSystemError;
  }
  void* p = mmap(nullptr, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return ncclSystemError;
  c->base = static_cast<std::byte*>(p);
  c->sent.assign(n, 0);
  c->recvd.assign(n, 0);
  at(c->header().pids[rank]).store(static_cast<std::int32_t>(getpid()), std::memory_order_release);
  at(c->header().attached).fetch_add(1, std::memory_order_acq_rel);
  *comm = reinterpret_cast<ncclComm_t>(c.get());
  comms_.push_back(std::move(c));
  ++live_;
  return ncclSuccess;
}

void FakeApi::check_dead(Comm& c) {
  if (c.error != ncclSuccess) return;
  const auto now = Clock::now();
  if (!c.dead_seen && now - c.last_check >= std::chrono::milliseconds(1)) {
    c.last_check = now;
    for (int r = 0; r < c.nranks; ++r) {
      const std::int32_t pid = at(c.header().pids[r]).load(std::memory_order_acquire);
      if (r == c.rank || pid <= 0) continue;
      if (kill(pid, 0) != 0 && errno == ESRCH) {
        c.dead_seen = true;
        c.dead_since = now;
        break;
      }
    }
  }
  if (c.dead_seen && config_.dead_peer == DeadPeer::kRemoteError &&
      now - c.dead_since >= config_.remote_error_after) {
    c.error = ncclRemoteError;
  }
}

bool FakeApi::step(Op& op, int depth) {
  switch (op.kind) {
    case Op::Kind::kMemset:
      std::memset(op.out, op.root, op.count);
      return true;
    case Op::Kind::kHold:
      return op.wait_on == nullptr || !op.wait_on->held;
    case Op::Kind::kWait:
      if (op.wait_on == nullptr) return true;
      if (depth < 8) advance(*op.wait_on, depth + 1);
      return op.wait_on->completed >= op.wait_target;
    default:
      break;
  }
  Comm& c = *op.comm;
  Header& h = c.header();
  const std::size_t bytes = op.count * type_size(op.type);
  if (at(h.attached).load(std::memory_order_acquire) < c.nranks) {  // used before init completed
    check_dead(c);
    return false;
  }
  if (op.kind == Op::Kind::kSend) {
    if (at(c.consumed(c.rank, op.root)).load(std::memory_order_acquire) + kSlots <= op.seq) {
      check_dead(c);  // the receiver is kSlots messages behind
      return false;
    }
    SlotHeader& s = c.p2p_slot(c.rank, op.root, op.seq);
    std::memcpy(Comm::data(s), op.in, bytes);
    s.bytes = bytes;
    at(s.seq).store(op.seq + 1, std::memory_order_release);
    return true;  // eager: complete once buffered
  }
  if (op.kind == Op::Kind::kRecv) {
    SlotHeader& s = c.p2p_slot(op.root, c.rank, op.seq);
    if (at(s.seq).load(std::memory_order_acquire) != op.seq + 1) {
      check_dead(c);
      return false;
    }
    if (s.bytes != bytes) {
      c.error = ncclInvalidUsage;  // the sender's count differs: NCCL's behaviour is undefined, ours an error
      return false;
    }
    std::memcpy(op.out, Comm::data(s), bytes);
    at(c.consumed(op.root, c.rank)).store(op.seq + 1, std::memory_order_release);
    return true;
  }
  // Collectives: post this rank's contribution once every rank has finished with the slot's previous use,
  // complete once every rank posted.
  if (!op.posted) {
    for (int r = 0; r < c.nranks; ++r) {
      if (at(h.done[r]).load(std::memory_order_acquire) + kSlots <= op.seq) {
        check_dead(c);
        return false;
      }
    }
    SlotHeader& s = c.coll_slot(c.rank, op.seq);
    const std::size_t mine = op.kind == Op::Kind::kBroadcast && op.root != c.rank ? 0 : bytes;
    if (mine > 0) std::memcpy(Comm::data(s), op.in, mine);
    s.bytes = mine;
    at(s.seq).store(op.seq + 1, std::memory_order_release);
    op.posted = true;
  }
  for (int r = 0; r < c.nranks; ++r) {
    if (at(c.coll_slot(r, op.seq).seq).load(std::memory_order_acquire) != op.seq + 1) {
      check_dead(c);
      return false;
    }
  }
  switch (op.kind) {
    case Op::Kind::kAllReduce:
      // In rank order, so that every rank computes the same floating-point sum.
      std::memcpy(op.out, Comm::data(c.coll_slot(0, op.seq)), bytes);
      for (int r = 1; r < c.nranks; ++r) {
        combine(op.out, Comm::data(c.coll_slot(r, op.seq)), op.count, op.type, op.red);
      }
      break;
    case Op::Kind::kBroadcast:
      std::memcpy(op.out, Comm::data(c.coll_slot(op.root, op.seq)), bytes);
      break;
    case Op::Kind::kReduce:
      if (c.rank == op.root) {  // in rank order, as the allreduce
        std::memcpy(op.out, Comm::data(c.coll_slot(0, op.seq)), bytes);
        for (int r = 1; r < c.nranks; ++r)
          combine(op.out, Comm::data(c.coll_slot(r, op.seq)), op.count, op.type, op.red);
      }
      break;
    case Op::Kind::kReduceScatter: {
      // Each rank posted its nranks blocks of op.count; this rank's block, summed in rank order.
      const std::size_t block = bytes / static_cast<std::size_t>(c.nranks);
      const std::size_t at = static_cast<std::size_t>(c.rank) * block;
      const std::size_t n = op.count / static_cast<std::size_t>(c.nranks);
      std::memcpy(op.out, Comm::data(c.coll_slot(0, op.seq)) + at, block);
      for (int r = 1; r < c.nranks; ++r)
        combine(op.out, Comm::data(c.coll_slot(r, op.seq)) + at, n, op.type, op.red);
      break;
    }
    default:  // allgather
      for (int r = 0; r < c.nranks; ++r) {
        std::memcpy(static_cast<std::byte*>(op.out) + static_cast<std::size_t>(r) * bytes,
                    Comm::data(c.coll_slot(r, op.seq)), bytes);
      }
      break;
  }
  at(h.done[c.rank]).store(op.seq + 1, std::memory_order_release);
  return true;
}

bool FakeApi::advance(Stream& s, int depth) {
  while (!s.queue.empty()) {
    if (!step(s.queue.front(), depth)) return false;
    s.queue.pop_front();
    ++s.completed;
  }
  return s.queue.empty();
}

ncclResult_t FakeApi::enqueue(Op op, cudaStream_t stream) {
  Stream* s = stream_of(stream);
  if (s == nullptr) return ncclInvalidArgument;
  if (op.kind != Op::Kind::kWait && op.kind != Op::Kind::kMemset) {
    if (type_size(op.type) == 0) return ncclInvalidArgument;
    if (op.count * type_size(op.type) > config_.slot_bytes) return ncclInvalidArgument;
    JournalEntry e;
    e.kind = op.kind == Op::Kind::kSend   ? JournalEntry::Kind::kSend
             : op.kind == Op::Kind::kRecv ? JournalEntry::Kind::kRecv
                                          : JournalEntry::Kind::kCollective;
    e.op = op.kind == Op::Kind::kAllReduce       ? "allreduce"
           : op.kind == Op::Kind::kBroadcast     ? "broadcast"
           : op.kind == Op::Kind::kAllGather     ? "allgather"
           : op.kind == Op::Kind::kReduce        ? "reduce"
           : op.kind == Op::Kind::kReduceScatter ? "reduce_scatter"
           : op.kind == Op::Kind::kSend          ? "send"
                                                 : "recv";
    e.data = op.kind == Op::Kind::kSend ? op.in : op.out;
    e.count = op.count;
    e.stream = stream;
    e.group = group_depth_ > 0 ? groups_ : 0;
    journal_.push_back(e);
  }
  // The operations of one group run together on a GPU. The fake's stream runs them in order, so a send
  // goes before the receives of its group enqueued ahead of it (sends are buffered: they never wait for
  // the peer), as if the group had been issued sends first; outside a group the order is the caller's.
  op.group = group_depth_ > 0 ? groups_ : 0;
  auto at = s->queue.end();
  if (op.kind == Op::Kind::kSend && op.group != 0) {
    while (at != s->queue.begin() && std::prev(at)->kind == Op::Kind::kRecv &&
           std::prev(at)->group == op.group && !std::prev(at)->posted)
      --at;
  }
  s->queue.insert(at, op);
  ++s->enqueued;
  advance(*s, 0);  // a GPU starts work at once; the fake does what it can now, the rest when polled
  return ncclSuccess;
}

ncclResult_t FakeApi::enqueue_collective(Op o, cudaStream_t stream) {
  // Collectives match across ranks by their order on the communicator.
  o.seq = o.comm->collectives;
  const ncclResult_t r = enqueue(o, stream);
  if (r == ncclSuccess) ++o.comm->collectives;
  return r;
}

ncclResult_t FakeApi::collective(const char* call, Op o, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  Comm* c = comm_of(comm, call);
  if (c == nullptr) return ncclInvalidUsage;
  const bool reduces =
      o.kind == Op::Kind::kAllReduce || o.kind == Op::Kind::kReduce || o.kind == Op::Kind::kReduceScatter;
  if (reduces && o.red != ncclSum && o.red != ncclMax && o.red != ncclMin) return ncclInvalidArgument;
  const bool rooted = o.kind == Op::Kind::kBroadcast || o.kind == Op::Kind::kReduce;
  if (rooted && (o.root < 0 || o.root >= c->nranks)) return ncclInvalidArgument;
  // A reduce-scatter's contribution is every block: nranks of its count.
  if (o.kind == Op::Kind::kReduceScatter) o.count *= static_cast<std::size_t>(c->nranks);
  o.comm = c;
  return enqueue_collective(o, stream);
}

namespace {
FakeApi::Op op_of(FakeApi::Op::Kind kind, const void* in, void* out, std::size_t count, ncclDataType_t type,
                  ncclRedOp_t red = ncclSum, int root = 0) {
  FakeApi::Op o;
  o.kind = kind;
  o.in = in;
  o.out = out;
  o.count = count;
  o.type = type;
  o.red = red;
  o.root = root;
  return o;
}
}  // namespace

ncclResult_t FakeApi::all_reduce(const void* in, void* out, std::size_t count, ncclDataType_t type,
                                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllReduce", op_of(Op::Kind::kAllReduce, in, out, count, type, op), comm, stream);
}

ncclResult_t FakeApi::broadcast(const void* in, void* out, std::size_t count, ncclDataType_t type, int root,
                                ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclBroadcast", op_of(Op::Kind::kBroadcast, in, out, count, type, ncclSum, root), comm,
                    stream);
}

ncclResult_t FakeApi::all_gather(const void* in, void* out, std::size_t count, ncclDataType_t type,
                                 ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", op_of(Op::Kind::kAllGather, in, out, count, type), comm, stream);
}

ncclResult_t FakeApi::reduce(const void* in, void* out, std::size_t count, ncclDataType_t type,
                             ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduce", op_of(Op::Kind::kReduce, in, out, count, type, op, root), comm, stream);
}

ncclResult_t FakeApi::reduce_scatter(const void* in, void* out, std::size_t count, ncclDataType_t type,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduceScatter", op_of(Op::Kind::kReduceScatter, in, out, count, type, op), comm,
                    stream);
}

ncclResult_t FakeApi::send(const void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                           cudaStream_t stream) {
  return point_to_point(true, buf, nullptr, count, type, peer, comm, stream);
}

ncclResult_t FakeApi::recv(void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                           cudaStream_t stream) {
  return point_to_point(false, nullptr, buf, count, type, peer, comm, stream);
}

ncclResult_t FakeApi::point_to_point(bool send, const void* in, void* out, std::size_t count,
                                     ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  Comm* c = comm_of(comm, send ? "ncclSend" : "ncclRecv");
  if (c == nullptr) return ncclInvalidUsage;
  if (peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
  // Messages between two ranks match in the order they were enqueued (NCCL has no tags).
  std::uint64_t& seq = (send ? c->sent : c->recvd)[static_cast<std::size_t>(peer)];
  Op o;
  o.kind = send ? Op::Kind::kSend : Op::Kind::kRecv;
  o.comm = c;
  o.in = in;
  o.out = out;
  o.count = count;
  o.type = type;
  o.root = peer;
  o.seq = seq;
  const ncclResult_t r = enqueue(o, stream);
  if (r == ncclSuccess) ++seq;
  return r;
}

// A group is numbered; enqueue() lets its sends go ahead of its receives (sends are buffered), so that
// the sends and receives of one group cannot deadlock each other whatever their order, as in NCCL. The
// journal carries the number, so that tests can check that what must be grouped (sends and receives
// between the same ranks) was.
ncclResult_t FakeApi::group_start() {
  std::lock_guard lock(mu_);
  if (group_depth_++ == 0) ++groups_;
  return ncclSuccess;
}

ncclResult_t FakeApi::group_end() {
  std::lock_guard lock(mu_);
  if (group_depth_ == 0) {
    misuse_.emplace_back("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  --group_depth_;
  return ncclSuccess;
}

ncclResult_t FakeApi::comm_get_async_error(ncclComm_t comm, ncclResult_t* error) {
  std::lock_guard lock(mu_);
  Comm* c = comm_of(comm, "ncclCommGetAsyncError");
  if (c == nullptr || error == nullptr) return ncclInvalidUsage;
  // The "GPU" advances whenever the host looks, on every stream, as a real one would on its own.
  advance(*default_stream_, 0);
  for (auto& [handle, s] : streams_) advance(*s, 0);
  if (c->state == Comm::State::kInitializing) {
    if (at(c->header().attached).load(std::memory_order_acquire) == c->nranks) {
      c->state = Comm::State::kReady;
    } else {
      check_dead(*c);
    }
  }
  if (c->error != ncclSuccess) {
    *error = c->error;
  } else if (c->state == Comm::State::kInitializing) {
    *error = ncclInProgress;
  } else if (c->state == Comm::State::kFinalizing) {
    bool pending = false;
    const auto has = [&](const Stream& s) {
      return std::any_of(s.queue.begin(), s.queue.end(), [&](const Op& o) { return o.comm == c; });
    };
    pending = has(*default_stream_);
    for (auto& [handle, s] : streams_) pending = pending || has(*s);
    if (!pending) c->state = Comm::State::kFinalized;
    *error = pending ? ncclInProgress : ncclSuccess;
  } else {
    *error = ncclSuccess;
  }
  return ncclSuccess;
}

void FakeApi::drop_ops_of(const Comm& c) {
  const auto drop = [&](Stream& s) {
    const auto before = s.queue.size();
    std::erase_if(s.queue, [&](const Op& o) { return o.comm == &c; });
    s.completed += before - s.queue.size();  // events recorded after them complete, as after ncclCommAbort
  };
  drop(*default_stream_);
  for (auto& [handle, s] : streams_) drop(*s);
}

void FakeApi::leave(Comm& c, bool aborted) {
  const int left = at(c.header().left).fetch_add(1, std::memory_order_acq_rel) + 1;
  // At abort the peers may be dead and never leave: unlink now (the others keep their mappings).
  if (aborted || left == c.nranks) shm_unlink(c.name.c_str());
  munmap(c.base, c.bytes);
  c.base = nullptr;
  --live_;
}

ncclResult_t FakeApi::comm_abort(ncclComm_t comm) {
  std::lock_guard lock(mu_);
  Comm* c = comm_of(comm, "ncclCommAbort");
  if (c == nullptr) return ncclInvalidUsage;
  drop_ops_of(*c);
  leave(*c, /*aborted=*/true);
  c->state = Comm::State::kAborted;
  ++aborted_;
  return ncclSuccess;
}

ncclResult_t FakeApi::comm_finalize(ncclComm_t comm) {
  std::lock_guard lock(mu_);
  Comm* c = comm_of(comm, "ncclCommFinalize");
  if (c == nullptr) return ncclInvalidUsage;
  if (c->state != Comm::State::kReady) return ncclInvalidUsage;
  c->state = Comm::State::kFinalizing;
  return ncclInProgress;  // as NCCL in non-blocking mode: poll comm_get_async_error
}

ncclResult_t FakeApi::comm_destroy(ncclComm_t comm) {
  std::lock_guard lock(mu_);
  Comm* c = comm_of(comm, "ncclCommDestroy");
  if (c == nullptr) return ncclInvalidUsage;
  drop_ops_of(*c);
  leave(*c, /*aborted=*/false);
  c->state = Comm::State::kDestroyed;
  return ncclSuccess;
}

const char* FakeApi::error_string(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

cudaError_t FakeApi::stream_create(cudaStream_t* stream) {
  std::lock_guard lock(mu_);
  if (stream == nullptr) return cudaErrorInvalidValue;
  *stream = reinterpret_cast<cudaStream_t>(next_handle_ += kAlign);
  streams_.emplace(*stream, std::make_unique<Stream>());
  return cudaSuccess;
}

cudaError_t FakeApi::stream_destroy(cudaStream_t stream) {
  std::lock_guard lock(mu_);
  const auto it = streams_.find(stream);
  if (it == streams_.end()) return cudaErrorInvalidResourceHandle;
  Stream* gone = it->second.get();
  // As in CUDA, destroying a stream does not cancel its work; the fake cannot run it without the stream,
  // so what waits on it stops waiting.
  for (auto& [handle, e] : events_) {
    if (e->stream == gone) e->stream = nullptr;
  }
  for (auto& [handle, s] : streams_) {
    for (Op& o : s->queue) {
      if (o.wait_on == gone) o.wait_on = nullptr;
    }
  }
  for (Op& o : default_stream_->queue) {
    if (o.wait_on == gone) o.wait_on = nullptr;
  }
  streams_.erase(it);
  return cudaSuccess;
}

cudaError_t FakeApi::event_create(cudaEvent_t* event) {
  std::lock_guard lock(mu_);
  if (event == nullptr) return cudaErrorInvalidValue;
  *event = reinterpret_cast<cudaEvent_t>(next_handle_ += kAlign);
  events_.emplace(*event, std::make_unique<Event>());
  return cudaSuccess;
}

cudaError_t FakeApi::event_record(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  const auto it = events_.find(event);
  Stream* s = stream_of(stream);
  if (it == events_.end() || s == nullptr) return cudaErrorInvalidResourceHandle;
  it->second->stream = s;
  it->second->target = s->enqueued;
  return cudaSuccess;
}

cudaError_t FakeApi::event_query(cudaEvent_t event) {
  std::lock_guard lock(mu_);
  const auto it = events_.find(event);
  if (it == events_.end()) return cudaErrorInvalidResourceHandle;
  Event& e = *it->second;
  if (e.stream == nullptr) return cudaSuccess;
  advance(*e.stream, 0);
  return e.stream->completed >= e.target ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t FakeApi::event_destroy(cudaEvent_t event) {
  std::lock_guard lock(mu_);
  return events_.erase(event) == 1 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t FakeApi::stream_wait_event(cudaStream_t stream, cudaEvent_t event) {
  std::lock_guard lock(mu_);
  const auto it = events_.find(event);
  Stream* s = stream_of(stream);
  if (it == events_.end() || s == nullptr) return cudaErrorInvalidResourceHandle;
  JournalEntry j;
  j.kind = JournalEntry::Kind::kStreamWait;
  j.op = "wait";
  j.stream = stream;
  j.event = event;
  journal_.push_back(j);
  // What the event stands for now, as in CUDA: a later record does not change what this wait waits for.
  Op o;
  o.kind = Op::Kind::kWait;
  o.wait_on = it->second->stream;
  o.wait_target = it->second->target;
  s->queue.push_back(o);
  ++s->enqueued;
  advance(*s, 0);
  return cudaSuccess;
}

cudaError_t FakeApi::device_alloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = std::calloc(std::max<std::size_t>(bytes, 1), 1);
  return *ptr != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t FakeApi::device_free(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t FakeApi::memset_async(void* ptr, int value, std::size_t bytes, cudaStream_t stream) {
  std::lock_guard lock(mu_);
  Stream* s = stream_of(stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  Op o;
  o.kind = Op::Kind::kMemset;
  o.out = ptr;
  o.count = bytes;
  o.root = value;
  s->queue.push_back(o);
  ++s->enqueued;
  advance(*s, 0);
  return cudaSuccess;
}

const char* FakeApi::cuda_error_string(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    default:
      return "unknown error (fake)";
  }
}

int FakeApi::live_comms() const {
  std::lock_guard lock(mu_);
  return live_;
}

int FakeApi::comms_created() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(comms_.size());
}

int FakeApi::comms_aborted() const {
  std::lock_guard lock(mu_);
  return aborted_;
}

std::vector<std::string> FakeApi::misuse() const {
  std::lock_guard lock(mu_);
  return misuse_;
}

int FakeApi::live_streams() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(streams_.size());
}

int FakeApi::live_events() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(events_.size());
}

std::vector<FakeApi::JournalEntry> FakeApi::journal() const {
  std::lock_guard lock(mu_);
  return journal_;
}

void FakeApi::clear_journal() {
  std::lock_guard lock(mu_);
  journal_.clear();
}

void FakeApi::hold(cudaStream_t stream, bool held) {
  std::lock_guard lock(mu_);
  Stream* s = stream_of(stream);
  if (s == nullptr || s->held == held) return;
  s->held = held;
  if (held) {
    // An operation that completes only once released: what is enqueued or recorded after it waits, as
    // behind a kernel still running.
    Op o;
    o.kind = Op::Kind::kHold;
    o.wait_on = s;
    s->queue.push_back(o);
    ++s->enqueued;
  }
}

std::vector<std::string> FakeApi::segment_names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& c : comms_) out.push_back(c->name);
  return out;
}

}  // namespace sinew::comm::nccl
