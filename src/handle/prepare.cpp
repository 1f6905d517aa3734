// Preparing requests (handle/prepare.hpp): the checks of a call's arguments, the choice of the
// file's descriptors, and the plan of each operation.
#include "handle/prepare.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>

#include "core/pool.hpp"
#include "cuda/device_ops.hpp"
#include "cuda/transport.hpp"
#include "handle/opened.hpp"
#include "handle/plan.hpp"
#include "handle/residency.hpp"
#include "nvio/errors.hpp"
#include "nvio/system.hpp"
#include "nvio/warnings.hpp"

namespace nvio::detail {
namespace {

using engine::Direction;

void plan(Operation& op, std::size_t block_size, DirectIo direct, CachedReads cached_reads) {
  if (detail::plan_cached_whole(op, direct, cached_reads)) op.direct_fd = -1;
  if (op.direct_fd < 0) {
    op.plan = detail::plan_whole(op.offset, op.length, block_size, false);
    op.piece_count = op.plan.piece_count();
    return;
  }
  // The facts check_target had for the same file (through the buffered or the caller's
  // descriptor): the direct-I/O alignment belongs to the inode, not to the descriptor.
  const detail::FileFacts& facts = op.file->facts;
  const DirectIoInfo& dio = facts.direct_io;
  bool use_direct = dio.supported;
  std::size_t shift = 0;
  if (use_direct) {
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t align = detail::split_alignment(dio.offset_align, page, facts.block_size);
    op.dio_offset_align = std::max<std::uint32_t>(dio.offset_align, 1);
    op.mem_align = std::max<std::uint32_t>(dio.mem_align, 1);
    op.plan = detail::plan_split(op.offset, op.length, block_size, align);
    const auto middle = reinterpret_cast<std::uintptr_t>(op.user(op.plan.head_end));
    // A host read whose middle is not aligned for the kernel lands shifted in the caller's
    // memory when it has pieces enough (plan_shifted); other such middles, and device memory
    // (edges included), go through bounce chunks. Host edges never do.
    if (op.is_read() && op.memory == MemoryKind::Host) {
      shift = detail::plan_shifted(op.plan, middle, op.mem_align, page, align);
    }
    const bool bounced = op.memory == MemoryKind::Device ||
                         (op.plan.middle_pieces() > 0 && middle % op.mem_align != 0 && shift == 0);
    // A bounce chunk holds block_size bytes (whole pages). Where the split granularity is larger
    // (a file system with an st_blksize above block_size: NFS, XFS mounted with largeio), the
    // middle's pieces are as long as a chunk when they bounce: inside the middle a piece needs
    // only the kernel's alignment, and its ends stay at the split alignment, away from the
    // edges. A device-memory edge (up to the split alignment long) cannot be cut so: such an
    // operation goes through the page cache instead, where pieces are block_size long. A
    // shifted read needs no chunk: its pieces land in the caller's memory, its tail in a buffer
    // of its own.
    const std::size_t chunk = detail::bounce_chunk_size(block_size);
    if (bounced && align > chunk) {
      if (op.memory == MemoryKind::Host &&
          chunk % std::max<std::uint64_t>(op.dio_offset_align, op.mem_align) == 0) {
        op.plan.piece_size = chunk;
      } else if (direct == DirectIo::On) {
        throw InvalidArgument(fmt::format(
            "{}: its file system splits direct I/O at {} bytes, more than the block size {} "
            "that bounce buffers hold, and direct=on forbids buffered I/O for this unaligned "
            "or device-memory transfer: raise block_size to at least {}",
            op.path, align, block_size, align));
      } else {
        warn(fmt::format("{}: its file system splits direct I/O at {} bytes, more than the "
                         "block size {} that bounce buffers hold; this unaligned or "
                         "device-memory transfer uses buffered I/O (raise block_size to at least "
                         "{} for direct I/O)",
                         op.path, align, block_size, align),
             "bounce-split");
        use_direct = false;
      }
    }
    if (use_direct && (op.plan.has_head() || (op.plan.has_tail() && !op.plan.tail_direct)) &&
        op.buffered_fd < 0) {
      throw InvalidArgument(fmt::format(
          "{}: offset {} and length {} are not aligned to {} bytes, and no buffered descriptor "
          "could be opened for the unaligned edges (is /proc mounted?)",
          op.path, op.offset, op.length, align));
    }
    if (use_direct && shift > 0) {
      op.shifted = std::make_unique<detail::ShiftedRead>(
          shift, op.plan.middle_pieces() + 1,
          static_cast<std::size_t>(op.plan.end - op.plan.tail_begin),
          std::max<std::size_t>(op.mem_align, page));
    }
  }
  if (!use_direct) {
    op.direct_fd = -1;
    op.plan = detail::plan_whole(op.offset, op.length, block_size, false);
  }
  detail::mark_cached_pieces(op);
  op.piece_count = op.plan.piece_count();
}

// The checks of a path that open() needs.
void check_path(const std::string& path) {
  if (path.empty()) throw InvalidArgument("file path is empty");
  if (const std::size_t nul = path.find('\0'); nul != std::string::npos) {
    // open() would stop at the NUL and use a different, shorter name.
    throw InvalidArgument(
        fmt::format("file path '{}' holds a NUL byte at position {}", path.substr(0, nul), nul));
  }
}

// Sets `op`'s descriptors: an nvio::File's, those `same_file` (an earlier extent of the batch)
// has, or the handle's FileCache's.
void use_file(Operation& op, const FileRef& file, const Operation* same_file, FileCache& files) {
  switch (file.kind()) {
    case FileRef::Kind::Opened:
      use_opened(op, *file.opened());  // an nvio::File's: no system call
      return;
    case FileRef::Kind::Path:
      check_path(file.path());
      if (same_file != nullptr) {
        share_file(op, *same_file);
      } else {
        files.open_path(op);
      }
      return;
    case FileRef::Kind::Fd:
      if (file.fd() < 0) {
        throw InvalidArgument(fmt::format("file descriptor {} is negative", file.fd()));
      }
      if (same_file != nullptr) {
        share_file(op, *same_file);
      } else {
        files.adopt_fd(op, file.fd());
      }
      return;
    case FileRef::Kind::None: break;
  }
  throw InvalidArgument("no file given: neither a path nor a file descriptor");
}

}  // namespace

OperationPtr Preparer::operation(Direction dir, std::byte* buf, std::size_t length,
                                 const FileRef& file, std::uint64_t offset,
                                 const WriteOptions& wopts, const Operation* same_file) const {
  // A handle whose worker died runs nothing more (see Worker::die in worker.cpp).
  if (std::exception_ptr dead = queue_.worker_failure()) std::rethrow_exception(dead);
  auto op = std::allocate_shared<Operation>(PoolAllocator<Operation>{});
  op->direction = dir;
  // A caller's descriptor is named for messages from /proc, which costs a readlink: only when a
  // message needs it, or when FileCache sees the descriptor for the first time.
  std::string fd_label;  // a caller's descriptor named for a message, until its file names it
  if (file.is_path()) op->path = NameRef(file.path());
  if (const Opened* opened = file.opened()) op->path = NameRef(*opened->file->name);
  auto name = [&]() -> const std::string& {
    if (op->path.empty_name()) {
      fd_label = fd_name(file.fd());
      op->path = NameRef(fd_label);
    }
    return op->path;
  };
  op->buf = buf;
  op->offset = offset;
  op->length = length;
  op->write_options = wopts;
  if (buf == nullptr && length > 0) {
    throw InvalidArgument(fmt::format("{}: buffer is null but length is {}", name(), length));
  }
  if (offset > std::numeric_limits<std::uint64_t>::max() - length ||
      offset + length > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    throw InvalidArgument(fmt::format("{}: offset {} + length {} is past the largest file offset",
                                      name(), offset, length));
  }
  op->memory = wopts.memory;
  if (op->memory == MemoryKind::Auto) op->memory = length > 0 ? memory_kind(buf) : MemoryKind::Host;
  if (op->memory == MemoryKind::Device && length > 0) {
    op->device_ops = cuda::device_ops();  // GpuError when CUDA cannot be used
    const std::optional<int> device = op->device_ops->device_of(buf);
    if (!device) {
      throw InvalidArgument(fmt::format(
          "{}: the buffer at {} was given as device memory, but CUDA does not know it as device "
          "memory",
          name(), static_cast<const void*>(buf)));
    }
    op->device = *device;
  } else {
    op->memory = MemoryKind::Host;
  }
  use_file(*op, file, same_file, files_);
  plan(*op, options_.block_size, options_.direct, options_.cached_reads);
  if (op->memory == MemoryKind::Device) prepare_device(*op);
  op->remaining.store(op->piece_count);
  return op;
}

namespace {

// The device-direct engine's registration of `op`'s direct descriptor: the file's, made once and
// kept with it, when the file owns that descriptor; else one of the operation's own, since a
// caller's descriptor may be closed, and its number reused for another file, while the handle
// keeps the file.
std::shared_ptr<const engine::FileRegistration> device_direct_registration(const Operation& op) {
  const auto make = [&] {
    return engine::register_file(engine::kDeviceDirectEngine, op.direct_fd, op.path);
  };
  if (op.file->direct && op.file->direct.get() == op.direct_fd) {
    return op.file->registration(make);
  }
  return make();
}

}  // namespace

void Preparer::prepare_device(Operation& op) const {
  // A test's fake device memory is host memory: the device-direct engine must never see it.
  if (options_.gpu_direct == GpuDirect::Off || cuda::device_ops_override()) return;
  const GpuInfo& info = gpu_info();
  cuda::TransportChoice choice =
      cuda::choose_transport(options_.gpu_direct, info.gds_mode, info.gds_reason);
  if (choice.transport == cuda::Transport::Gds && op.direct_fd < 0) {
    choice = {cuda::Transport::Bounce, options_.gpu_direct == GpuDirect::On,
              fmt::format("gpu_direct=on but '{}' cannot be opened with O_DIRECT, which {} "
                          "needs; device memory moves through the host bounce path",
                          op.path, to_string(engine::kDeviceDirectEngine))};
  }
  if (choice.transport == cuda::Transport::Gds) {
    try {
      op.registration = device_direct_registration(op);
    } catch (const GpuError& e) {
      choice = {cuda::Transport::Bounce, options_.gpu_direct == GpuDirect::On,
                std::string(e.what()) + "; device memory moves through the host bounce path"};
    }
  }
  if (choice.warn) warn(choice.reason, "gds-fallback");
  op.transport = choice.transport;
  if (op.device_direct()) {
    // The device-direct engine takes any offset and length itself: the whole request is cut into
    // block_size pieces on the O_DIRECT descriptor, with no buffered edges.
    op.plan = plan_whole(op.offset, op.length, options_.block_size, true);
    op.piece_count = op.plan.piece_count();
  }
}

template <class Extent>
JobPtr Preparer::batch(Direction dir, std::span<const Extent> extents, const WriteOptions& wopts,
                       const FileRef* all_on) const {
  if (wopts.truncate == Truncate::AtEnd) {
    throw InvalidArgument(
        "truncate=at_end does not apply to a batch (its extents end in different places): "
        "truncate with a single write, or with ftruncate after the batch");
  }
  JobPtr job = make_job();
  job->ops.reserve(extents.size());
  std::shared_ptr<BatchFinish> finish;
  WriteOptions per_extent = wopts;
  if (dir == Direction::Write) {
    finish = std::make_shared<BatchFinish>();
    finish->durability = wopts.durability;
    finish->left.store(extents.size());
    per_extent.durability = Durability::None;  // once per file, by the batch's last extent
  }
  // The first operation on each file named in the batch.
  std::map<std::string, const Operation*> by_path;
  std::map<int, const Operation*> by_fd;
  const Operation* on_opened = nullptr;
  const Operation* unnamed = nullptr;  // no file: operation() refuses it
  const auto first_on = [&](const FileRef& file) -> const Operation*& {
    switch (file.kind()) {
      case FileRef::Kind::Path: return by_path[file.path()];
      case FileRef::Kind::Fd: return by_fd[file.fd()];
      case FileRef::Kind::Opened: return on_opened;
      case FileRef::Kind::None: break;
    }
    return unnamed;
  };
  for (const Extent& e : extents) {
    const FileRef& file = all_on != nullptr ? *all_on : e.file;
    const Operation*& first = first_on(file);
    const Operation* same = first;
    auto* bytes = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(e.buf)));
    per_extent.memory = e.memory == MemoryKind::Auto ? wopts.memory : e.memory;
    OperationPtr op = operation(dir, bytes, e.length, file, e.offset, per_extent, same);
    if (same == nullptr) {
      first = op.get();
      if (finish) finish->files.push_back(op->file);
    }
    op->batch = finish;
    job->ops.push_back(std::move(op));
  }
  return job;
}

template JobPtr Preparer::batch<ReadExtent>(Direction, std::span<const ReadExtent>,
                                            const WriteOptions&, const FileRef*) const;
template JobPtr Preparer::batch<WriteExtent>(Direction, std::span<const WriteExtent>,
                                             const WriteOptions&, const FileRef*) const;

}  // namespace nvio::detail
