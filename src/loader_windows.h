// The windows of a quasi-random epoch over data larger than the memory budget, held in memory
// of the loader's own (docs/DESIGN.md, "The loader"). The read-ahead thread copies window w
// into slot w % slots(): each block of each column in one large read of the arena file past the
// page cache straight into the slot (or one sequential copy out of the mapping); batches gather
// their rows from the slot, which takes no page fault and, where the kernel gives huge pages, few
// TLB misses. A compressed part's blocks are decompressed into the slot instead, each plan block's
// rows from only the compressed blocks holding them. Dense columns only. Internal to src/; no
// libtorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/packed_part.h"
#include "tdstore/env.h"

namespace tdstore::detail {

// A dense column as the windows read it: part p holds rows[p] rows of row_bytes bytes each
// at parts[p], the global rows from starts[p] on; files[p], when set, is the arena file
// holding the same bytes from offsets[p] (a persistent store's mapped key). A part with
// packed[p] set is stored compressed: parts[p] is null and its rows are decompressed from it.
// release: a packed part's stored pages are released once a window is filled (the epoch's
// data is larger than the memory budget).
struct WindowSource {
  std::vector<const uint8_t*> parts;
  std::vector<int64_t> starts, rows;
  std::vector<std::shared_ptr<File>> files;
  std::vector<uint64_t> offsets;
  std::vector<std::shared_ptr<const PackedPart>> packed;  // empty, or one per part
  int64_t row_bytes = 0;
  bool release = false;
  const PackedPart* packed_at(size_t p) const {
    return p < packed.size() ? packed[p].get() : nullptr;
  }
};

class WindowBuffers {
 public:
  WindowBuffers();
  ~WindowBuffers();
  WindowBuffers(const WindowBuffers&) = delete;
  WindowBuffers& operator=(const WindowBuffers&) = delete;

  // The epoch's windows over rows [0, n): window w holds blocks block_order[w * window_blocks,
  // (w + 1) * window_blocks), block i rows [i * block_rows, min(n, (i + 1) * block_rows)).
  // Holds `slots` windows at once; the memory of the last plan is kept when it is as large.
  void plan(int64_t n, int64_t block_rows, int64_t window_blocks,
            const std::vector<int64_t>& block_order, std::vector<WindowSource> sources,
            int64_t slots);
  int64_t slots() const { return slots_; }
  size_t bytes() const { return size_; }  // the memory the slots take
  // Copies window w of every column into slot w % slots(). A part with its file is read past
  // the page cache where this process holds no private copy of the range's pages
  // (Env::has_private_pages): the first range of a block of kAlignedMinBytes or more with
  // File::read_once_into_pages, straight into the slot, other ranges (smaller blocks, a block's
  // later part across two parts) with File::read_once; otherwise
  // the bytes are copied from the mapping, whose pages are then released (a file's only: an
  // in-memory dict's pages are left alone). A packed part's rows are decompressed on the
  // copying thread from the blocks holding them, whose stored bytes are read ahead through the
  // mapping (and released when the source says so); a block across two of the plan's blocks is
  // decompressed for each. Throws what a read throws (IOError, or CorruptionError naming the
  // key and the block). The caller
  // makes sure that no gather reads that slot meanwhile.
  void fill(int64_t w);
  // Copies rows[0, count) of column c into out (count * row_bytes bytes). The window of every
  // row is filled and not yet overwritten: const calls may run concurrently with each other
  // and with fill() of another slot.
  void gather(size_t c, const int64_t* rows, int64_t count, uint8_t* out) const;

 private:
  static constexpr size_t kPage = 4096;  // the alignment of reads past the page cache
  // A column's blocks of at least this many bytes are read straight into pages of their own.
  static constexpr size_t kAlignedMinBytes = 256 << 10;
  void release_memory();
  int64_t n_ = 0, block_rows_ = 1, window_blocks_ = 1, slots_ = 0;
  std::vector<int64_t> block_order_;
  std::vector<WindowSource> sources_;
  // first_[c][b]: where in memory_ row b * block_rows of column c is copied. An aligned_
  // column has an area of whole pages per place in a slot; a block read from a file starts in
  // its area at its first row's offset within that row's page of the file (so the area's pages
  // and the file's are read one onto the other), at the area's start otherwise. Other columns'
  // blocks are packed one after the other.
  std::vector<std::vector<size_t>> first_;
  std::vector<bool> aligned_;
  uint8_t* memory_ = nullptr;  // an anonymous mapping of size_ bytes
  size_t size_ = 0;
};

}  // namespace tdstore::detail
