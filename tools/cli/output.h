// Output helpers of the tdstore CLI: sizes, dtype names, progress bars, tensor summaries,
// histograms and images (PNG files, terminal drawings).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tdstore/formats.h"

namespace tdstore::cli {

std::string human_bytes(uint64_t bytes);
// raw / stored, how many times smaller compression made it (1 when nothing is stored).
double ratio(uint64_t raw, uint64_t stored);
// ISO 8601 UTC time of nanoseconds since the Unix epoch: "2026-12-02T15:35:45Z".
std::string iso_time(int64_t ns);

// Progress on stderr: a bar redrawn in place when stderr is a terminal; with `lines` (the
// --progress option), one line per step whatever stderr is, "<label>: <done> of <total>", for
// scripts and tests that follow a long command.
class Progress {
 public:
  Progress(std::string label, uint64_t total, bool lines = false);
  ~Progress();
  void update(uint64_t done);
  void set_total(uint64_t total) { total_ = total; }

 private:
  std::string label_;
  uint64_t total_;
  bool tty_;
  bool lines_;
  int last_permille_ = -1;
};

// Values as numpy/libtorch print them, summarized past `threshold` elements (edge items
// at each end of every long dimension), then a footer "[ float32 [60000, 784] ]".
std::string format_array(const Array& a, int64_t threshold = 1000, int64_t edge = 3);

// Horizontal bars, one line per bin: "[ -1.00,  -0.50)  ████████   1234".
std::string draw_histogram(const std::vector<double>& edges, const std::vector<int64_t>& counts,
                           int width = 40);

// Whether t looks like images: uint8 [N, H, W] or [N, C, H, W] with C in {1, 3}.
bool image_like(const Array& a);
// Writes images (uint8 [N, H, W] or [N, C, H, W]) as one PNG grid, up to 8 per row.
void write_png_grid(const Array& images, const std::filesystem::path& file);
// Draws images in the terminal with a 10-level character ramp, at most `width` columns each.
std::string draw_images(const Array& images, int width = 56);

}  // namespace tdstore::cli
