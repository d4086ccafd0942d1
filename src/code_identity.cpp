#include "src/code_identity.h"

#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "storage/checksum.h"

namespace tdstore::detail {
namespace {

struct Search {
  uintptr_t address;
  std::string id;
  std::string file;
  bool found = false;
  uintptr_t base = 0;
};

std::string note_build_id(const struct dl_phdr_info* info) {
  std::string id;
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
          id += fmt::format("{:02x}", static_cast<unsigned char>(desc[b]));
        return id;
      }
      p = desc + ((n->n_descsz + 3) & ~3u);
    }
  }
  return id;
}

int find_object(struct dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (s->address < lo || s->address - lo >= ph.p_memsz) continue;
    s->found = true;
    s->base = info->dlpi_addr;
    s->id = note_build_id(info);
    s->file = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
    return 1;
  }
  return 0;
}

}  // namespace

std::string object_build_id(const void* address, uintptr_t* offset) {
  Search s{reinterpret_cast<uintptr_t>(address), {}, {}};
  dl_iterate_phdr(find_object, &s);
  if (offset) *offset = s.address - s.base;
  if (!s.found) return "";
  if (!s.id.empty()) return s.id;
  std::ifstream in(s.file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  return fmt::format("x{:016x}", storage::xxh3(bytes));
}

std::string code_identity(const std::type_info& type, const void* function,
                          const std::string& extra) {
  std::string parts;
  if (function) {
    uintptr_t offset = 0;
    parts = object_build_id(function, &offset);
    parts += fmt::format("+{:x}", offset);
  } else {
    parts = object_build_id(&type, nullptr);
  }
  parts += '\n';
  parts += type.name();
  parts += '\n' + extra;
  return fmt::format("{:016x}", storage::xxh3(parts));
}

}  // namespace tdstore::detail
