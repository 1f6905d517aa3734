// The swapper's read-ahead: Swapper::prefetch queues names, and their reads start, in order, as the
// budget has room (start_queued); a swap_in claims what was read. Members of Swapper::Impl
// (swapper_impl.hpp, where Entry::Prefetch gives each name's states), called with the swapper's
// mutex held.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>

#include "jobs/swapper_impl.hpp"

namespace nvio {

namespace {

// The read-ahead window: at most this many names wait in the prefetch queue for room (the names
// a caller asks for past it are left to swap_in).
constexpr std::size_t kPrefetchQueueLimit = 4096;

}  // namespace

void Swapper::Impl::drop_prefetched(const std::string& name, Entry& e) {
  switch (e.prefetch) {
    case Prefetch::None:
    case Prefetch::Reading: return;
    case Prefetch::Queued:
      prefetch_queue.erase(std::find(prefetch_queue.begin(), prefetch_queue.end(), name));
      break;
    case Prefetch::Ready:
      ready_names.erase(name);
      e.prefetched.reset();
      break;
  }
  e.prefetch = Prefetch::None;
}

void Swapper::Impl::unqueue(const std::string& name, Entry& e) {
  if (e.prefetch == Prefetch::Queued) drop_prefetched(name, e);
}

void Swapper::Impl::clear_read_ahead() {
  while (!prefetch_queue.empty()) {
    const std::string name = prefetch_queue.front();
    drop_prefetched(name, entries.at(name));
  }
  while (!ready_names.empty()) {
    const std::string name = *ready_names.begin();
    drop_prefetched(name, entries.at(name));
  }
}

std::shared_ptr<SwapBuffer> Swapper::Impl::claim_prefetched(const std::string& name, Entry& e) {
  ready_names.erase(name);
  e.prefetch = Prefetch::None;
  return std::move(e.prefetched);
}

bool Swapper::Impl::prefetchable(const Entry& e) const {
  return e.writing == 0 && !e.error && e.size > 0 && e.prefetch == Prefetch::None &&
         detail::SwapPool::footprint(static_cast<std::size_t>(e.size)) <= options.budget_bytes;
}

bool Swapper::Impl::start_prefetch(const std::string& name, Entry& e) {
  std::shared_ptr<SwapBuffer> buffer = pool->try_allocate(static_cast<std::size_t>(e.size));
  if (!buffer) return false;
  const ReadExtent extent{buffer->data(), buffer->size(), e.offset, files.at(e.file).path};
  auto record = prepared_node(ops, Op{Op::Kind::Prefetch, 0, 0, name});
  const Ticket ticket = handle.submit_read_batch({&extent, 1}, ReadOptions{MemoryKind::Host});
  record.key() = ticket;
  ops.insert(std::move(record));
  e.prefetched = std::move(buffer);
  e.prefetch = Prefetch::Reading;
  ++e.readers;
  return true;
}

void Swapper::Impl::start_queued() noexcept {
  if (closed || room_waiters > 0) return;
  while (!prefetch_queue.empty()) {
    const std::string& name = prefetch_queue.front();
    Entry& e = entries.at(name);
    try {
      if (!start_prefetch(name, e)) return;
    } catch (...) {
      e.prefetch = Prefetch::None;
    }
    prefetch_queue.pop_front();
  }
}

std::size_t Swapper::prefetch(std::span<const std::string> names) {
  Impl& s = *impl_;
  const Impl::Call call(s, Impl::Need::Open);
  for (const std::string& name : names) {
    if (!s.entries.contains(name)) {
      throw InvalidArgument(
          fmt::format("swapper: prefetch of '{}': no tensor of that name in '{}'", name, s.dir));
    }
  }
  // In the caller's order, behind what earlier calls queued; started as far as the budget has
  // room now, the rest as it frees up (see start_queued).
  std::size_t accepted = 0;
  for (const std::string& name : names) {
    if (s.prefetch_queue.size() >= kPrefetchQueueLimit) break;
    Impl::Entry& e = s.entries.at(name);
    if (!s.prefetchable(e)) continue;
    s.prefetch_queue.push_back(name);  // first: the state never names a queue it is not in
    e.prefetch = Impl::Prefetch::Queued;
    ++accepted;
  }
  s.start_queued();
  return accepted;
}

}  // namespace nvio
