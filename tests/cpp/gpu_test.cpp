// GPU memory: the loader, the GDS decisions, and the pipelined device path. The device path runs
// everywhere against FakeDevice (fake_device.hpp); tests that need a real GPU skip with the
// reason gpu_info() gives.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/cufile.hpp"
#include "cuda/device_lane.hpp"
#include "cuda/device_ops.hpp"
#include "cuda/driver.hpp"
#include "cuda/library.hpp"
#include "engine/engine.hpp"
#include "fake_device.hpp"
#include "memory/bounce_pool.hpp"
#include "nvio/swapper.hpp"
#include "test_util.hpp"

namespace nvio_test {
namespace {

using nvio::GdsMode;
using nvio::GpuDirect;
using nvio::MemoryKind;
namespace cuda = nvio::cuda;

// ---- loader ----------------------------------------------------------------------------------

const char* fake_env(const char* name) {
  return std::string(name) == "NVIO_TEST_LIB" ? "/nonexistent/libmissing.so.0" : nullptr;
}

TEST(GpuLoader, MissingOverrideIsUnavailableWithTheLoaderReason) {
  cuda::Library lib = cuda::Library::load("NVIO_TEST_LIB", {"libc.so.6"}, fake_env);
  EXPECT_FALSE(lib);
  EXPECT_EQ(lib.path(), "/nonexistent/libmissing.so.0");
  EXPECT_TRUE(contains(lib.error(), "/nonexistent/libmissing.so.0"));
  EXPECT_TRUE(contains(lib.error(), "(from NVIO_TEST_LIB)"));
  EXPECT_EQ(lib.symbol("malloc"), nullptr);
}

TEST(GpuLoader, FirstCandidateThatLoadsWins) {
  cuda::Library lib =
      cuda::Library::load("NVIO_TEST_UNSET", {"libnvio-missing.so.9", "libc.so.6"}, fake_env);
  ASSERT_TRUE(lib) << lib.error();
  EXPECT_EQ(lib.path(), "libc.so.6");
  EXPECT_NE(lib.symbol("malloc"), nullptr);
  EXPECT_TRUE(cuda::Library::is_loaded("libc.so.6"));
  EXPECT_FALSE(cuda::Library::is_loaded("libnvio-missing.so.9"));
}

TEST(GpuLoader, DriverAndCuFileFromAMissingLibraryAreUnavailable) {
  const cuda::Driver d = cuda::load_driver(cuda::Library::load("NVIO_TEST_LIB", {}, fake_env));
  EXPECT_FALSE(d.ok);
  EXPECT_TRUE(contains(d.reason, "libmissing.so.0"));
  const cuda::CuFile c = cuda::load_cufile(cuda::Library::load("NVIO_TEST_LIB", {}, fake_env));
  EXPECT_FALSE(c.loaded);
  EXPECT_TRUE(contains(c.reason, "libmissing.so.0"));
}

TEST(GpuLoader, LibraryWithoutTheSymbolsIsRejectedNamingOne) {
  // libc loads but is not a CUDA driver: the first missing symbol is named.
  const cuda::Driver d = cuda::load_driver(cuda::Library::load("NVIO_TEST_UNSET", {"libc.so.6"}));
  EXPECT_FALSE(d.ok);
  EXPECT_TRUE(contains(d.reason, "lacks cuGetErrorName"));
  const cuda::CuFile c = cuda::load_cufile(cuda::Library::load("NVIO_TEST_UNSET", {"libc.so.6"}));
  EXPECT_FALSE(c.loaded);
  EXPECT_TRUE(contains(c.reason, "lacks cuFileDriverOpen"));
}

TEST(GpuInfo, ProbeExplainsWhatItFound) {
  const nvio::GpuInfo& info = nvio::gpu_info();
  EXPECT_EQ(&info, &nvio::gpu_info());  // probed once
  EXPECT_FALSE(info.driver_reason.empty());
  EXPECT_FALSE(info.gds_reason.empty());
  EXPECT_FALSE(info.cufile_reason.empty());
  if (!info.driver_loaded) {
    EXPECT_TRUE(info.devices.empty());
    EXPECT_EQ(info.driver_version, 0);
  }
  if (!info.cufile_loaded || !info.usable()) {
    EXPECT_EQ(info.gds_mode, GdsMode::Unavailable) << info.gds_reason;
  }
  for (const auto& dev : info.devices) {
    EXPECT_FALSE(dev.name.empty());
    EXPECT_GT(dev.total_memory, 0u);
  }
}

TEST(GpuInfo, HostMemoryNeverLoadsCuda) {
  if (cuda::driver_already_loaded()) GTEST_SKIP() << "libcuda is already loaded in this process";
  std::vector<char> host(64);
  EXPECT_EQ(nvio::memory_kind(host.data()), MemoryKind::Host);
  EXPECT_FALSE(cuda::driver_already_loaded()) << "asking about host memory loaded libcuda";
}

// ---- decisions -------------------------------------------------------------------------------

TEST(GpuDecisions, GdsModeFromWhatWasFound) {
  std::string reason = "cuFileDriverOpen: CU_FILE_DRIVER_NOT_INITIALIZED";
  EXPECT_EQ(cuda::classify_gds(false, true, true, reason), GdsMode::Unavailable);
  EXPECT_TRUE(contains(reason, "CU_FILE_DRIVER_NOT_INITIALIZED"));
  EXPECT_EQ(cuda::classify_gds(true, true, false, reason), GdsMode::P2P);
  EXPECT_TRUE(contains(reason, "nvidia-fs"));
  EXPECT_EQ(cuda::classify_gds(true, false, true, reason), GdsMode::P2P);
  EXPECT_TRUE(contains(reason, "P2PDMA"));
  EXPECT_EQ(cuda::classify_gds(true, false, false, reason), GdsMode::Compatibility);
  EXPECT_TRUE(contains(reason, "compatibility"));
}

TEST(GpuDecisions, TransportFromOptionAndMode) {
  using cuda::Transport;
  struct Case {
    GpuDirect option;
    GdsMode mode;
    Transport expect;
    bool warn;
  } cases[] = {
      {GpuDirect::Off, GdsMode::P2P, Transport::Bounce, false},
      {GpuDirect::Off, GdsMode::Unavailable, Transport::Bounce, false},
      {GpuDirect::Auto, GdsMode::P2P, Transport::Gds, false},
      {GpuDirect::Auto, GdsMode::Compatibility, Transport::Bounce, false},
      {GpuDirect::Auto, GdsMode::Unavailable, Transport::Bounce, false},
      {GpuDirect::On, GdsMode::P2P, Transport::Gds, false},
      {GpuDirect::On, GdsMode::Compatibility, Transport::Gds, false},
      {GpuDirect::On, GdsMode::Unavailable, Transport::Bounce, true},
  };
  for (const Case& c : cases) {
    const auto choice = cuda::choose_transport(c.option, c.mode, "why");
    SCOPED_TRACE(std::string(nvio::to_string(c.option)) + " / " + nvio::to_string(c.mode));
    EXPECT_EQ(choice.transport, c.expect);
    EXPECT_EQ(choice.warn, c.warn);
    EXPECT_FALSE(choice.reason.empty());
    if (c.warn) {
      EXPECT_TRUE(contains(choice.reason, "why"));
    }
  }
}

TEST(GpuDecisions, CuFileErrorsHaveNamesAndText) {
  EXPECT_EQ(cuda::cufile_error_name(5008), "CU_FILE_IO_NOT_SUPPORTED");
  EXPECT_EQ(cuda::cufile_error_name(-5008), "CU_FILE_IO_NOT_SUPPORTED");
  EXPECT_EQ(cuda::cufile_error_name(5001), "CU_FILE_DRIVER_NOT_INITIALIZED");
  EXPECT_TRUE(contains(cuda::cufile_error_text(5001), "allow_compat_mode"));
  EXPECT_TRUE(contains(cuda::cufile_error_name(4242), "4242"));
}

TEST(GpuDecisions, GpuDirectOnWithoutCuFileWarnsOnce) {
  const nvio::GpuInfo& info = nvio::gpu_info();
  if (info.gds_mode != GdsMode::Unavailable)
    GTEST_SKIP() << "cuFile works here: " << info.gds_reason;
  nvio::Options o;
  o.engine = nvio::EngineKind::Psync;
  o.gpu_direct = GpuDirect::On;
  auto count = [] {
    const auto w = recorded_warnings();
    return std::count_if(w.begin(), w.end(),
                         [](const std::string& m) { return m.find("gpu_direct=on") != m.npos; });
  };
  { nvio::Handle h(o); }
  { nvio::Handle h(o); }
  EXPECT_EQ(count(), 1);
}

TEST(GpuErrors, DeviceMemoryWithoutCudaIsAGpuError) {
  if (nvio::gpu_info().usable()) GTEST_SKIP() << "a GPU is usable here";
  TempDir dir;
  nvio::Options o;
  o.engine = nvio::EngineKind::Psync;
  nvio::Handle h(o);
  std::vector<unsigned char> buf(4096);
  nvio::ReadOptions ro;
  ro.memory = MemoryKind::Device;
  write_pattern_file(dir.file("f"), 4096, 1);
  try {
    h.read(buf.data(), buf.size(), dir.file("f"), 0, ro);
    FAIL() << "no error";
  } catch (const nvio::GpuError& e) {
    EXPECT_TRUE(contains(e.what(), "CUDA driver cannot be used"));
    EXPECT_TRUE(contains(e.what(), nvio::gpu_info().driver_reason));
  }
}

// ---- the device path on the fake device ----------------------------------------------------

class DevicePath : public EngineTest {
 protected:
  nvio::Options options(std::size_t block = 64 * KiB, unsigned workers = 2) const {
    nvio::Options o = base_options();
    o.block_size = block;
    o.queue_depth = 8;
    o.intra_op_parallelism = workers;
    o.gpu_direct = GpuDirect::Off;
    return o;
  }
  static nvio::ReadOptions device_read() {
    nvio::ReadOptions r;
    r.memory = MemoryKind::Device;
    return r;
  }
  static nvio::WriteOptions device_write() {
    nvio::WriteOptions w;
    w.memory = MemoryKind::Device;
    return w;
  }
};

TEST_P(DevicePath, RoundTripsOddSizesAndOffsets) {
  ScopedFakeDevice fake;
  {
    nvio::Handle h(options());
    std::uint64_t seed = 100;
    for (std::size_t len : {std::size_t{1}, std::size_t{4095}, MiB + 123}) {
      for (std::uint64_t off : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4096 + 17}}) {
        SCOPED_TRACE("length " + std::to_string(len) + " offset " + std::to_string(off));
        ++seed;
        const std::string path = file("rt");
        ::unlink(path.c_str());
        unsigned char* src = fake->alloc(len, 1);
        nvio::pattern::fill(src, len, off, seed);
        ASSERT_NO_THROW(h.write(src, len, path, off, device_write()));
        const auto bytes = read_file(path);
        ASSERT_EQ(bytes.size(), off + len);
        EXPECT_TRUE(file_range_has_pattern(bytes, off, len, seed));
        EXPECT_TRUE(file_range_is(bytes, 0, off, 0));

        unsigned char* dst = fake->alloc(len, 1);
        std::memset(dst, kSentinel, len);
        ASSERT_NO_THROW(h.read(dst, len, path, off, device_read()));
        EXPECT_TRUE(buffer_has_pattern(dst, len, off, seed));
      }
    }
  }
  EXPECT_EQ(fake->misuse(), 0u);
  EXPECT_EQ(fake->live_objects(), 0u) << "streams, events or registrations leaked";
  EXPECT_GT(fake->copies(), 0u);
  EXPECT_EQ(fake->unregistered_copies(), 0u) << "bounce slabs must be registered with CUDA";
}

TEST_P(DevicePath, CopiesAndDiskOverlapInOneRequest) {
  ScopedFakeDevice fake;
  const std::size_t len = 4 * MiB + 4096 + 5;
  {
    nvio::Handle h(options(64 * KiB, 1));
    unsigned char* src = fake->alloc(len);
    nvio::pattern::fill(src, len, 0, 7);
    h.write(src, len, file("big"), 0, device_write());
    unsigned char* dst = fake->alloc(len);
    h.read(dst, len, file("big"), 0, device_read());
    EXPECT_TRUE(buffer_has_pattern(dst, len, 0, 7));
  }
  EXPECT_TRUE(file_range_has_pattern(read_file(file("big")), 0, len, 7));
  // 65 pieces on one worker with queue_depth 8: several copies must have been queued at once.
  EXPECT_GT(fake->max_pending(), 2u);
  EXPECT_EQ(fake->misuse(), 0u);
}

TEST_P(DevicePath, AsyncAndMixedWithHostOperations) {
  ScopedFakeDevice fake;
  nvio::Options o = options(16 * KiB, 2);
  o.overlap_events = false;  // DeepSpeed's mode: batches
  const std::size_t len = 300 * KiB + 7;
  {
    nvio::Handle h(o);
    std::vector<unsigned char*> dev;
    std::vector<GuardedBuffer> host;
    for (int i = 0; i < 4; ++i) {
      dev.push_back(fake->alloc(len));
      nvio::pattern::fill(dev.back(), len, i * len, 50);
      host.emplace_back(len, BufKind::Plus3);
      host.back().fill_pattern(i * len, 60);
      h.submit_write(dev.back(), len, file("dev"), i * len, device_write());
      h.submit_write(host.back().data(), len, file("host"), i * len);
    }
    EXPECT_EQ(h.wait(), 8u);
    for (int i = 0; i < 4; ++i) {
      std::memset(dev[i], 0, len);
      host[i].fill_sentinel();
      h.submit_read(dev[i], len, file("dev"), i * len, device_read());
      h.submit_read(host[i].data(), len, file("host"), i * len);
    }
    EXPECT_EQ(h.wait(), 8u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(buffer_has_pattern(dev[i], len, i * len, 50)) << i;
      EXPECT_TRUE(buffer_has_pattern(host[i].data(), len, i * len, 60)) << i;
      EXPECT_TRUE(host[i].guards_intact());
    }
  }
  EXPECT_EQ(fake->live_objects(), 0u);
}

// Each extent of a batch carries its own memory kind: host and device extents share one batch
// (one write's sync, one ticket), each moved by its kind's transport, and an extent's kind
// overrides the batch's.
TEST_P(DevicePath, OneBatchMixesHostAndDeviceExtents) {
  ScopedFakeDevice fake;
  const std::size_t len = 70 * KiB + 3;
  {
    nvio::Handle h(options(16 * KiB, 2));
    std::vector<unsigned char*> dev;
    std::vector<GuardedBuffer> host;
    std::vector<nvio::WriteExtent> writes;
    for (int i = 0; i < 3; ++i) {
      dev.push_back(fake->alloc(len));
      nvio::pattern::fill(dev.back(), len, 2 * i * len, 70);
      host.emplace_back(len, BufKind::Plus3);
      host.back().fill_pattern((2 * i + 1) * len, 70);
      writes.push_back({dev.back(), len, 2 * i * len, file("mixed"), MemoryKind::Device});
      writes.push_back({host.back().data(), len, (2 * i + 1) * len, file("mixed")});  // Auto
    }
    const nvio::HandleStats before = h.stats();
    h.write_batch(writes,
                  nvio::WriteOptions{nvio::Truncate::No, nvio::Durability::Data, MemoryKind::Host});
    EXPECT_TRUE(file_range_has_pattern(read_file(file("mixed")), 0, 6 * len, 70));
    std::vector<nvio::ReadExtent> reads;
    for (int i = 0; i < 3; ++i) {
      std::memset(dev[i], 0, len);
      host[i].fill_sentinel();
      reads.push_back({dev[i], len, 2 * i * len, file("mixed")});  // Auto, as the batch's
      reads.push_back({host[i].data(), len, (2 * i + 1) * len, file("mixed"), MemoryKind::Host});
    }
    h.wait(h.submit_read_batch(reads));  // Auto: each Auto extent's kind asked of CUDA
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(buffer_has_pattern(dev[i], len, 2 * i * len, 70)) << i;
      EXPECT_TRUE(buffer_has_pattern(host[i].data(), len, (2 * i + 1) * len, 70)) << i;
      EXPECT_TRUE(host[i].guards_intact()) << i;
    }
    nvio::HandleStats moved = h.stats();
    moved -= before;
    EXPECT_EQ(moved.device_bounce_bytes, 2 * 3 * len) << "the device extents went as device memory";
    EXPECT_EQ(moved.writes, 6u);
    EXPECT_EQ(moved.reads, 6u);
  }
  EXPECT_EQ(fake->misuse(), 0u);
  EXPECT_EQ(fake->live_objects(), 0u);
}

// The swapper hands host and device targets of one swap_in to the handle together, each with its
// own memory kind: every target gets its bytes, the device ones through the device path.
TEST_P(DevicePath, SwapInOfHostAndDeviceTargetsTogether) {
  ScopedFakeDevice fake;
  TempDir dir;
  {
    nvio::SwapperOptions so;
    so.budget_bytes = 16 * MiB;
    so.checksums = false;  // verified in host memory only: device targets need none
    nvio::Swapper swapper(dir.path(), so, options(16 * KiB, 2));
    const std::size_t sizes[] = {5000, 300 * KiB + 1, 64 * KiB, 1};
    std::vector<std::vector<unsigned char>> sources;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      sources.emplace_back(sizes[i]);
      nvio::pattern::fill(sources.back().data(), sizes[i], 0, 80 + i);
      swapper.swap_out("t" + std::to_string(i), sources.back().data(), sizes[i], MemoryKind::Host);
    }
    swapper.wait();
    const std::size_t copies_before = fake->copies();
    std::vector<GuardedBuffer> host;
    std::vector<nvio::Swapper::Target> targets;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      void* buf = nullptr;
      MemoryKind kind = MemoryKind::Host;
      if (i % 2 == 0) {
        buf = fake->alloc(sizes[i]);
        std::memset(buf, 0, sizes[i]);
        kind = i == 0 ? MemoryKind::Device : MemoryKind::Auto;
      } else {
        host.emplace_back(sizes[i], BufKind::Plus1);
        host.back().fill_sentinel();
        buf = host.back().data();
      }
      targets.push_back({"t" + std::to_string(i), buf, sizes[i], kind});
    }
    swapper.swap_in(targets);
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      EXPECT_TRUE(
          buffer_has_pattern(static_cast<unsigned char*>(targets[i].buf), sizes[i], 0, 80 + i))
          << i;
    }
    for (const GuardedBuffer& b : host) EXPECT_TRUE(b.guards_intact());
    EXPECT_GT(fake->copies(), copies_before) << "the device targets moved as device memory";
  }
  EXPECT_EQ(fake->misuse(), 0u);
  EXPECT_EQ(fake->live_objects(), 0u);
}

TEST_P(DevicePath, AutoDetectsDeviceMemoryAndViews) {
  ScopedFakeDevice fake;
  nvio::Handle h(options());
  const std::size_t len = 200 * KiB;
  unsigned char* base = fake->alloc(len);
  nvio::pattern::fill(base, len, 0, 9);
  EXPECT_EQ(nvio::memory_kind(base + 1000), MemoryKind::Device);
  h.write(base, len, file("auto"));  // MemoryKind::Auto
  EXPECT_TRUE(file_range_has_pattern(read_file(file("auto")), 0, len, 9));
  // A view into the middle of the allocation, at an odd offset.
  std::memset(base, 0, len);
  h.read(base + 4097, 5000, file("auto"), 4097);
  EXPECT_TRUE(buffer_has_pattern(base + 4097, 5000, 4097, 9));
  EXPECT_EQ(base[4096], 0);
  EXPECT_EQ(base[4097 + 5000], 0);
}

TEST_P(DevicePath, HostPointerGivenAsDeviceIsRefused) {
  ScopedFakeDevice fake;
  nvio::Handle h(options());
  std::vector<unsigned char> host(100);
  write_pattern_file(file("f"), 100, 1);
  try {
    h.read(host.data(), host.size(), file("f"), 0, device_read());
    FAIL() << "no error";
  } catch (const nvio::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "not know it as device memory"));
    EXPECT_TRUE(contains(e.what(), file("f")));
  }
}

TEST_P(DevicePath, CopyErrorsBecomeGpuErrors) {
  ScopedFakeDevice fake;
  const std::size_t len = 512 * KiB + 3;
  nvio::Handle h(options(64 * KiB, 2));
  unsigned char* dev = fake->alloc(len);
  nvio::pattern::fill(dev, len, 0, 3);
  write_pattern_file(file("src"), len, 3);
  for (bool at_call : {true, false}) {
    SCOPED_TRACE(at_call ? "error from the copy call" : "error reported by the event");
    fake->fail_copy(3, FakeDevice::kIllegalAddress, at_call);
    try {
      h.write(dev, len, file("e"), 0, device_write());
      FAIL() << "no error";
    } catch (const nvio::GpuError& e) {
      EXPECT_EQ(e.code(), FakeDevice::kIllegalAddress);
      EXPECT_EQ(e.code_name(), "CUDA_ERROR_ILLEGAL_ADDRESS");
      EXPECT_EQ(e.api(), "cuMemcpyDtoHAsync");
      EXPECT_EQ(e.path(), file("e"));
      EXPECT_GT(e.length(), 0u);
      EXPECT_TRUE(contains(e.what(), "fake device error 700"));
    }
    fake->fail_copy(2, FakeDevice::kLaunchFailure, at_call);
    try {
      h.read(dev, len, file("src"), 0, device_read());
      FAIL() << "no error";
    } catch (const nvio::GpuError& e) {
      EXPECT_EQ(e.api(), "cuMemcpyHtoDAsync");
      EXPECT_EQ(e.code_name(), "CUDA_ERROR_LAUNCH_FAILED");
      EXPECT_EQ(e.path(), file("src"));
    }
    // The handle still works afterwards.
    h.write(dev, len, file("ok"), 0, device_write());
    EXPECT_TRUE(file_range_has_pattern(read_file(file("ok")), 0, len, 3));
  }
}

// Defect: when cuEventRecord failed after the copy was queued, the slot's chunk went back to the
// pool while the copy could still be running. Now the stream is synchronised first, and a chunk
// that cannot be proven idle is never reused.
TEST_P(DevicePath, FailedEventRecordWaitsForTheCopyBeforeReusingItsChunk) {
  ScopedFakeDevice fake;
  const std::size_t len = 512 * KiB + 3;
  {
    nvio::Handle h(options(64 * KiB, 1));
    unsigned char* dev = fake->alloc(len);
    nvio::pattern::fill(dev, len, 0, 5);
    fake->fail_record(2, FakeDevice::kIllegalAddress);
    try {
      h.write(dev, len, file("r"), 0, device_write());
      FAIL() << "no error";
    } catch (const nvio::GpuError& e) {
      EXPECT_EQ(e.api(), "cuEventRecord");
      EXPECT_EQ(e.path(), file("r"));
    }
    EXPECT_GE(fake->stream_syncs(), 1u) << "the chunk was released while its copy could run";
    // The stream cannot be synchronised either: the operation fails, the chunk is set aside.
    write_pattern_file(file("src"), len, 5);
    fake->fail_record(1, FakeDevice::kIllegalAddress);
    fake->fail_stream_sync(FakeDevice::kIllegalAddress);
    EXPECT_THROW(h.read(dev, len, file("src"), 0, device_read()), nvio::GpuError);
    fake->fail_stream_sync(0);
    // The handle goes on working with its other chunks. A new buffer: the copy in doubt may
    // still write into the old one (documented for that case), which TSan rightly reports.
    unsigned char* fresh = fake->alloc(len);
    h.read(fresh, len, file("src"), 0, device_read());
    EXPECT_TRUE(buffer_has_pattern(fresh, len, 0, 5));
  }
  EXPECT_EQ(fake->misuse(), 0u);
}

// A failure reported when an event is checked fails the operation with a GpuError.
TEST_P(DevicePath, FailedEventCheckFailsTheOperation) {
  ScopedFakeDevice fake;
  const std::size_t len = 256 * KiB + 9;
  nvio::Handle h(options(64 * KiB, 1));
  unsigned char* dev = fake->alloc(len);
  write_pattern_file(file("src"), len, 6);
  fake->fail_event_sync(2, FakeDevice::kLaunchFailure);
  try {
    h.read(dev, len, file("src"), 0, device_read());
    FAIL() << "no error";
  } catch (const nvio::GpuError& e) {
    EXPECT_EQ(e.code(), FakeDevice::kLaunchFailure);
    EXPECT_EQ(e.path(), file("src"));
  }
  h.read(dev, len, file("src"), 0, device_read());
  EXPECT_TRUE(buffer_has_pattern(dev, len, 0, 6));
}

TEST_P(DevicePath, ShortFileOnDeviceReadIsTyped) {
  ScopedFakeDevice fake;
  nvio::Handle h(options());
  write_pattern_file(file("short"), 1000, 1);
  unsigned char* dev = fake->alloc(5000);
  EXPECT_THROW(h.read(dev, 5000, file("short"), 0, device_read()), nvio::ShortFile);
}

INSTANTIATE_TEST_SUITE_P(Engines, DevicePath, NVIO_ALL_ENGINES, EngineParamName());

// Defect: a DeviceLane left its slab hook in the bounce pool when destroyed, so a slab allocated
// later was registered through a destroyed lane.
TEST(DeviceLaneTest, DestroyedLaneLeavesNoHookInThePool) {
  ScopedFakeDevice fake;
  nvio::detail::BouncePool pool(4096, 16);
  (void)pool.acquire();
  {
    cuda::DeviceLane lane(cuda::device_ops(), 4, pool);
    EXPECT_EQ(fake->live_objects(), 1u) << "the existing slab is registered";
  }
  EXPECT_EQ(fake->live_objects(), 0u);
  for (int i = 0; i < 7; ++i) (void)pool.acquire();  // new slabs
  EXPECT_EQ(fake->live_objects(), 0u) << "a destroyed lane's hook registered a new slab";
}

// ---- real GPU ----------------------------------------------------------------------------------

class RealGpu : public ::testing::TestWithParam<GpuDirect> {
 protected:
  void SetUp() override {
    const nvio::GpuInfo& info = nvio::gpu_info();
    if (!info.usable()) GTEST_SKIP() << "no usable GPU: " << info.driver_reason;
    if (GetParam() == GpuDirect::On && info.gds_mode == GdsMode::Unavailable) {
      GTEST_SKIP() << "GPUDirect Storage unavailable: " << info.gds_reason;
    }
  }
};

TEST_P(RealGpu, RoundTripsOddSizesAndOffsets) {
  TempDir dir;
  nvio::Options o;
  o.block_size = 256 * KiB;
  o.intra_op_parallelism = 2;
  o.gpu_direct = GetParam();
  nvio::Handle h(o);
  std::uint64_t seed = 1;
  for (std::size_t len : {std::size_t{1}, std::size_t{4095}, MiB + 123}) {
    for (std::uint64_t off : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4096 + 17}}) {
      SCOPED_TRACE("length " + std::to_string(len) + " offset " + std::to_string(off));
      ++seed;
      std::vector<unsigned char> host(len);
      nvio::pattern::fill(host.data(), len, off, seed);
      nvio::DeviceBuffer dev(len + 64);
      dev.copy_from_host(host.data(), len, 64);  // a view 64 bytes into the allocation
      auto* view = static_cast<unsigned char*>(dev.data()) + 64;
      const std::string path = dir.file("g");
      ::unlink(path.c_str());
      h.write(view, len, path, off);  // Auto: libcuda is loaded now
      EXPECT_TRUE(file_range_has_pattern(read_file(path), off, len, seed));
      nvio::DeviceBuffer back(len);
      nvio::ReadOptions ro;
      ro.memory = MemoryKind::Device;
      h.read(back.data(), len, path, off, ro);
      std::vector<unsigned char> check(len);
      back.copy_to_host(check.data(), len);
      EXPECT_TRUE(buffer_has_pattern(check.data(), len, off, seed));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, RealGpu, ::testing::Values(GpuDirect::Off, GpuDirect::On),
                         [](const auto& info) {
                           return info.param == GpuDirect::On ? "Gds" : "Bounce";
                         });

}  // namespace
}  // namespace nvio_test

namespace nvio_test {
namespace {

// ---- cuFile as an engine ---------------------------------------------------------------------

// Fake cuFile calls: transfers go to the request's descriptor with pread/pwrite, so the engine's
// shape (a synchronous call in submit, results handed back by reap) and its error decoding are
// tested without a GPU. `cufile_code` (when set) is returned by every transfer instead.
struct FakeCuFile {
  std::vector<int> devices;  // make_current calls
  int refuse_device = -1;    // make_current fails for it with CUDA_ERROR_INVALID_DEVICE (101)
  std::int64_t cufile_code = 0;
  nvio::engine::CuFileCalls calls() {
    nvio::engine::CuFileCalls c;
    c.make_current = [this](int device) {
      devices.push_back(device);
      return device == refuse_device ? 101 : 0;
    };
    c.transfer = [this](const nvio::engine::Request& r) -> std::int64_t {
      if (cufile_code != 0) return cufile_code;
      const ssize_t n = r.direction == nvio::engine::Direction::Read
                            ? ::pread(r.fd, r.buf, r.length, static_cast<off_t>(r.offset))
                            : ::pwrite(r.fd, r.buf, r.length, static_cast<off_t>(r.offset));
      return n < 0 ? -errno : n;
    };
    c.error_name = [](int) { return std::string("CUDA_ERROR_INVALID_DEVICE"); };
    c.error_string = [](int) { return std::string("invalid device ordinal"); };
    return c;
  }
};

TEST(CuFileEngine, TransfersInSubmitAndHandsResultsBackInReap) {
  TempDir dir;
  const std::string path = dir.file("f");
  write_pattern_file(path, 64 * KiB, 31);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  FakeCuFile fake;
  auto eng = nvio::engine::make_cufile_engine(fake.calls());
  EXPECT_STREQ(eng->name(), "cuFile");
  EXPECT_EQ(eng->kind(), nvio::EngineKind::CuFile) << "an engine kind of its own, not psync's";
  std::vector<unsigned char> a(4096), b(8192);
  nvio::engine::Request reqs[2] = {
      {fd, nvio::engine::Direction::Read, a.data(), a.size(), 4096, 7, nullptr, 1},
      {fd, nvio::engine::Direction::Read, b.data(), b.size(), 16384, 9, nullptr, 0}};
  ASSERT_EQ(eng->submit(reqs), 2);
  EXPECT_EQ(fake.devices, (std::vector<int>{1, 0})) << "each request's device made current";
  nvio::engine::Completion out[4];
  ASSERT_EQ(eng->reap(out, 2), 2);
  EXPECT_EQ(out[0].tag, 7u);
  EXPECT_EQ(out[0].result, 4096);
  EXPECT_EQ(out[1].tag, 9u);
  EXPECT_EQ(out[1].result, 8192);
  EXPECT_TRUE(buffer_has_pattern(a.data(), a.size(), 4096, 31));
  EXPECT_TRUE(buffer_has_pattern(b.data(), b.size(), 16384, 31));
  EXPECT_EQ(eng->reap(out, 0), 0);
  EXPECT_EQ(eng->cancel(), 0);
  ::close(fd);
}

// Registration goes through the engine layer: the kernel engines need none; cuFile's is the
// driver's, which cannot be had here (no GPU) and is refused as a GpuError naming the file. The
// handle refuses cuFile as its own engine: device memory reaches it through gpu_direct.
TEST(CuFileEngine, FilesAreRegisteredThroughTheEngineLayer) {
  TempDir dir;
  const std::string path = dir.file("reg");
  write_pattern_file(path, 4096, 1);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (nvio::EngineKind k :
       {nvio::EngineKind::IoUring, nvio::EngineKind::Libaio, nvio::EngineKind::Psync}) {
    EXPECT_EQ(nvio::engine::register_file(k, fd, path), nullptr) << nvio::to_string(k);
  }
  if (nvio::gpu_info().gds_mode == nvio::GdsMode::Unavailable) {
    try {
      (void)nvio::engine::register_file(nvio::EngineKind::CuFile, fd, path);
      ADD_FAILURE() << "cuFile registered a file without cuFile";
    } catch (const nvio::GpuError& e) {
      EXPECT_TRUE(contains(e.what(), "cuFile") || contains(e.what(), "CUDA")) << e.what();
    }
  }
  ::close(fd);
  nvio::Options o;
  o.engine = nvio::EngineKind::CuFile;
  try {
    nvio::Handle h(o);
    ADD_FAILURE() << "a handle accepted engine=cuFile";
  } catch (const nvio::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "gpu_direct")) << e.what();
  }
  EXPECT_THROW((void)nvio::parse_engine("cufile"), nvio::InvalidArgument);
  EXPECT_STREQ(nvio::to_string(nvio::EngineKind::CuFile), "cuFile");
}

TEST(CuFileEngine, DecodesItsOwnErrors) {
  FakeCuFile fake;
  fake.refuse_device = 3;
  auto eng = nvio::engine::make_cufile_engine(fake.calls());
  unsigned char byte = 0;
  nvio::engine::Request r{-1, nvio::engine::Direction::Read, &byte, 1, 0, 1, nullptr, 3};
  ASSERT_EQ(eng->submit(std::span(&r, 1)), 1);
  nvio::engine::Completion c{};
  ASSERT_EQ(eng->reap(std::span(&c, 1), 1), 1);
  try {
    std::rethrow_exception(eng->error(nvio::IoOp::Read, "/f", 0, 1, c.result, ""));
  } catch (const nvio::GpuError& e) {
    EXPECT_EQ(e.api(), "cuCtxSetCurrent");
    EXPECT_EQ(e.code(), 101);
    EXPECT_EQ(e.path(), "/f");
  }
  // A cuFile error code (above CUFILEOP_BASE_ERR) becomes a GpuError naming it.
  fake.cufile_code = -(cuda::abi::kCuFileOpBaseErr + 11);
  r.device = 0;
  ASSERT_EQ(eng->submit(std::span(&r, 1)), 1);
  ASSERT_EQ(eng->reap(std::span(&c, 1), 1), 1);
  try {
    std::rethrow_exception(eng->error(nvio::IoOp::Write, "/f", 4096, 512, c.result, ""));
  } catch (const nvio::GpuError& e) {
    EXPECT_EQ(e.api(), "cuFileWrite");
    EXPECT_EQ(e.code(), cuda::abi::kCuFileOpBaseErr + 11);
    EXPECT_EQ(e.code_name(), cuda::cufile_error_name(cuda::abi::kCuFileOpBaseErr + 11));
    EXPECT_EQ(e.offset(), 4096u);
  }
  // A plain errno stays an IoError, saying cuFile.
  try {
    std::rethrow_exception(eng->error(nvio::IoOp::Read, "/f", 0, 1, -EIO, ""));
  } catch (const nvio::IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_TRUE(contains(e.what(), "cuFile"));
  }
}

}  // namespace
}  // namespace nvio_test
