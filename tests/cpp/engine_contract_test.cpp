// The Engine contract (src/engine/engine.hpp), checked at the engine level for every back end and
// for the fault engine (fault_engine.hpp) wrapped around each: tags, data, queue depth, reap's
// waiting rules, errors, end of file, cancel, and a randomized handle-like driver over thousands
// of fault seeds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.hpp"
#include "engine_override.hpp"
#include "fault_engine.hpp"
#include "nvio/memory.hpp"
#include "nvio/pattern.hpp"
#include "nvio/system.hpp"
#include "test_util.hpp"

namespace {

using nvio::EngineKind;
using nvio::engine::Completion;
using nvio::engine::Direction;
using nvio::engine::Engine;
using nvio::engine::Request;
using nvio_test::Fault;
using nvio_test::FaultPlan;
using nvio_test::FaultStats;
using nvio_test::run_within;

constexpr auto kLimit = std::chrono::seconds(60);

// Faults that change how completions are delivered, never what they say: the exact-result checks
// run through the fault engine with these.
FaultPlan delivery_faults() {
  FaultPlan p;
  p.partial_submit = 0.3;
  p.submit_no_room = 0.2;
  p.hold_completion = 0.4;
  p.reap_transient = 0.1;
  return p;
}

struct ContractParam {
  EngineKind kind;
  bool faults;  // wrapped in a FaultEngine
};

void PrintTo(const ContractParam& p, std::ostream* os) {
  *os << nvio_test::engine_name(p.kind) << (p.faults ? " with faults" : "");
}

std::string param_name(const ::testing::TestParamInfo<ContractParam>& info) {
  std::string name = nvio_test::engine_name(info.param.kind);
  name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
  return name + (info.param.faults ? "Faults" : "");
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Tag of the `gen`-th submission of piece `index`: the high bit set, as the worker's generations
// will set it, so a tag truncated anywhere shows.
std::uint64_t tag_for(std::size_t index, std::uint32_t gen) {
  return (std::uint64_t{1} << 63) | (std::uint64_t{gen} << 32) | index;
}

// One transfer the driver moves to its end like a handle would.
struct Piece {
  Direction direction;
  unsigned char* buf;
  std::size_t length;
  std::uint64_t offset;
  std::size_t done = 0;
  int region = -1;        // Request::region of each submission (Engine::add_region)
  std::uint32_t gen = 0;  // submissions so far
  unsigned tries = 0;     // failed submissions in a row
  bool at_eof = false;
};

enum class ErrorPolicy {
  Fail,      // a real engine: an error completion fails the test
  Resubmit,  // the fault engine injects errors without transferring: submit again
};

// Moves every piece to its end (or EOF for reads) on `engine`, never more than `depth` in flight:
// resubmits the rest after short transfers, EINTR/EAGAIN completions and submits that took part
// of a batch or none, and checks that every accepted request comes back exactly once with its
// exact tag and never more than its length. Decisions (batch sizes, min_complete) come from `rng`.
::testing::AssertionResult drive(Engine& engine, unsigned depth, int fd, std::vector<Piece>& pieces,
                                 std::mt19937_64& rng, ErrorPolicy policy) {
  constexpr unsigned kMaxTries = 64;
  std::deque<std::size_t> ready;
  for (std::size_t i = 0; i < pieces.size(); ++i) ready.push_back(i);
  std::unordered_map<std::uint64_t, Request> outstanding;  // by tag
  std::vector<Request> batch;
  std::vector<Completion> out(depth);
  unsigned idle_rounds = 0;
  while (!ready.empty() || !outstanding.empty()) {
    if (++idle_rounds > 100000) return ::testing::AssertionFailure() << "no progress";
    if (!ready.empty() && outstanding.size() < depth) {
      const std::size_t room = std::min<std::size_t>(depth - outstanding.size(), ready.size());
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, room)(rng);
      batch.clear();
      for (std::size_t k = 0; k < n; ++k) {
        Piece& p = pieces[ready[k]];
        batch.push_back(Request{fd, p.direction, p.buf + p.done, p.length - p.done,
                                p.offset + p.done, tag_for(ready[k], p.gen)});
        batch.back().region = p.region;
      }
      const int rc = engine.submit(batch);
      if (rc > static_cast<int>(n)) return ::testing::AssertionFailure() << "submit took " << rc;
      for (int k = 0; k < rc; ++k) {
        Piece& p = pieces[ready.front()];
        ++p.gen;
        outstanding.emplace(batch[static_cast<std::size_t>(k)].tag,
                            batch[static_cast<std::size_t>(k)]);
        ready.pop_front();
      }
      if (rc < 0 && rc != -EAGAIN && rc != -EBUSY) {
        Piece& p = pieces[ready.front()];  // refused: it failed its operation; a new one retries
        if (policy == ErrorPolicy::Fail || ++p.tries > kMaxTries) {
          return ::testing::AssertionFailure() << "submit refused a request: " << rc;
        }
        continue;
      }
      if (rc <= 0 && outstanding.empty()) continue;  // nothing to reap: offer again
    }
    if (outstanding.empty()) continue;
    const unsigned pick = static_cast<unsigned>(rng() % 4);
    const std::size_t min = pick == 0 ? 0 : pick == 1 ? outstanding.size() : 1;
    const int got = engine.reap(out, min);
    if (got == -EAGAIN) continue;  // transient: nothing consumed
    if (got < 0) return ::testing::AssertionFailure() << "reap failed: " << got;
    if (static_cast<std::size_t>(got) < std::min(min, out.size())) {
      return ::testing::AssertionFailure() << "reap(" << min << ") returned " << got;
    }
    if (got > 0) idle_rounds = 0;
    for (int i = 0; i < got; ++i) {
      const Completion c = out[static_cast<std::size_t>(i)];
      const auto it = outstanding.find(c.tag);
      if (it == outstanding.end()) {
        return ::testing::AssertionFailure() << "unknown or repeated tag " << std::hex << c.tag;
      }
      const Request r = it->second;
      outstanding.erase(it);
      const std::size_t index = static_cast<std::size_t>(c.tag & 0xFFFF'FFFF);
      Piece& p = pieces[index];
      if (c.result > static_cast<std::int64_t>(r.length)) {
        return ::testing::AssertionFailure() << "result " << c.result << " > length " << r.length;
      }
      if (c.result > 0) {
        p.done += static_cast<std::size_t>(c.result);
        p.tries = 0;
        if (p.done < p.length) ready.push_back(index);
        continue;
      }
      if (c.result == 0) {
        if (p.direction == Direction::Write) {
          return ::testing::AssertionFailure() << "a write moved 0 bytes";
        }
        p.at_eof = true;
        continue;
      }
      const int err = static_cast<int>(-c.result);
      const bool transient = err == EINTR || err == EAGAIN;
      if ((!transient && policy == ErrorPolicy::Fail) || ++p.tries > kMaxTries) {
        return ::testing::AssertionFailure()
               << "piece at " << r.offset << " of " << r.length << " failed: " << -err;
      }
      ready.push_back(index);
    }
  }
  return ::testing::AssertionSuccess();
}

class EngineContract : public ::testing::TestWithParam<ContractParam> {
 protected:
  void SetUp() override {
    const nvio::EngineProbe& probe = nvio::probe_engine(GetParam().kind);
    if (!probe.available) GTEST_SKIP() << "engine unavailable: " << probe.reason;
    dir_.emplace();
    direct_ = nvio::probe_directory(dir_->path());
  }

  // An engine of the parameter's kind: the back end, or a fault engine around it with `plan`.
  std::unique_ptr<Engine> make(unsigned depth, const FaultPlan& plan = delivery_faults(),
                               std::uint64_t seed = 1) {
    auto engine = nvio::engine::make_backend_engine(GetParam().kind, depth);
    if (!GetParam().faults) return engine;
    return std::make_unique<nvio_test::FaultEngine>(std::move(engine), plan, seed, stats_);
  }
  ErrorPolicy policy() const {
    return GetParam().faults ? ErrorPolicy::Resubmit : ErrorPolicy::Fail;
  }
  std::string file(const std::string& name) const { return dir_->file(name); }

  // Reaps until every tag in `tags` came back once (a bounded number of reaps); returns them.
  static std::vector<Completion> reap_all(Engine& engine, std::size_t count) {
    std::vector<Completion> all;
    std::vector<Completion> out(count);
    for (int round = 0; round < 100000 && all.size() < count; ++round) {
      const int got = engine.reap(out, 1);
      if (got == -EAGAIN) continue;
      EXPECT_GE(got, 0);
      if (got < 0) break;
      all.insert(all.end(), out.begin(), out.begin() + got);
    }
    return all;
  }

  // Submits `requests` until the engine accepts some (a fault engine may answer "no room" a few
  // times); returns how many it accepted.
  static int submit_some(Engine& engine, const std::vector<Request>& requests) {
    int rc = 0;
    for (int round = 0; round < 1000 && (rc == 0 || rc == -EAGAIN || rc == -EBUSY); ++round) {
      rc = engine.submit(requests);
    }
    return rc;
  }

  // Submits all of `requests` (again after partial or no-room submits, reaping in between), and
  // returns every completion.
  static std::vector<Completion> submit_and_reap(Engine& engine, std::vector<Request> requests) {
    std::vector<Completion> all;
    std::vector<Completion> out(requests.size());
    std::size_t pos = 0;
    for (int round = 0; round < 100000 && pos < requests.size(); ++round) {
      const int rc = engine.submit(std::span(requests).subspan(pos));
      if (rc > 0) {
        pos += static_cast<std::size_t>(rc);
        continue;
      }
      EXPECT_TRUE(rc == 0 || rc == -EAGAIN || rc == -EBUSY) << rc;
      const int got = engine.reap(out, 0);
      if (got > 0) all.insert(all.end(), out.begin(), out.begin() + got);
    }
    EXPECT_EQ(pos, requests.size());
    const std::vector<Completion> rest = reap_all(engine, pos - all.size());
    all.insert(all.end(), rest.begin(), rest.end());
    return all;
  }

  std::optional<nvio_test::TempDir> dir_;
  nvio::DirectIoInfo direct_;
  std::shared_ptr<FaultStats> stats_ = std::make_shared<FaultStats>();
};

TEST_P(EngineContract, TagsRoundTripUnchanged) {
  const std::string path = file("data");
  nvio_test::write_pattern_file(path, 8 * 512, 3);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const std::vector<std::uint64_t> tags = {0,
                                           1,
                                           0xFFFF'0000'0000'0001ULL,
                                           0x8000'0000'0000'0000ULL,
                                           0xFFFF'FFFF'FFFF'FFFFULL,
                                           0xFFFF'FFFF'FFFF'FFFEULL,
                                           0x0000'0001'0000'0000ULL,
                                           0x1234'5678'9ABC'DEF0ULL};
  std::vector<unsigned char> buf(tags.size() * 512);
  std::vector<Request> requests;
  for (std::size_t i = 0; i < tags.size(); ++i) {
    requests.push_back(Request{fd.get(), Direction::Read, &buf[i * 512], 512, i * 512, tags[i]});
  }
  run_within(kLimit, "tags", [&] {
    auto engine = make(static_cast<unsigned>(tags.size()));
    const std::vector<Completion> all = submit_and_reap(*engine, requests);
    ASSERT_EQ(all.size(), tags.size());
    std::vector<std::uint64_t> seen;
    for (const Completion& c : all) {
      seen.push_back(c.tag);
      EXPECT_EQ(c.result, 512);
    }
    std::vector<std::uint64_t> want = tags;
    std::sort(seen.begin(), seen.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(seen, want);
  });
  EXPECT_TRUE(nvio_test::buffer_has_pattern(buf.data(), buf.size(), 0, 3));
}

// Writes the pattern at `offset` in pieces, checks the file with plain pread, then reads it back
// through the engine into a sentinel-filled buffer and checks that. The requests carry `region`.
void write_then_read(Engine& engine, unsigned depth, int fd, const std::string& path,
                     unsigned char* buf, std::size_t len, std::uint64_t offset, std::size_t unit,
                     std::uint64_t seed, ErrorPolicy policy, int region = -1) {
  std::mt19937_64 rng(seed);
  const auto split = [&](Direction d) {
    std::vector<Piece> pieces;
    const std::size_t each = std::max(unit, (len / depth + unit - 1) / unit * unit);
    for (std::size_t at = 0; at < len; at += each) {
      pieces.push_back(Piece{d, buf + at, std::min(each, len - at), offset + at, 0, region});
    }
    return pieces;
  };
  nvio::pattern::fill(buf, len, offset, seed);
  std::vector<Piece> writes = split(Direction::Write);
  ASSERT_TRUE(drive(engine, depth, fd, writes, rng, policy));
  const std::vector<unsigned char> bytes = nvio_test::read_file(path);
  ASSERT_GE(bytes.size(), offset + len);
  EXPECT_TRUE(nvio_test::file_range_has_pattern(bytes, offset, len, seed));
  std::fill(buf, buf + len, nvio_test::kSentinel);
  std::vector<Piece> reads = split(Direction::Read);
  ASSERT_TRUE(drive(engine, depth, fd, reads, rng, policy));
  EXPECT_TRUE(nvio_test::buffer_has_pattern(buf, len, offset, seed));
}

TEST_P(EngineContract, BufferedUnalignedWritesThenReads) {
  constexpr unsigned kDepth = 8;
  const std::string path = file("data");
  const Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_GE(fd.get(), 0);
  for (const std::size_t len : {std::size_t{1}, std::size_t{4095}, nvio_test::MiB + 123}) {
    for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{4097}}) {
      SCOPED_TRACE(testing::Message() << "len " << len << " offset " << offset);
      std::vector<unsigned char> storage(len + 3);
      run_within(kLimit, "buffered", [&] {
        auto engine = make(kDepth, FaultPlan::everything(), len + offset);
        write_then_read(*engine, kDepth, fd.get(), path, storage.data() + 3, len, offset, 1,
                        len ^ offset, policy());
      });
    }
  }
}

TEST_P(EngineContract, DirectAlignedWritesThenReads) {
  if (!direct_.supported) GTEST_SKIP() << "no O_DIRECT here: " << direct_.source;
  constexpr unsigned kDepth = 8;
  const std::string path = file("data");
  const Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644));
  ASSERT_GE(fd.get(), 0);
  nvio::AlignedBuffer buf(4 * nvio_test::MiB);
  for (const std::size_t len : {std::size_t{4096}, nvio_test::MiB, 4 * nvio_test::MiB}) {
    for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{12288}}) {
      SCOPED_TRACE(testing::Message() << "len " << len << " offset " << offset);
      run_within(kLimit, "direct", [&] {
        auto engine = make(kDepth, FaultPlan::everything(), len + offset);
        write_then_read(*engine, kDepth, fd.get(), path, static_cast<unsigned char*>(buf.data()),
                        len, offset, 4096, len + offset, policy());
      });
    }
  }
}

// Requests into memory the engine prepared (add_region; io_uring: fixed-buffer reads and writes
// on a registered buffer) move the same bytes as any other, shortened ones too: odd sizes at
// unaligned places through a buffered descriptor, pages through a direct one, at the region's
// first and last bytes. An engine that uses regions either prepares this one or says why not;
// the others make no use of it.
TEST_P(EngineContract, RequestsInsideARegionMoveTheRightBytes) {
  constexpr unsigned kDepth = 8;
  constexpr std::size_t kSlab = 2 * nvio_test::MiB;
  nvio::AlignedBuffer slab(kSlab);
  auto* const base = static_cast<unsigned char*>(slab.data());
  const std::string path = file("data");
  run_within(kLimit, "regions", [&] {
    auto engine = make(kDepth, FaultPlan::everything(), 5);
    const int region = engine->add_region(base, kSlab);
    if (GetParam().kind == EngineKind::IoUring) {
      EXPECT_TRUE(region >= 0 || !engine->region_refusal().empty()) << "refused without a reason";
    } else {
      EXPECT_EQ(region, -1);
      EXPECT_EQ(engine->region_refusal(), "");
    }
    const Fd buffered(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_GE(buffered.get(), 0);
    for (const std::size_t len :
         {std::size_t{1}, std::size_t{4095}, std::size_t{65536 + 3}, nvio_test::MiB + 123}) {
      for (unsigned char* at : {base + 3, base + kSlab - len}) {
        SCOPED_TRACE(testing::Message() << "buffered len " << len << " at " << at - base);
        write_then_read(*engine, kDepth, buffered.get(), path, at, len, 4097 + len, 1, len,
                        policy(), region);
      }
    }
    if (!direct_.supported) return;
    const Fd direct(::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
    ASSERT_GE(direct.get(), 0);
    for (const std::size_t len : {std::size_t{4096}, std::size_t{65536}, nvio_test::MiB}) {
      for (unsigned char* at : {base, base + kSlab - len}) {
        SCOPED_TRACE(testing::Message() << "direct len " << len << " at " << at - base);
        write_then_read(*engine, kDepth, direct.get(), path, at, len, 8192, 4096, len + 1, policy(),
                        region);
      }
    }
  });
}

TEST_P(EngineContract, QueueDepthInFlightAtOnceAndReapWaitsForK) {
  constexpr unsigned kDepth = 32;
  const std::string path = file("data");
  nvio_test::write_pattern_file(path, kDepth * 4096, 5);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::vector<unsigned char> buf(kDepth * 4096, nvio_test::kSentinel);
  std::vector<Request> requests;
  for (unsigned i = 0; i < kDepth; ++i) {
    requests.push_back(Request{fd.get(), Direction::Read, &buf[i * 4096], 4096, i * 4096ULL, i});
  }
  run_within(kLimit, "queue depth", [&] {
    auto engine = make(kDepth);
    std::size_t accepted = 0;
    std::vector<Completion> out(kDepth);
    for (int round = 0; round < 1000 && accepted < kDepth; ++round) {
      const int rc = engine->submit(std::span(requests).subspan(accepted));
      if (!GetParam().faults) {
        ASSERT_EQ(rc, static_cast<int>(kDepth)) << "all at once";
      }
      if (rc > 0) accepted += static_cast<std::size_t>(rc);
    }
    ASSERT_EQ(accepted, kDepth) << "queue_depth requests in flight at once";
    std::size_t reaped = 0;
    for (const std::size_t k : {std::size_t{kDepth / 2}, std::size_t{kDepth / 4}, std::size_t{0}}) {
      const std::size_t k_now = std::min(k, kDepth - reaped);
      int got = -EAGAIN;
      for (int tries = 0; tries < 1000 && got == -EAGAIN; ++tries) got = engine->reap(out, k_now);
      ASSERT_GE(got, static_cast<int>(k_now))
          << "reap(" << k_now << ") with " << kDepth - reaped << " outstanding";
      reaped += static_cast<std::size_t>(got);
    }
    const std::vector<Completion> rest = reap_all(*engine, kDepth - reaped);
    EXPECT_EQ(reaped + rest.size(), kDepth);
  });
  EXPECT_TRUE(nvio_test::buffer_has_pattern(buf.data(), buf.size(), 0, 5));
}

TEST_P(EngineContract, ReapWithNothingOutstandingReturnsAtOnce) {
  run_within(std::chrono::seconds(10), "reap with nothing outstanding", [&] {
    auto engine = make(4);
    std::vector<Completion> out(4);
    for (const std::size_t min : {std::size_t{0}, std::size_t{1}, std::size_t{4}}) {
      const int got = engine->reap(out, min);
      EXPECT_TRUE(got == 0 || (GetParam().faults && got == -EAGAIN)) << got;
    }
  });
}

TEST_P(EngineContract, ReapZeroDoesNotBlockWhileRequestsAreInFlight) {
  constexpr unsigned kDepth = 16;
  const std::string path = file("data");
  nvio_test::write_pattern_file(path, kDepth * nvio_test::MiB, 6);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::vector<unsigned char> buf(kDepth * nvio_test::MiB);
  std::vector<Request> requests;
  for (unsigned i = 0; i < kDepth; ++i) {
    requests.push_back(Request{fd.get(), Direction::Read, &buf[i * nvio_test::MiB], nvio_test::MiB,
                               i * nvio_test::MiB, i});
  }
  run_within(std::chrono::seconds(10), "reap(0)", [&] {
    auto engine = make(kDepth);
    const int rc = submit_some(*engine, requests);
    ASSERT_GT(rc, 0);
    std::vector<Completion> out(kDepth);
    std::size_t reaped = 0;
    for (int i = 0; i < 3; ++i) {
      const int got = engine->reap(out, 0);
      EXPECT_TRUE(got >= 0 || (GetParam().faults && got == -EAGAIN)) << got;
      reaped += got > 0 ? static_cast<std::size_t>(got) : 0;
    }
    EXPECT_EQ(reaped + reap_all(*engine, static_cast<std::size_t>(rc) - reaped).size(),
              static_cast<std::size_t>(rc));
  });
}

TEST_P(EngineContract, BadDescriptorFailsWithEbadf) {
  // A descriptor number nothing holds, nor will: a number just closed would be reused by the
  // engine's own ring or context.
  constexpr int bad = 999'999;
  ASSERT_EQ(::fcntl(bad, F_GETFD), -1);
  std::vector<unsigned char> buf(512);
  run_within(kLimit, "bad descriptor", [&] {
    for (const Direction d : {Direction::Read, Direction::Write}) {
      auto engine = make(2);
      const std::vector<Request> requests = {Request{bad, d, buf.data(), 512, 0, 77}};
      const int rc = submit_some(*engine, requests);
      if (rc < 0) {
        EXPECT_EQ(rc, -EBADF) << "refused at submit";
        continue;
      }
      ASSERT_EQ(rc, 1);
      const std::vector<Completion> all = reap_all(*engine, 1);
      ASSERT_EQ(all.size(), 1u);
      EXPECT_EQ(all[0].tag, 77u);
      EXPECT_EQ(all[0].result, -EBADF) << "as the completion";
    }
  });
}

TEST_P(EngineContract, ReadPastEndOfFileIsShortOrZero) {
  const std::string path = file("data");
  nvio_test::write_pattern_file(path, 1000, 8);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::vector<unsigned char> buf(2 * 4096, nvio_test::kSentinel);
  run_within(kLimit, "past EOF", [&] {
    auto engine = make(2);
    const std::vector<Completion> all = submit_and_reap(
        *engine, {Request{fd.get(), Direction::Read, buf.data(), 4096, 0, 1},
                  Request{fd.get(), Direction::Read, buf.data() + 4096, 4096, 5000, 2}});
    ASSERT_EQ(all.size(), 2u);
    for (const Completion& c : all) EXPECT_EQ(c.result, c.tag == 1 ? 1000 : 0) << c.tag;
  });
  EXPECT_TRUE(nvio_test::buffer_has_pattern(buf.data(), 1000, 0, 8));
  EXPECT_EQ(buf[1000], nvio_test::kSentinel);
}

TEST_P(EngineContract, CancelThenReapReturnsEveryAcceptedTagOnce) {
  constexpr unsigned kDepth = 16;
  constexpr std::size_t kLen = nvio_test::MiB;
  const std::string path = file("data");
  nvio_test::write_pattern_file(path, kDepth * kLen, 9);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::vector<unsigned char> buf(kDepth * kLen);
  std::vector<Request> requests;
  for (unsigned i = 0; i < kDepth; ++i) {
    requests.push_back(
        Request{fd.get(), Direction::Read, &buf[i * kLen], kLen, i * kLen, tag_for(i, 7)});
  }
  run_within(kLimit, "cancel", [&] {
    auto engine = make(kDepth);
    const int rc = submit_some(*engine, requests);
    ASSERT_GT(rc, 0);
    EXPECT_EQ(engine->cancel(), 0);
    EXPECT_EQ(engine->cancel(), 0) << "twice";
    const std::vector<Completion> all = reap_all(*engine, static_cast<std::size_t>(rc));
    ASSERT_EQ(all.size(), static_cast<std::size_t>(rc));
    std::vector<std::uint64_t> tags;
    for (const Completion& c : all) {
      tags.push_back(c.tag);
      EXPECT_TRUE(c.result == static_cast<std::int64_t>(kLen) || c.result == -ECANCELED)
          << c.result;
    }
    std::sort(tags.begin(), tags.end());
    EXPECT_TRUE(std::adjacent_find(tags.begin(), tags.end()) == tags.end()) << "a tag twice";
    for (int i = 0; i < rc; ++i) EXPECT_EQ(tags[static_cast<std::size_t>(i)], tag_for(i, 7));
    std::vector<Completion> out(kDepth);
    EXPECT_TRUE(engine->reap(out, 0) <= 0) << "a completion after all were reaped";
  });
}

// Engine::watch: the back ends that wait in the kernel watch the eventfd; a wake that is due when
// the engine waits ends the wait, is consumed (the eventfd read), and loses no completion.
TEST_P(EngineContract, AWatchedEventfdEndsAWaitAndLosesNoCompletion) {
  constexpr unsigned kDepth = 16;
  const std::string path = file("data");
  nvio_test::write_pattern_file(path, kDepth * nvio_test::MiB, 13);
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  std::vector<unsigned char> buf(kDepth * nvio_test::MiB);
  std::vector<Request> requests;
  for (unsigned i = 0; i < kDepth; ++i) {
    requests.push_back(Request{fd.get(), Direction::Read, &buf[i * nvio_test::MiB], nvio_test::MiB,
                               i * nvio_test::MiB, tag_for(i, 13)});
  }
  run_within(kLimit, "a wake among reads", [&] {
    auto engine = make(kDepth);
    const bool waits_in_kernel = !GetParam().faults && GetParam().kind != EngineKind::Psync;
    const bool watching = engine->watch(wake.get());
    EXPECT_EQ(watching, waits_in_kernel);
    const std::uint64_t one = 1;
    ASSERT_EQ(::write(wake.get(), &one, sizeof one), 8);  // due before the first wait
    const std::vector<Completion> all = submit_and_reap(*engine, requests);
    ASSERT_EQ(all.size(), kDepth);
    for (const Completion& c : all) EXPECT_EQ(c.result, static_cast<std::int64_t>(nvio_test::MiB));
    // The poll's own event may still wait behind the last completion (libaio reaps at most
    // queue_depth events a call): one more reap takes it, and reports nothing.
    std::vector<Completion> rest(kDepth);
    EXPECT_TRUE(engine->reap(rest, 0) <= 0) << "a completion after all were reaped";
    std::uint64_t count = 0;
    if (watching) {
      EXPECT_EQ(::read(wake.get(), &count, sizeof count), -1) << "the wake was not consumed";
    } else {
      EXPECT_EQ(::read(wake.get(), &count, sizeof count), 8) << "an engine that does not watch "
                                                                "read the eventfd";
    }
  });
  EXPECT_TRUE(nvio_test::buffer_has_pattern(buf.data(), buf.size(), 0, 13));
}

// A wait for a request that does not complete (a read of an empty pipe: io_uring reads it
// asynchronously) ends when the watched eventfd is written, with no completion; the request still
// completes once the pipe has data.
TEST_P(EngineContract, AWatchedEventfdEndsAWaitForARequestThatHasNotCompleted) {
  if (GetParam().kind != EngineKind::IoUring || GetParam().faults) {
    GTEST_SKIP() << "only the bare io_uring engine reads a pipe asynchronously (libaio would block "
                    "in io_submit, psync in submit)";
  }
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
  const Fd in(ends[0]), out_end(ends[1]);
  const Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  char byte = 0;
  run_within(kLimit, "a wait ended by the eventfd", [&] {
    auto engine = make(2);
    ASSERT_TRUE(engine->watch(wake.get()));
    const std::vector<Request> read = {Request{in.get(), Direction::Read, &byte, 1, 0, 99}};
    ASSERT_EQ(engine->submit(read), 1);
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::uint64_t one = 1;
      EXPECT_EQ(::write(wake.get(), &one, sizeof one), 8);
    });
    std::vector<Completion> out(2);
    const int got = engine->reap(out, 1);
    writer.join();
    EXPECT_EQ(got, 0) << "the wait ended with a completion that cannot have come";
    ASSERT_EQ(::write(out_end.get(), "x", 1), 1);
    const std::vector<Completion> all = reap_all(*engine, 1);
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all[0].tag, 99u);
    EXPECT_EQ(all[0].result, 1);
  });
  EXPECT_EQ(byte, 'x');
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineContract,
                         ::testing::Values(ContractParam{EngineKind::IoUring, false},
                                           ContractParam{EngineKind::Libaio, false},
                                           ContractParam{EngineKind::Psync, false},
                                           ContractParam{EngineKind::IoUring, true},
                                           ContractParam{EngineKind::Libaio, true},
                                           ContractParam{EngineKind::Psync, true}),
                         param_name);

// The handle-like driver over thousands of seeds of every fault: random regions, pieces, batch
// sizes and waits; the bytes must come out right, every tag exactly once, and each fault of the
// plan must actually have been injected.
class FaultEngineRandom : public ::testing::TestWithParam<EngineKind> {};

TEST_P(FaultEngineRandom, HandleLikeDriverGetsTheRightBytesThroughEveryFault) {
  const nvio::EngineProbe& probe = nvio::probe_engine(GetParam());
  if (!probe.available) GTEST_SKIP() << "engine unavailable: " << probe.reason;
  constexpr unsigned kSeeds = 2000;
  constexpr unsigned kDepth = 8;
  const nvio_test::TempDir dir;
  const std::string path = dir.file("data");
  const Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_GE(fd.get(), 0);
  const FaultPlan plan = FaultPlan::everything();
  auto stats = std::make_shared<FaultStats>();
  std::vector<unsigned char> buf(64 * 1024 + 7);
  run_within(kLimit, "randomized faults", [&] {
    nvio_test::FaultEngine engine(nvio::engine::make_backend_engine(GetParam(), kDepth), plan, 0,
                                  stats);
    for (unsigned seed = 0; seed < kSeeds; ++seed) {
      SCOPED_TRACE(testing::Message() << "seed " << seed);
      std::mt19937_64 rng(seed);
      engine.reseed(seed);
      const std::size_t len = std::uniform_int_distribution<std::size_t>(1, 64 * 1024)(rng);
      const std::uint64_t offset = std::uniform_int_distribution<std::uint64_t>(0, 8191)(rng);
      unsigned char* data = buf.data() + rng() % 8;
      const auto pieces_of = [&](Direction d) {
        std::vector<Piece> pieces;
        for (std::size_t at = 0; at < len;) {
          const std::size_t n =
              std::min(len - at, std::uniform_int_distribution<std::size_t>(1, 16 * 1024)(rng));
          pieces.push_back(Piece{d, data + at, n, offset + at});
          at += n;
        }
        return pieces;
      };
      nvio::pattern::fill(data, len, offset, seed);
      std::vector<Piece> writes = pieces_of(Direction::Write);
      ASSERT_TRUE(drive(engine, kDepth, fd.get(), writes, rng, ErrorPolicy::Resubmit));
      ASSERT_TRUE(nvio_test::file_range_has_pattern(nvio_test::read_file(path), offset, len, seed));
      std::fill(data, data + len, nvio_test::kSentinel);
      std::vector<Piece> reads = pieces_of(Direction::Read);
      ASSERT_TRUE(drive(engine, kDepth, fd.get(), reads, rng, ErrorPolicy::Resubmit));
      ASSERT_TRUE(nvio_test::buffer_has_pattern(data, len, offset, seed));
    }
  });
  RecordProperty("faults", stats->describe());
  for (std::size_t i = 0; i < nvio_test::kFaultCount; ++i) {
    const auto fault = static_cast<Fault>(i);
    if (!plan.enables(fault)) continue;
    EXPECT_GT(stats->count(fault), 0u)
        << to_string(fault) << " never injected: " << stats->describe();
  }
}

// A persistent reap failure: from the planned reap on, reap and submit fail with -EIO for good,
// counted once; the inner engine's requests are still finished when the engine goes.
TEST_P(FaultEngineRandom, PersistentReapFailureLastsAndIsCounted) {
  const nvio::EngineProbe& probe = nvio::probe_engine(GetParam());
  if (!probe.available) GTEST_SKIP() << "engine unavailable: " << probe.reason;
  FaultPlan plan;
  plan.reap_persistent_after = 2;
  auto stats = std::make_shared<FaultStats>();
  std::vector<unsigned char> buf(4096);
  const Fd fd(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));  // any readable file will do
  run_within(kLimit, "persistent failure", [&] {
    nvio_test::FaultEngine engine(nvio::engine::make_backend_engine(GetParam(), 4), plan, 1, stats);
    const std::vector<Request> one = {Request{fd.get(), Direction::Read, buf.data(), 4096, 0, 5}};
    ASSERT_EQ(engine.submit(one), 1);
    std::vector<Completion> out(4);
    EXPECT_EQ(engine.reap(out, 1), 1);
    ASSERT_EQ(engine.submit(one), 1);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(engine.reap(out, 1), -EIO);
    EXPECT_EQ(engine.submit(one), -EIO);
  });
  EXPECT_EQ(stats->count(Fault::ReapPersistent), 1u) << stats->describe();
}

// The factory makes fault engines over the requested back end from any thread, each with its own
// seed, and make_engine hands them out while it is installed.
TEST_P(FaultEngineRandom, FactoryMakesFaultEnginesFromAnyThread) {
  const nvio::EngineProbe& probe = nvio::probe_engine(GetParam());
  if (!probe.available) GTEST_SKIP() << "engine unavailable: " << probe.reason;
  auto stats = std::make_shared<FaultStats>();
  const nvio_test::ScopedEngineFactory installed(
      nvio_test::fault_engine_factory(FaultPlan::everything(), 42, stats));
  std::atomic<int> made{0};
  nvio_test::run_threads(4, [&](unsigned) {
    for (int i = 0; i < 8; ++i) {
      const auto engine = nvio::engine::make_engine(GetParam(), 4);
      if (dynamic_cast<nvio_test::FaultEngine*>(engine.get()) != nullptr &&
          engine->kind() == GetParam()) {
        made.fetch_add(1);
      }
    }
  });
  EXPECT_EQ(made.load(), 32);
}

INSTANTIATE_TEST_SUITE_P(Engines, FaultEngineRandom,
                         ::testing::Values(EngineKind::IoUring, EngineKind::Libaio,
                                           EngineKind::Psync),
                         nvio_test::EngineParamName());

}  // namespace
