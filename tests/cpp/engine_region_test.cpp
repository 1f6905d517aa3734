// io_uring's registered buffers at the engine level (Engine::add_region): requests inside a
// registered region go to the kernel as READ_FIXED / WRITE_FIXED, the others as plain READ /
// WRITE, and a kernel that refuses the registration (injected: ENOMEM as under RLIMIT_MEMLOCK,
// EOPNOTSUPP, EINVAL as before Linux 5.19) leaves every request on plain ones with the same bytes,
// the refusal told once per process (a warning) and kept for reports (region_refusal()). The
// handle-level side (a worker's bounce slabs) is in bounce_test.cpp; the bytes of region requests
// for every engine in engine_contract_test.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "nvio/handle.hpp"
#include "nvio/memory.hpp"
#include "nvio/pattern.hpp"
#include "nvio/system.hpp"
#include "ring_spy.hpp"
#include "test_util.hpp"

namespace {

using nvio::EngineKind;
using nvio::engine::Completion;
using nvio::engine::Direction;
using nvio::engine::Engine;
using nvio::engine::Request;
using nvio_test::ring_spy;

class IoUringRegions : public ::testing::Test {
 protected:
  void SetUp() override {
    const nvio::EngineProbe& probe = nvio::probe_engine(EngineKind::IoUring);
    if (!probe.available) GTEST_SKIP() << "io_uring unavailable: " << probe.reason;
    ring_spy().reset();
    path_ = dir_.file("data");
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  static std::unique_ptr<Engine> make() {
    return nvio::engine::make_io_uring_engine(16, nvio_test::spying_io_uring_calls());
  }

  // Runs `requests` (at most 16) to their end; each must move its whole length.
  static void run(Engine& engine, std::vector<Request> requests) {
    std::size_t pos = 0;
    std::size_t done = 0;
    std::vector<Completion> out(requests.size());
    for (int round = 0; round < 10000 && done < requests.size(); ++round) {
      if (pos < requests.size()) {
        const int rc = engine.submit(std::span(requests).subspan(pos));
        ASSERT_TRUE(rc >= 0 || rc == -EAGAIN || rc == -EBUSY) << rc;
        if (rc > 0) pos += static_cast<std::size_t>(rc);
      }
      const int got = engine.reap(out, pos > done ? 1 : 0);
      if (got == -EAGAIN) continue;
      ASSERT_GE(got, 0);
      for (int i = 0; i < got; ++i) {
        const Request& r = requests[out[static_cast<std::size_t>(i)].tag];
        EXPECT_EQ(out[static_cast<std::size_t>(i)].result, static_cast<std::int64_t>(r.length))
            << "request " << out[static_cast<std::size_t>(i)].tag;
      }
      done += static_cast<std::size_t>(got);
    }
    ASSERT_EQ(done, requests.size());
  }

  // Writes the pattern (seed) from `bufs` (pointer, length, region) at consecutive odd file
  // offsets, checks the file, reads it back into the same places (sentinel-filled) and checks
  // them.
  struct Place {
    unsigned char* buf;
    std::size_t length;
    int region;
  };
  void round_trip(Engine& engine, const std::vector<Place>& places, std::uint64_t seed) {
    for (const Direction d : {Direction::Write, Direction::Read}) {
      std::vector<Request> requests;
      std::uint64_t offset = 4097;
      for (const Place& p : places) {
        if (d == Direction::Write) {
          nvio::pattern::fill(p.buf, p.length, offset, seed);
        } else {
          std::fill(p.buf, p.buf + p.length, nvio_test::kSentinel);
        }
        Request r{fd_, d, p.buf, p.length, offset, requests.size()};
        r.region = p.region;
        requests.push_back(r);
        offset += p.length + 511;
      }
      ASSERT_NO_FATAL_FAILURE(run(engine, requests));
      const std::vector<unsigned char> file = nvio_test::read_file(path_);
      for (const Request& r : requests) {
        if (d == Direction::Write) {
          EXPECT_TRUE(nvio_test::file_range_has_pattern(file, r.offset, r.length, seed));
        } else {
          EXPECT_TRUE(nvio_test::buffer_has_pattern(r.buf, r.length, r.offset, seed));
        }
      }
    }
  }

  static std::size_t refusal_warnings() {
    const std::vector<std::string> all = nvio_test::recorded_warnings();
    return static_cast<std::size_t>(std::count_if(all.begin(), all.end(), [](const auto& m) {
      return m.find("io_uring refused to register") != std::string::npos;
    }));
  }

  nvio_test::TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

// Requests inside either of two registered regions go out as fixed ops, at odd sizes and
// unaligned places up to a region's last byte; the one outside any region as a plain op.
TEST_F(IoUringRegions, FixedOpsInsideRegionsPlainOutside) {
  auto engine = make();
  nvio::AlignedBuffer first(nvio_test::MiB);
  nvio::AlignedBuffer second(64 * 1024);
  const int a = engine->add_region(first.data(), first.size());
  if (a < 0) GTEST_SKIP() << "the kernel registered no buffer: " << engine->region_refusal();
  const int b = engine->add_region(second.data(), second.size());
  ASSERT_GE(b, 0) << engine->region_refusal();
  EXPECT_NE(a, b);
  EXPECT_EQ(engine->region_refusal(), "");
  std::vector<unsigned char> outside(70000);
  auto* f = first.bytes();
  auto* s = second.bytes();
  const std::vector<Place> places = {
      {reinterpret_cast<unsigned char*>(f) + 1, 4095, a},
      {reinterpret_cast<unsigned char*>(f) + 8191, 65536 + 7, a},
      {reinterpret_cast<unsigned char*>(f) + first.size() - 333, 333, a},
      {reinterpret_cast<unsigned char*>(s) + 5, second.size() - 5, b},
      {outside.data() + 3, outside.size() - 3, -1},
  };
  round_trip(*engine, places, 11);
  EXPECT_EQ(ring_spy().fixed.load(), 8);  // 4 writes and 4 reads
  EXPECT_EQ(ring_spy().plain.load(), 2);
}

// Each refusal leaves add_region() at -1 with its reason kept (the first one), a refused table
// stops further attempts, and the requests move the right bytes on plain ops; the memlock limit's
// refusal (ENOMEM) warns, once per process however many engines are refused, the others do not.
TEST_F(IoUringRegions, RefusedRegistrationIsToldOnceAndFallsBackToPlainOps) {
  struct Case {
    int sparse;
    int update;
    const char* call;
    const char* text;
  };
  // The refusals the user cannot change (an old kernel) first: they warn not at all.
  const Case cases[] = {
      {-EOPNOTSUPP, 0, "io_uring_register_buffers_sparse", std::strerror(EOPNOTSUPP)},
      {-EINVAL, 0, "io_uring_register_buffers_sparse", "5.19"},
      {0, -EOPNOTSUPP, "io_uring_register_buffers_update_tag", std::strerror(EOPNOTSUPP)},
      {-ENOMEM, 0, "io_uring_register_buffers_sparse", "RLIMIT_MEMLOCK"},
      {0, -ENOMEM, "io_uring_register_buffers_update_tag", std::strerror(ENOMEM)},
  };
  for (const Case& c : cases) {
    if (c.sparse == -ENOMEM) {
      EXPECT_EQ(refusal_warnings(), 0U) << "an old kernel's refusal warned";
    }
    SCOPED_TRACE(testing::Message() << c.call << " " << c.sparse << " " << c.update);
    ring_spy().reset();
    ring_spy().refuse_sparse = c.sparse;
    ring_spy().refuse_update = c.update;
    auto engine = make();
    nvio::AlignedBuffer slab(256 * 1024);
    EXPECT_EQ(engine->add_region(slab.data(), slab.size()), -1);
    const std::string why = engine->region_refusal();
    EXPECT_TRUE(nvio_test::contains(why, c.call));
    EXPECT_TRUE(nvio_test::contains(why, c.text));
    EXPECT_EQ(engine->add_region(slab.data(), slab.size()), -1);
    EXPECT_EQ(engine->region_refusal(), why) << "the first refusal is the one kept";
    EXPECT_EQ(ring_spy().sparse.load(), 1);
    EXPECT_EQ(ring_spy().updates.load(), c.sparse != 0 ? 0 : 2) << "regions offered to no table";
    auto* p = reinterpret_cast<unsigned char*>(slab.bytes());
    round_trip(*engine, {{p + 3, 4093, -1}, {p + 4096, 65536 + 1, -1}}, 20);
    EXPECT_EQ(ring_spy().fixed.load(), 0);
    EXPECT_EQ(ring_spy().plain.load(), 4);
  }
  EXPECT_EQ(refusal_warnings(), 1U);
}

// The engine probe says whether registered buffers work here (what `nvio report` shows, and the
// handle's engine_reason through it).
TEST_F(IoUringRegions, TheProbeSaysWhetherRegisteredBuffersWork) {
  const std::string& reason = nvio::probe_engine(EngineKind::IoUring).reason;
  EXPECT_NE(reason.find("registered buffers"), std::string::npos) << reason;
  nvio::Options o;
  o.engine = EngineKind::IoUring;
  o.intra_op_parallelism = 1;
  nvio::Handle h(o);
  EXPECT_TRUE(nvio_test::contains(h.engine_reason(), reason));
}

}  // namespace
