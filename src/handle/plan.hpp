// Planning: how one request [offset, offset + length) is cut into pieces, and where a short
// direct transfer resumes. Pure functions of numbers: no I/O, no state; unit-tested on their own
// (the Plan tests of tests/cpp/worker_state_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace nvio::detail {

// One contiguous piece of a request, as planned (before any short-transfer resumption).
struct Piece {
  std::uint64_t file_offset = 0;
  std::size_t length = 0;
  bool direct = false;  // through the O_DIRECT descriptor (aligned offset and length)
};

// The cut of a request: [offset, head_end) and [tail_begin, end) are unaligned edges done through
// the page cache; [head_end, tail_begin) is cut into pieces of `piece_size`, direct when `direct`.
// Without direct I/O, head_end == offset and tail_begin == end (no edges).
struct Plan {
  std::uint64_t offset = 0;
  std::uint64_t end = 0;
  std::uint64_t head_end = 0;
  std::uint64_t tail_begin = 0;
  std::size_t piece_size = 1;
  bool direct = false;
  // The tail goes through the O_DIRECT descriptor too: a shifted read's tail (plan_shifted) whose
  // end is aligned.
  bool tail_direct = false;

  bool has_head() const noexcept { return head_end > offset; }
  bool has_tail() const noexcept { return tail_begin < end; }
  std::size_t middle_pieces() const noexcept;
  std::size_t piece_count() const noexcept;
  // Piece `index` (0 <= index < piece_count()), head first, then the middle, then the tail.
  Piece piece(std::size_t index) const noexcept;
};

// A read whose direct middle starts at `middle_address` in the caller's memory, an address the
// kernel refuses for O_DIRECT (not a multiple of `mem_align`), may instead land each middle piece
// `shift` bytes past its place, at an address that is a multiple of `mem_align` and of
// `landing_align` (the page: pieces then cross as few pages as in the aligned case, which matters
// to a device with a cap on segments per request), and be moved down to it afterwards
// (ShiftedRead, handle/operation.hpp). The last `shift` bytes of such a landing would run past the
// end of the request, so the middle ends earlier: `split`'s tail begins at the last multiple of
// `align` at or before end - shift, and the tail edge grows by up to that much (where the request
// ends aligned, the tail it gains is aligned too, and direct: `tail_direct`). Returns the shift,
// and updates `split`, when the middle keeps at least two pieces (one piece has nothing to
// overlap its move with, and the bounce path moves it as fast) and every piece's landing is
// aligned (the pieces' size a multiple of that alignment); 0 otherwise, leaving `split` as it
// was.
std::size_t plan_shifted(Plan& split, std::uintptr_t middle_address, std::uint64_t mem_align,
                         std::uint64_t landing_align, std::uint64_t align) noexcept;

// No edges: the whole request in pieces of `piece_size` (buffered I/O, or cuFile, which takes any
// offset itself). `direct` marks the pieces as going through the O_DIRECT descriptor.
Plan plan_whole(std::uint64_t offset, std::size_t length, std::size_t piece_size, bool direct);

// Direct middle and buffered edges split at multiples of `align` (a power of two, see
// split_alignment): the middle's pieces are the largest multiple of `align` not above
// `block_size` (at least `align`).
Plan plan_split(std::uint64_t offset, std::size_t length, std::size_t block_size,
                std::uint64_t align);

// Where direct pieces and buffered edges meet. Edges go through the page cache, so they must not
// share a page or a file-system block with the direct middle: a buffered write of a partial page
// reads, modifies and later writes back the whole page (or block), which would clobber
// direct-written bytes beside it. So the split is at the largest of the kernel's direct-I/O
// offset alignment, the page size and st_blksize (0: unknown). All are powers of two.
std::uint64_t split_alignment(std::uint64_t dio_offset_align, std::uint64_t page,
                              std::uint64_t blksize) noexcept;

// The size of a worker's bounce chunks: one piece of block_size each, whole pages.
std::size_t bounce_chunk_size(std::size_t block_size) noexcept;

// A direct piece at `file_offset` whose memory starts at address `base` has `done` bytes
// transferred after a short transfer. Returns how many of them count, so that the rest can again
// go through O_DIRECT: `done` itself when file offset and address after it keep the direct-I/O
// alignment (`offset_align`, `mem_align`, powers of two), else `done` rounded down to that
// alignment: the bytes after it are transferred again, from or into the same memory, which is
// harmless, where resuming through the page cache could clobber direct-written bytes beside a
// partial page. The piece itself starts aligned, so the result is never below 0; it may equal
// the previous `done` (no progress), which the caller bounds with its retry counter.
std::size_t direct_resume_point(std::size_t done, std::uint64_t file_offset, std::uintptr_t base,
                                std::uint64_t offset_align, std::uint64_t mem_align) noexcept;

}  // namespace nvio::detail
