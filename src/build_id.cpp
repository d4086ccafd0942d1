#include "src/build_id.h"

#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "storage/checksum.h"

namespace tdstore::detail {
namespace {

int find_note(struct dl_phdr_info* info, size_t, void* out) {
  auto* id = static_cast<std::string*>(out);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((n->n_namesz + 3) & ~3u);
      if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (uint32_t b = 0; b < n->n_descsz; ++b)
          *id += fmt::format("{:02x}", static_cast<unsigned char>(desc[b]));
        return 1;
      }
      p = desc + ((n->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // only the first object (the executable) is examined
}

}  // namespace

const std::string& executable_build_id() {
  static const std::string id = [] {
    std::string s;
    dl_iterate_phdr(find_note, &s);
    if (!s.empty()) return s;
    std::ifstream exe("/proc/self/exe", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(exe)), {});
    return fmt::format("x{:016x}", storage::xxh3(bytes));
  }();
  return id;
}

}  // namespace tdstore::detail
