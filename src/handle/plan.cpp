#include "handle/plan.hpp"

#include <algorithm>

#include "core/align.hpp"

namespace nvio::detail {

std::size_t Plan::middle_pieces() const noexcept {
  return tail_begin > head_end
             ? static_cast<std::size_t>((tail_begin - head_end + piece_size - 1) / piece_size)
             : 0;
}

std::size_t Plan::piece_count() const noexcept {
  return (has_head() ? 1 : 0) + middle_pieces() + (has_tail() ? 1 : 0);
}

Piece Plan::piece(std::size_t index) const noexcept {
  if (has_head()) {
    if (index == 0) return Piece{offset, static_cast<std::size_t>(head_end - offset), false};
    --index;
  }
  if (index < middle_pieces()) {
    const std::uint64_t start = head_end + index * piece_size;
    const auto len =
        static_cast<std::size_t>(std::min<std::uint64_t>(piece_size, tail_begin - start));
    return Piece{start, len, direct};
  }
  return Piece{tail_begin, static_cast<std::size_t>(end - tail_begin), tail_direct};
}

Plan plan_whole(std::uint64_t offset, std::size_t length, std::size_t piece_size, bool direct) {
  Plan p;
  p.offset = offset;
  p.end = offset + length;
  p.head_end = offset;
  p.tail_begin = p.end;
  p.piece_size = std::max<std::size_t>(piece_size, 1);
  p.direct = direct;
  return p;
}

Plan plan_split(std::uint64_t offset, std::size_t length, std::size_t block_size,
                std::uint64_t align) {
  Plan p = plan_whole(offset, length, block_size, true);
  p.head_end = std::min(round_up(offset, align), p.end);
  p.tail_begin = std::max(round_down(p.end, align), p.head_end);
  p.piece_size =
      static_cast<std::size_t>(std::max<std::uint64_t>(align, round_down(block_size, align)));
  return p;
}

std::size_t plan_shifted(Plan& split, std::uintptr_t middle_address, std::uint64_t mem_align,
                         std::uint64_t landing_align, std::uint64_t align) noexcept {
  if (!split.direct || mem_align <= 1 || split.tail_begin <= split.head_end) return 0;
  if (middle_address % mem_align == 0) return 0;  // the kernel takes the memory as it is
  const std::uint64_t to = std::max(mem_align, landing_align);
  // Every piece's landing must be aligned, not only the first one's.
  if (split.piece_size % to != 0) return 0;
  const auto shift = static_cast<std::size_t>((to - middle_address % to) % to);
  if (split.end - split.head_end < shift) return 0;
  const std::uint64_t tail_begin = std::max(round_down(split.end - shift, align), split.head_end);
  if (tail_begin - split.head_end <= split.piece_size) return 0;  // fewer than two pieces
  split.tail_direct = split.tail_begin == split.end;  // no tail before: the end is aligned
  split.tail_begin = tail_begin;
  return shift;
}

std::uint64_t split_alignment(std::uint64_t dio_offset_align, std::uint64_t page,
                              std::uint64_t blksize) noexcept {
  return std::max({dio_offset_align, page, blksize, std::uint64_t{1}});
}

std::size_t bounce_chunk_size(std::size_t block_size) noexcept {
  return static_cast<std::size_t>(round_up(block_size, 4096));
}

std::size_t direct_resume_point(std::size_t done, std::uint64_t file_offset, std::uintptr_t base,
                                std::uint64_t offset_align, std::uint64_t mem_align) noexcept {
  const std::uint64_t a = std::max({offset_align, mem_align, std::uint64_t{1}});
  if ((file_offset + done) % offset_align == 0 && (base + done) % mem_align == 0) return done;
  return static_cast<std::size_t>(round_down(done, a));
}

}  // namespace nvio::detail
