// libFuzzer target: a key directory and an arena in memory (input: u8 mode, u32 directory
// length, the directory's bytes, the arena's bytes; mode bit 0: reseal every checksum first).
// Opening, listing, looking up and reading every entry and checking the structure must end in
// success or a tdstore::Error: never a crash, a hang, an out-of-bounds read or undefined behaviour.
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "storage/checksum.h"
#include "storage/directory.h"
#include "storage/store.h"
#include "tdstore/errors.h"

// Recomputes every checksum, so that mutations reach the checks behind them: the crafted
// values a valid checksum does not vouch for (sizes, offsets, history pointers, key lengths).
void reseal(std::string& directory, std::string& arena) {
  using namespace tdstore::storage;
  for (uint64_t off : kHeaderCopyOffset)
    if (directory.size() >= off + sizeof(DirHeader)) {
      DirHeader h;
      std::memcpy(&h, directory.data() + off, sizeof h);
      seal(h);
      std::memcpy(directory.data() + off, &h, sizeof h);
    }
  auto reseal_records = [](std::string& bytes, uint64_t from) {
    for (uint64_t off = from; off + sizeof(SlotRecord) <= bytes.size(); off += sizeof(SlotRecord)) {
      SlotRecord r;
      std::memcpy(&r, bytes.data() + off, sizeof r);
      if (r.generation == 0) continue;
      seal(r);
      std::memcpy(bytes.data() + off, &r, sizeof r);
    }
  };
  uint64_t slots_from = kSlotsOffset;  // format 4: past the key index
  if (directory.size() >= sizeof(DirHeader)) {
    DirHeader h;
    std::memcpy(&h, directory.data(), sizeof h);
    if (std::has_single_bit(h.slot_count) && h.slot_count <= kMaxSlotCount)
      slots_from = slot_layout(h.format_version, h.slot_count).base;
  }
  reseal_records(directory, slots_from);
  reseal_records(arena, kArenaDataOffset);  // history copies, where they happen to lie
  if (arena.size() >= sizeof(ArenaHeader)) {
    ArenaHeader a;
    std::memcpy(&a, arena.data(), sizeof a);
    a.checksum = xxh3(&a, offsetof(ArenaHeader, checksum));
    std::memcpy(arena.data(), &a, sizeof a);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const bool resealed = data[0] & 1;
  uint32_t dir_len;
  std::memcpy(&dir_len, data + 1, 4);
  std::string_view rest(reinterpret_cast<const char*>(data) + 5, size - 5);
  if (dir_len > rest.size()) return 0;
  std::string directory(rest.substr(0, dir_len)), arena(rest.substr(dir_len));
  if (resealed) reseal(directory, arena);
  try {
    auto s = tdstore::storage::Store::open_memory(directory, arena);
    std::vector<std::string> keys;
    s->for_each([&](std::string_view k, const tdstore::storage::Entry&) { keys.emplace_back(k); });
    uint64_t sum = 0;
    for (const auto& k : keys) {
      try {
        if (auto e = s->find(k)) sum ^= tdstore::storage::xxh3(s->view(*e).data, e->nbytes);
      } catch (const tdstore::Error&) {
      }
    }
    s->verify();
    (void)sum;
  } catch (const tdstore::Error&) {
  }
  return 0;
}
