#include "output.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>

#include "tdstore/errors.h"
#include "values.h"

namespace tdstore::cli {

double ratio(uint64_t raw, uint64_t stored) {
  return stored ? static_cast<double>(raw) / static_cast<double>(stored) : 1.0;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string iso_time(int64_t ns) {
  auto secs = static_cast<time_t>(ns / 1000000000);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&secs));
  return buf;
}

Progress::Progress(std::string label, uint64_t total, bool lines)
    : label_(std::move(label)), total_(total), tty_(!lines && ::isatty(2) != 0), lines_(lines) {}

Progress::~Progress() {
  if (tty_ && last_permille_ >= 0) fmt::print(stderr, "\n");
}

void Progress::update(uint64_t done) {
  if (lines_) {
    fmt::print(stderr, "{}: {} of {}\n", label_, done, total_);
    std::fflush(stderr);
    return;
  }
  if (!tty_) return;
  int permille = total_ ? static_cast<int>(done * 1000 / total_) : 1000;
  if (permille == last_permille_) return;
  last_permille_ = permille;
  int filled = permille * 30 / 1000;
  fmt::print(stderr, "\r{} [{}{}] {:5.1f}% {} / {}", label_, std::string(filled, '#'),
             std::string(30 - filled, ' '), permille / 10.0, human_bytes(done),
             human_bytes(total_));
  std::fflush(stderr);
}

namespace {

std::string scalar(const Array& a, uint64_t i) {
  if (a.dtype == DType::Bool) return integer_at(a, i) ? "True" : "False";
  if (is_complex(a.dtype)) {
    auto c = complex_at(a, i);
    return fmt::format("{:.4g}{:+.4g}j", c.real(), c.imag());
  }
  if (is_integral(a.dtype)) return std::to_string(integer_at(a, i));
  return fmt::format("{:.4g}", value_at(a, i));
}

// The elements of dims [dim, ndim) starting at flat index `base` (C order).
void format_rec(std::ostringstream& os, const Array& a, size_t dim, uint64_t base, bool summarize,
                int64_t edge) {
  if (dim == a.shape.size()) {
    os << scalar(a, base);
    return;
  }
  uint64_t stride = 1;
  for (size_t d = dim + 1; d < a.shape.size(); ++d) stride *= static_cast<uint64_t>(a.shape[d]);
  const int64_t n = a.shape[dim];
  os << "[";
  std::string sep = dim + 1 == a.shape.size() ? ", " : ",\n" + std::string(dim + 1, ' ');
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * edge && i == edge) {
      os << "..." << sep;
      i = n - edge;
    }
    format_rec(os, a, dim + 1, base + static_cast<uint64_t>(i) * stride, summarize, edge);
    if (i + 1 < n) os << sep;
  }
  os << "]";
}

}  // namespace

std::string format_array(const Array& a, int64_t threshold, int64_t edge) {
  std::ostringstream os;
  format_rec(os, a, 0, 0, a.numel() > threshold, edge);
  os << "\n[ " << dtype_name(a.dtype) << " " << shape_str(a.shape) << " ]";
  return os.str();
}

std::string draw_histogram(const std::vector<double>& edges, const std::vector<int64_t>& counts,
                           int width) {
  int64_t peak = 1;
  for (auto c : counts) peak = std::max(peak, c);
  std::string out;
  for (size_t i = 0; i < counts.size(); ++i) {
    int len = static_cast<int>(counts[i] * width / peak);
    std::string bar;
    for (int k = 0; k < len; ++k) bar += "\u2588";
    if (len == 0 && counts[i] > 0) bar = "\u258f";
    out += fmt::format("  [{:>10.4g}, {:>10.4g}{} {}{} {}\n", edges[i], edges[i + 1],
                       i + 1 == counts.size() ? "]" : ")", bar,
                       std::string(width - std::max(len, counts[i] > 0 && len == 0 ? 1 : 0), ' '),
                       counts[i]);
  }
  return out;
}

bool image_like(const Array& a) {
  return a.dtype == DType::UInt8 &&
         (a.shape.size() == 3 || (a.shape.size() == 4 && (a.shape[1] == 1 || a.shape[1] == 3)));
}

namespace {

void chunk(std::string& png, const char* type, const std::string& data) {
  uint32_t len = static_cast<uint32_t>(data.size());
  char be[4] = {static_cast<char>(len >> 24), static_cast<char>(len >> 16),
                static_cast<char>(len >> 8), static_cast<char>(len)};
  png.append(be, 4);
  std::string body = std::string(type, 4) + data;
  png += body;
  uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
  char cb[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                static_cast<char>(crc >> 8), static_cast<char>(crc)};
  png.append(cb, 4);
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// The dims of images as [N, C, H, W] (uint8 [N, H, W] has one channel).
struct Nchw {
  int64_t n, c, h, w;
};
Nchw nchw(const Array& images) {
  const auto& s = images.shape;
  return s.size() == 3 ? Nchw{s[0], 1, s[1], s[2]} : Nchw{s[0], s[1], s[2], s[3]};
}

}  // namespace

void write_png_grid(const Array& images, const std::filesystem::path& file) {
  auto [n, c, h, w] = nchw(images);
  if (n == 0) throw ArgumentError("no rows to draw");
  int64_t cols = std::min<int64_t>(n, 8), rows = (n + cols - 1) / cols;
  int64_t gh = rows * h + (rows - 1), gw = cols * w + (cols - 1);  // 1-pixel gaps
  std::vector<uint8_t> px(static_cast<size_t>(gh * gw * c), 0);
  const auto* src = static_cast<const uint8_t*>(images.data);
  for (int64_t i = 0; i < n; ++i) {
    int64_t oy = (i / cols) * (h + 1), ox = (i % cols) * (w + 1);
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t ch = 0; ch < c; ++ch)
          px[static_cast<size_t>(((oy + y) * gw + ox + x) * c + ch)] =
              src[((i * c + ch) * h + y) * w + x];
  }
  std::string raw;
  raw.reserve(static_cast<size_t>(gh * (gw * c + 1)));
  for (int64_t y = 0; y < gh; ++y) {
    raw.push_back('\0');  // filter: none
    raw.append(reinterpret_cast<const char*>(&px[static_cast<size_t>(y * gw * c)]),
               static_cast<size_t>(gw * c));
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &zlen,
                reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                6) != Z_OK)
    throw Error("zlib compression failed");
  z.resize(zlen);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr = be32(static_cast<uint32_t>(gw)) + be32(static_cast<uint32_t>(gh));
  ihdr += static_cast<char>(8);               // bit depth
  ihdr += static_cast<char>(c == 3 ? 2 : 0);  // color type: RGB or grayscale
  ihdr += std::string("\0\0\0", 3);           // compression, filter, interlace
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", "");
  std::ofstream out(file, std::ios::binary);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  if (!out) throw IOError(file.string() + ": cannot write");
}

std::string draw_images(const Array& images, int width) {
  static const char ramp[] = " .:-=+*#%@";
  auto [n, c, h, w] = nchw(images);
  int64_t step = std::max<int64_t>(1, (w + width - 1) / width);
  const auto* src = static_cast<const uint8_t*>(images.data);
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    out += fmt::format("row {}:\n", i);
    for (int64_t y = 0; y < h; y += step * 2) {  // characters are about twice as tall as wide
      std::string line;
      for (int64_t x = 0; x < w; x += step) {
        int v = 0;
        for (int64_t ch = 0; ch < c; ++ch) v += src[((i * c + ch) * h + y) * w + x];
        line += ramp[v / c * 10 / 256];
      }
      out += line + "\n";
    }
  }
  return out;
}

}  // namespace tdstore::cli
