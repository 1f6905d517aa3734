// StripedHandle: one batch per drive over the drives' own handles (see nvio/stripe.hpp).
#include "nvio/stripe.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <string>

#include "core/posix.hpp"
#include "nvio/errors.hpp"
#include "nvio/interrupt.hpp"

namespace nvio {

namespace {

constexpr std::size_t kStripeAlign = 4096;
// The extended attribute that records a part's place in its layout (see nvio/stripe.hpp).
constexpr const char* kLayoutAttr = "user.nvio.stripe";
// The extended attribute that records the striped file's logical size in each part, set whenever
// a write resizes the parts: a part truncated to a stripe boundary leaves sizes that fit a smaller
// striped file, which only this record tells apart.
constexpr const char* kLengthAttr = "user.nvio.stripe.length";

using Clock = std::chrono::steady_clock;

void check_name(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    throw InvalidArgument(fmt::format(
        "striped file name '{}' is not a plain file name (empty, '.', '..', or holding '/' or NUL)",
        name));
  }
}

// A range whose end is past what a file offset can hold (off_t) is refused before anything starts.
void check_range(const std::string& name, std::uint64_t offset, std::size_t length) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (offset > kMax || length > kMax - offset) {
    throw InvalidArgument(
        fmt::format("striped file '{}': offset {} + length {} is past the largest file offset {}",
                    name, offset, length, kMax));
  }
}

// The extents of [offset, offset + length) of the striped file, one list per drive. Stripes that
// follow each other in both the buffer and a part file (one drive) are merged into one extent.
template <class Extent, class Byte>
std::vector<std::vector<Extent>> split(const StripeLayout& layout, Byte* buf, std::size_t length,
                                       std::uint64_t offset,
                                       const std::vector<std::string>& parts) {
  const std::size_t n = layout.directories.size();
  const std::uint64_t stripe = layout.stripe_size;
  std::vector<std::vector<Extent>> per_drive(n);
  for (std::uint64_t at = offset, end = offset + length; at < end;) {
    const std::uint64_t k = at / stripe;
    const std::uint64_t within = at % stripe;
    const std::size_t take = static_cast<std::size_t>(std::min(stripe - within, end - at));
    const std::size_t drive = static_cast<std::size_t>(k % n);
    const std::uint64_t part_offset = (k / n) * stripe + within;
    Byte* from = buf + (at - offset);
    std::vector<Extent>& list = per_drive[drive];
    if (!list.empty() && list.back().offset + list.back().length == part_offset &&
        static_cast<Byte*>(list.back().buf) + list.back().length == from) {
      list.back().length += take;
    } else {
      Extent e;
      e.buf = from;
      e.length = take;
      e.offset = part_offset;
      e.file = parts[drive];
      list.push_back(std::move(e));
    }
    at += take;
  }
  return per_drive;
}

Ticket submit(Handle& h, std::span<const ReadExtent> extents, const ReadOptions& options) {
  return h.submit_read_batch(extents, options);
}
Ticket submit(Handle& h, std::span<const WriteExtent> extents, const WriteOptions& options) {
  return h.submit_write_batch(extents, options);
}

}  // namespace

void StripeLayout::validate() const {
  if (directories.empty()) throw InvalidArgument("a striped file needs at least one directory");
  std::set<std::string> seen;
  for (const std::string& d : directories) {
    if (d.empty() || d.find('\0') != std::string::npos) {
      throw InvalidArgument(fmt::format("stripe directory '{}' is empty or holds a NUL byte", d));
    }
    if (!seen.insert(d).second) {
      throw InvalidArgument(fmt::format("stripe directory '{}' is given twice", d));
    }
  }
  if (stripe_size == 0 || stripe_size % kStripeAlign != 0) {
    throw InvalidArgument(
        fmt::format("stripe_size {} is not a positive multiple of {}", stripe_size, kStripeAlign),
        "stripe_size");
  }
}

std::uint64_t StripeLayout::part_size(std::size_t drive, std::uint64_t size) const {
  const std::uint64_t n = directories.size();
  const std::uint64_t full = size / stripe_size;
  const std::uint64_t rest = size % stripe_size;
  std::uint64_t stripes = full / n + (drive < full % n ? 1 : 0);
  return stripes * stripe_size + (drive == full % n ? rest : 0);
}

std::string StripeLayout::part_path(std::size_t drive, const std::string& name) const {
  if (drive >= directories.size()) {
    throw InvalidArgument(
        fmt::format("drive {} of a striped file over {} directories", drive, directories.size()));
  }
  return directories[drive] + "/" + name;
}

struct StripedHandle::Impl {
  StripeLayout layout;
  std::vector<std::unique_ptr<Handle>> handles;  // one per directory, in its order
  // Held while a write sizes the parts: see size_parts. Covers the threads of this handle only
  // (another process or StripedHandle resizing the same file is not serialised, as with any file).
  mutable std::mutex sizing_mutex;

  std::vector<std::string> parts(const std::string& name) const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < layout.directories.size(); ++i) {
      out.push_back(layout.part_path(i, name));
    }
    return out;
  }
  std::string display(const std::string& name) const {
    return fmt::format("{} (striped over {})", name, fmt::join(layout.directories, ", "));
  }
  // What part `drive` records of its layout.
  std::string record(std::size_t drive) const {
    return fmt::format("nvio stripe v1: part {} of {}, stripe_size {}", drive,
                       layout.directories.size(), layout.stripe_size);
  }
  struct PartState {
    std::int64_t size = -1;    // -1: missing
    bool recorded = false;     // holds this layout's record
    std::int64_t length = -1;  // the logical size it records (kLengthAttr); -1: none
  };
  // Each part's size and record. A part whose layout record differs from this layout's is a
  // FormatError (unless `replacing`: a write that replaces the whole file).
  std::vector<PartState> part_states(const std::string& name, const std::vector<std::string>& parts,
                                     bool replacing = false) const {
    std::vector<PartState> states(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      detail::FileFacts facts;
      const int rc = detail::path_facts(parts[i], facts);
      if (rc == -ENOENT) continue;
      if (rc < 0) throw_io_error(IoOp::Stat, parts[i], 0, 0, -rc, "a part of a striped file");
      states[i].size = facts.size;
      if (replacing) continue;
      // Room for a longer record than ours (ERANGE would hide another layout's).
      char got[512];
      const ssize_t len = ::getxattr(parts[i].c_str(), kLayoutAttr, got, sizeof(got));
      if (len < 0) {
        // No record (a copy that dropped it, a file system without extended attributes): nothing
        // to check against. Any other failure is not "no record".
        if (errno == ENODATA || errno == ENOTSUP) continue;
        throw_io_error(IoOp::Stat, parts[i], 0, 0, errno, "reading its stripe layout record");
      }
      const std::string want = record(i);
      states[i].recorded = std::string_view(got, static_cast<std::size_t>(len)) == want;
      if (!states[i].recorded) {
        throw FormatError(
            display(name),
            fmt::format("part {} records '{}' where this layout reads it as '{}' "
                        "(other directories, order or stripe size than it was "
                        "written with)",
                        parts[i], std::string_view(got, static_cast<std::size_t>(len)), want));
      }
      const ssize_t n = ::getxattr(parts[i].c_str(), kLengthAttr, got, sizeof(got));
      std::uint64_t length = 0;
      if (n > 0 && std::from_chars(got, got + n, length).ptr == got + n &&
          length <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        states[i].length = static_cast<std::int64_t>(length);
      }
    }
    return states;
  }
  // Records the file's logical size `length` in each part it has; best effort where the file
  // system keeps no extended attributes.
  void set_length(const std::vector<std::string>& parts, std::uint64_t length) const {
    const std::string text = std::to_string(length);
    for (const std::string& part : parts) {
      if (::setxattr(part.c_str(), kLengthAttr, text.data(), text.size(), 0) != 0 &&
          errno != ENOTSUP && errno != ENOENT) {
        throw_io_error(IoOp::Write, part, 0, 0, errno, "recording the striped file's size");
      }
    }
  }
  // Records part `drive`'s place in the layout, where the file system keeps extended attributes.
  void set_record(const std::string& part, std::size_t drive) const {
    const std::string r = record(drive);
    if (::setxattr(part.c_str(), kLayoutAttr, r.data(), r.size(), 0) != 0 && errno != ENOTSUP) {
      throw_io_error(IoOp::Write, part, 0, 0, errno, "recording its place in the stripe layout");
    }
  }
  // Sets part i's size to part_size(i, end) where that grows it (Resize::Exact: also where it
  // shrinks it), creating it when it must hold bytes (the first part always: an empty striped file
  // exists, as an empty file written by Handle does), and records the layout in each part that
  // lacks the record (`replacing`: a write that replaces the whole file, whose parts may hold
  // another layout's record); with Durability::Data the new sizes are synced. Serialised by
  // sizing_mutex and judged on each part's size under it (fstat of the open part), so that two
  // threads writing different ranges never shrink each other's part. When one part fails, the
  // parts already resized are put back as they were (a created one removed), so that a refused
  // write leaves the file readable as before.
  enum class Resize { Grow, Exact };
  void size_parts(const std::string& name, const std::vector<std::string>& parts, std::uint64_t end,
                  Resize resize, bool replacing, Durability durability) const {
    const bool exact = resize == Resize::Exact;
    std::lock_guard lock(sizing_mutex);
    const std::vector<PartState> states = part_states(name, parts, replacing);
    struct Undo {
      std::size_t part;
      std::int64_t size;  // -1: it was created
    };
    std::vector<Undo> undo;
    // The size recorded before a shrink and after a growth, so that a crash between the two
    // leaves a record no larger than the parts hold.
    std::uint64_t before = 0;
    for (const PartState& st : states)
      before += static_cast<std::uint64_t>(std::max<std::int64_t>(st.size, 0));
    const bool shrinking = exact && end < before;
    if (shrinking) set_length(parts, end);
    try {
      for (std::size_t i = 0; i < parts.size(); ++i) {
        const auto want = static_cast<std::int64_t>(layout.part_size(i, end));
        if (states[i].size < 0 && want == 0 && i > 0) continue;
        detail::FileDescriptor fd(detail::open_file(parts[i], O_WRONLY | O_CREAT));
        if (!fd) {
          throw_io_error(IoOp::Open, parts[i], 0, 0, -fd.get(), "a part of a striped file");
        }
        detail::FileFacts facts;
        if (const int rc = detail::file_facts(fd.get(), facts); rc < 0) {
          throw_io_error(IoOp::Stat, parts[i], 0, 0, -rc, "a part of a striped file");
        }
        const std::int64_t size = states[i].size < 0 ? -1 : facts.size;
        if (size < 0) undo.push_back({i, -1});
        if (size < 0 || !states[i].recorded) set_record(parts[i], i);
        if (facts.size == want || (!exact && facts.size > want)) continue;
        if (size >= 0) undo.push_back({i, facts.size});
        if (::ftruncate(fd.get(), want) != 0) {
          throw_io_error(IoOp::Truncate, parts[i], static_cast<std::uint64_t>(want), 0, errno,
                         "sizing a part of a striped file");
        }
        if (durability == Durability::Data && ::fdatasync(fd.get()) != 0) {
          throw_io_error(IoOp::Sync, parts[i], 0, 0, errno, "a part of a striped file");
        }
      }
      // Grown (or created): the parts now hold a file of `end` bytes (Grow never shrinks a
      // part, and part_size grows with the size).
      if (!shrinking && (!undo.empty() || replacing)) set_length(parts, end);
    } catch (...) {
      // Best effort: the error being thrown is the one to report.
      for (const Undo& u : undo) {
        [[maybe_unused]] const int rc = u.size < 0 ? ::unlink(parts[u.part].c_str())
                                                   : ::truncate(parts[u.part].c_str(), u.size);
      }
      throw;
    }
  }

  // Submits each drive's batch, waits for every one submitted, and throws the first failure in
  // directory order (a drive whose batch could not be submitted counts at its place).
  template <class Extent, class Options>
  StripedTransfer run(const std::vector<std::vector<Extent>>& per_drive,
                      const Options& options) const {
    const std::size_t n = per_drive.size();
    StripedTransfer out;
    out.drives.resize(n);
    std::vector<Ticket> tickets(n, 0);
    std::vector<std::exception_ptr> errors(n);
    // Everything that may throw (allocations) before the first batch is in flight: from then on
    // nothing but a refused submit may throw before every submitted batch is waited for.
    for (std::size_t i = 0; i < n; ++i) {
      out.drives[i].directory = layout.directories[i];
      for (const Extent& e : per_drive[i]) out.drives[i].bytes += e.length;
      out.bytes += out.drives[i].bytes;
    }
    const Clock::time_point start = Clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      if (per_drive[i].empty()) continue;
      try {
        tickets[i] = submit(*handles[i], std::span<const Extent>(per_drive[i]), options);
      } catch (...) {
        errors[i] = std::current_exception();
        break;  // the batches already submitted are waited for below
      }
    }
    Clock::time_point last = start;
    for (std::size_t i = 0; i < n; ++i) {
      if (tickets[i] == 0) continue;
      Completion c;
      try {
        c = handles[i]->wait_completion(tickets[i]);
      } catch (const Interrupted&) {
        // The caller's buffer must be its own again before this leaves: what has not started
        // on the drives still busy is cancelled, the rest waited for, without further checks.
        ScopedInterruptCheck no_check(nullptr);
        for (std::size_t j = i; j < n; ++j) {
          if (tickets[j] != 0) handles[j]->cancel(tickets[j]);
        }
        for (std::size_t j = i; j < n; ++j) {
          if (tickets[j] != 0) (void)handles[j]->wait_completion(tickets[j]);
        }
        throw;
      }
      errors[i] = c.error;
      out.drives[i].seconds = std::chrono::duration<double>(c.finished - start).count();
      last = std::max(last, c.finished);
    }
    for (const std::exception_ptr& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    out.seconds = std::chrono::duration<double>(last - start).count();
    return out;
  }
};

namespace {

// Validates `layout` and checks that each directory exists.
// One directory named twice under two spellings ("/x" and "/x/", a symbolic link, a bind mount)
// would put two parts in one file, each overwriting the other's stripes: refused by device and
// inode, not by name.
void check_layout(const StripeLayout& layout) {
  layout.validate();
  std::vector<std::pair<detail::FileFacts, const std::string*>> seen;
  for (const std::string& d : layout.directories) {
    detail::FileFacts facts;
    if (const int rc = detail::path_facts(d, facts); rc < 0) {
      throw_io_error(IoOp::Stat, d, 0, 0, -rc, "a stripe directory");
    }
    if (facts.type != detail::FileType::Directory) {
      throw InvalidArgument(fmt::format("stripe directory '{}' is not a directory", d));
    }
    for (const auto& [other, name] : seen) {
      if (other.same_file(facts)) {
        throw InvalidArgument(fmt::format(
            "stripe directories '{}' and '{}' are one directory (given twice)", *name, d));
      }
    }
    seen.emplace_back(facts, &d);
  }
}

}  // namespace

StripedHandle::StripedHandle(StripeLayout layout, const OptionOverrides& overrides)
    : impl_(std::make_unique<Impl>()) {
  check_layout(layout);
  impl_->layout = std::move(layout);
  for (const std::string& d : impl_->layout.directories) {
    impl_->handles.push_back(std::make_unique<Handle>(resolve_options(overrides, {}, d).values));
  }
}

StripedHandle::StripedHandle(StripeLayout layout, const std::vector<Options>& per_drive)
    : impl_(std::make_unique<Impl>()) {
  check_layout(layout);
  if (per_drive.size() != layout.directories.size()) {
    throw InvalidArgument(fmt::format("{} option sets for a striped file over {} directories",
                                      per_drive.size(), layout.directories.size()));
  }
  impl_->layout = std::move(layout);
  for (const Options& o : per_drive) impl_->handles.push_back(std::make_unique<Handle>(o));
}

StripedHandle::~StripedHandle() = default;

StripedTransfer StripedHandle::write(const void* buf, std::size_t length, const std::string& name,
                                     std::uint64_t offset, const WriteOptions& write_options) {
  check_name(name);
  if (buf == nullptr && length > 0) throw InvalidArgument("write of a striped file from null");
  check_range(name, offset, length);
  const std::vector<std::string> parts = impl_->parts(name);
  const bool at_end = write_options.truncate == Truncate::AtEnd;
  const std::uint64_t end = offset + length;
  // Parts grow before the data goes in; Truncate::AtEnd shrinks them only once it is in, so that a
  // failed write does not lose the file's tail.
  // An empty write only makes the file exist (its first part), as pwrite of nothing grows no
  // file.
  impl_->size_parts(name, parts, length > 0 || at_end ? end : 0, Impl::Resize::Grow,
                    at_end && offset == 0, write_options.durability);
  WriteOptions per_drive = write_options;
  per_drive.truncate = Truncate::No;  // the parts are sized here; batches refuse AtEnd
  StripedTransfer t = impl_->run(
      split<WriteExtent>(impl_->layout, static_cast<const std::byte*>(buf), length, offset, parts),
      per_drive);
  if (at_end) {
    impl_->size_parts(name, parts, end, Impl::Resize::Exact, false, write_options.durability);
  }
  return t;
}

StripedTransfer StripedHandle::read(void* buf, std::size_t length, const std::string& name,
                                    std::uint64_t offset, const ReadOptions& read_options) {
  check_name(name);
  if (buf == nullptr && length > 0) throw InvalidArgument("read of a striped file into null");
  check_range(name, offset, length);
  const std::uint64_t have = size(name);
  if (offset + length > have) {
    throw ShortFile(IoOp::Read, impl_->display(name), offset, length, have);
  }
  return impl_->run(split<ReadExtent>(impl_->layout, static_cast<std::byte*>(buf), length, offset,
                                      impl_->parts(name)),
                    read_options);
}

std::uint64_t StripedHandle::size(const std::string& name) const {
  check_name(name);
  const std::vector<std::string> parts = impl_->parts(name);
  // Not while a write of this handle sizes the parts: they would be caught at two sizes.
  std::unique_lock lock(impl_->sizing_mutex);
  const std::vector<Impl::PartState> states = impl_->part_states(name, parts);
  lock.unlock();
  if (std::all_of(states.begin(), states.end(), [](const auto& s) { return s.size < 0; })) {
    throw_io_error(IoOp::Stat, impl_->display(name), 0, 0, ENOENT, "no part of it exists");
  }
  std::vector<std::uint64_t> sizes;
  for (const auto& s : states)
    sizes.push_back(static_cast<std::uint64_t>(std::max<std::int64_t>(s.size, 0)));
  const std::uint64_t total = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == impl_->layout.part_size(i, total)) continue;
    // Which part is wrong cannot be told from the sizes alone (a truncated last part makes the
    // first look too long): every part's size is named, the missing ones first.
    std::vector<std::string> missing;
    std::vector<std::string> held;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      if (states[k].size < 0) missing.push_back(parts[k]);
      held.push_back(states[k].size < 0 ? "missing" : fmt::format("{}", states[k].size));
    }
    throw FormatError(
        impl_->display(name),
        fmt::format("{}its parts hold {} bytes, which no striped file with {}-byte stripes over "
                    "these {} directories has (a part removed or truncated, or other directories "
                    "or stripe size than it was written with?)",
                    missing.empty() ? "" : fmt::format("{} missing; ", fmt::join(missing, ", ")),
                    fmt::join(held, ", "), impl_->layout.stripe_size, parts.size()));
  }
  // Sizes that fit a smaller striped file than the one written (a part truncated at a stripe
  // boundary): short, as a read of the file's bytes finds it.
  std::int64_t recorded = -1;
  for (const auto& s : states) recorded = std::max(recorded, s.length);
  if (recorded >= 0 && total < static_cast<std::uint64_t>(recorded)) {
    throw ShortFile(IoOp::Read, impl_->display(name), 0, static_cast<std::uint64_t>(recorded),
                    total);
  }
  return total;
}

std::size_t StripedHandle::remove(const std::string& name) {
  check_name(name);
  std::size_t removed = 0;
  for (const std::string& p : impl_->parts(name)) {
    if (::unlink(p.c_str()) == 0) {
      ++removed;
    } else if (errno != ENOENT) {
      throw_io_error(IoOp::Remove, p, 0, 0, errno, "a part of a striped file");
    }
  }
  return removed;
}

std::string StripedHandle::part_path(std::size_t drive, const std::string& name) const {
  check_name(name);
  return impl_->layout.part_path(drive, name);
}

HandleStats StripedHandle::stats() const {
  HandleStats total;
  for (const auto& h : impl_->handles) total += h->stats();
  return total;
}

const StripeLayout& StripedHandle::layout() const noexcept { return impl_->layout; }

Handle& StripedHandle::drive(std::size_t drive) {
  if (drive >= impl_->handles.size()) {
    throw InvalidArgument(fmt::format("drive {} of a striped file over {} directories", drive,
                                      impl_->handles.size()));
  }
  return *impl_->handles[drive];
}

}  // namespace nvio
