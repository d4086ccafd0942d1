#include "src/loader_windows.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <thread>

#include "tdstore/env.h"

namespace tdstore::detail {

// Threads copying a window, and blocks each has read ahead from a mapping. Reads past the page
// cache are synchronous, so the copiers are the disk's queue: four read this VM's disk 1.1-1.3x
// faster than two (tools/bench_out_of_core). The first range of a key's block of
// kAlignedMinBytes or more is read straight into its slot; smaller blocks and a block's later
// part (a block across two parts) through an 8 MiB buffer of the copier's own.
constexpr size_t kCopiers = 4, kBlocksInFlight = 4;

WindowBuffers::WindowBuffers() = default;
WindowBuffers::~WindowBuffers() { release_memory(); }

void WindowBuffers::release_memory() {
  if (memory_) ::munmap(memory_, size_);
  memory_ = nullptr, size_ = 0;
}

void WindowBuffers::plan(int64_t n, int64_t block_rows, int64_t window_blocks,
                         const std::vector<int64_t>& block_order, std::vector<WindowSource> sources,
                         int64_t slots) {
  n_ = n, block_rows_ = block_rows, window_blocks_ = window_blocks, slots_ = slots;
  block_order_ = block_order;
  sources_ = std::move(sources);
  // Block b's area in each column: the place of its window's slot and its place in the window.
  std::vector<size_t> area(block_order.size());
  for (size_t i = 0; i < block_order.size(); ++i) {
    const auto w = static_cast<int64_t>(i) / window_blocks;
    area[static_cast<size_t>(block_order[i])] =
        static_cast<size_t>((w % slots) * window_blocks + static_cast<int64_t>(i) % window_blocks);
  }
  // A column whose blocks take at least kAlignedMinBytes has areas of whole pages, a page more
  // than its blocks need (at most 3% more): a block whose first row comes from a file starts
  // as far into its area as that row into its page of the file, so the pages around the
  // block are read straight into the area (read_once_into_pages). Smaller blocks are packed.
  first_.assign(sources_.size(), {});
  aligned_.assign(sources_.size(), false);
  size_t size = 0;
  for (size_t c = 0; c < sources_.size(); ++c) {
    const WindowSource& s = sources_[c];
    const auto block_bytes = static_cast<size_t>(block_rows * s.row_bytes);
    const bool aligned = aligned_[c] = block_bytes >= kAlignedMinBytes;
    if (aligned) size = (size + kPage - 1) / kPage * kPage;
    const size_t stride = aligned ? (block_bytes + kPage - 1) / kPage * kPage + kPage : block_bytes;
    auto& first = first_[c];
    first.resize(block_order.size());
    for (size_t b = 0; b < first.size(); ++b) {
      const int64_t lo = static_cast<int64_t>(b) * block_rows;
      size_t head = 0;
      for (size_t p = 0; aligned && p < s.parts.size(); ++p)
        if (s.starts[p] <= lo && lo < s.starts[p] + s.rows[p] && p < s.files.size() && s.files[p])
          head = (s.offsets[p] + static_cast<uint64_t>((lo - s.starts[p]) * s.row_bytes)) % kPage;
      first[b] = size + area[b] * stride + head;
    }
    size += static_cast<size_t>(slots * window_blocks) * stride;
  }
  if (size == size_) return;
  release_memory();
  if (size == 0) return;
  // Process memory, not a store's file: mapped directly. Huge pages where the kernel has them
  // (transparent_hugepage "madvise"): a gather's random rows then miss the TLB far less often.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  Env::posix()->advise(p, size, Env::Advice::HugePages);
  memory_ = static_cast<uint8_t*>(p), size_ = size;
}

void WindowBuffers::fill(int64_t w) {
  const auto first = static_cast<size_t>(w * window_blocks_);
  const auto last = std::min(block_order_.size(), first + static_cast<size_t>(window_blocks_));
  const auto env = Env::posix();
  // The window's blocks by place in the file: where a block lands in the slot does not depend
  // on when it is read, and ascending reads are what the disk reads fastest.
  std::vector<int64_t> blocks(block_order_.begin() + static_cast<std::ptrdiff_t>(first),
                              block_order_.begin() + static_cast<std::ptrdiff_t>(last));
  std::sort(blocks.begin(), blocks.end());
  // Calls f(column, part, first row in the part, rows, its first row's global number) for each
  // part of block b of each column.
  auto each_range = [&](int64_t b, auto&& f) {
    const int64_t lo = b * block_rows_, hi = std::min(n_, lo + block_rows_);
    for (size_t c = 0; c < sources_.size(); ++c) {
      const WindowSource& s = sources_[c];
      for (size_t p = 0; p < s.parts.size(); ++p) {
        const int64_t a = std::max(lo, s.starts[p]), z = std::min(hi, s.starts[p] + s.rows[p]);
        if (a < z) f(c, p, a - s.starts[p], z - a, a);
      }
    }
  };
  // A packed part's stored bytes holding rows [first, first + rows).
  auto frames = [](const PackedPart& pp, int64_t first, int64_t rows) {
    const auto [a, z] =
        storage::frames_of(pp.index, static_cast<uint64_t>(first), static_cast<uint64_t>(rows));
    return std::pair<const uint8_t*, size_t>(pp.object + a, static_cast<size_t>(z - a));
  };
  // Copies the blocks k, k + kCopiers, ... of `blocks`. A store's bytes are read past the page
  // cache (File::read_once_into_pages or File::read_once: O_DIRECT here, which reads scattered
  // large blocks of this VM's disk 1.4-1.7x faster than buffered reads, and leaves no page cache
  // beside the slots); bytes copied from a mapping, and a packed part's stored bytes, have the
  // reads of the next few blocks queued ahead.
  auto copy = [&](size_t k) {
    auto read_ahead = [&](size_t i) {
      if (i >= blocks.size()) return;
      each_range(blocks[i], [&](size_t c, size_t p, int64_t first, int64_t rows, int64_t) {
        const WindowSource& s = sources_[c];
        if (const PackedPart* pp = s.packed_at(p)) {
          const auto [from, bytes] = frames(*pp, first, rows);
          env->advise(from, bytes, Env::Advice::WillNeed);
          return;
        }
        if (p < s.files.size() && s.files[p]) return;  // read past the page cache, not mapped
        env->advise(s.parts[p] + first * s.row_bytes, static_cast<size_t>(rows * s.row_bytes),
                    Env::Advice::WillNeed);
      });
    };
    for (size_t j = 0; j < kBlocksInFlight; ++j) read_ahead(k + j * kCopiers);
    for (size_t i = k; i < blocks.size(); i += kCopiers) {
      read_ahead(i + kBlocksInFlight * kCopiers);
      const int64_t b = blocks[i];
      each_range(b, [&](size_t c, size_t p, int64_t first, int64_t rows, int64_t row) {
        const WindowSource& s = sources_[c];
        const auto rb = static_cast<size_t>(s.row_bytes);
        const auto bytes = static_cast<size_t>(rows) * rb;
        const size_t place = first_[c][static_cast<size_t>(b)];
        uint8_t* to = memory_ + place + static_cast<size_t>(row - b * block_rows_) * rb;
        if (const PackedPart* pp = s.packed_at(p)) {  // on this thread: the copiers are the pool
          storage::read_rows(pp->object, pp->index, static_cast<uint64_t>(first),
                             static_cast<uint64_t>(rows), to, pp->where, 1);
          if (s.release) {
            const auto [from, stored] = frames(*pp, first, rows);
            env->advise(from, stored, Env::Advice::Release);
          }
          return;
        }
        const uint8_t* from = s.parts[p] + first * s.row_bytes;
        if (p < s.files.size() && s.files[p] && !env->has_private_pages(from, bytes)) {
          // No page of this process maps the bytes. The block's first range takes its area's
          // pages whole: the pages past it are the block's own and hold later ranges, which
          // come after it.
          const uint64_t at = s.offsets[p] + static_cast<uint64_t>(from - s.parts[p]);
          if (aligned_[c] && row == b * block_rows_)
            s.files[p]->read_once_into_pages(at, memory_ + place / kPage * kPage, bytes);
          else
            s.files[p]->read_once(at, to, bytes);
          return;
        }
        const bool mapped_file = p < s.files.size() && s.files[p];
        if (mapped_file) env->advise(from, bytes, Env::Advice::Populate);  // one call, no faults
        std::memcpy(to, from, bytes);
        // A store's pages are released; memory of an in-memory dict is left alone.
        if (mapped_file) env->advise(from, bytes, Env::Advice::Release);
      });
    }
  };
  std::vector<std::exception_ptr> errors(kCopiers);
  auto run = [&](size_t k) {
    try {
      copy(k);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  for (size_t k = 1; k < kCopiers; ++k) helpers.emplace_back(run, k);
  run(0);
  for (auto& t : helpers) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void WindowBuffers::gather(size_t c, const int64_t* rows, int64_t count, uint8_t* out) const {
  const auto rb = static_cast<size_t>(sources_[c].row_bytes);
  const size_t* first = first_[c].data();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = rows[i], b = r / block_rows_;
    std::memcpy(out + static_cast<size_t>(i) * rb,
                memory_ + first[b] + static_cast<size_t>(r - b * block_rows_) * rb, rb);
  }
}

}  // namespace tdstore::detail
