// libFuzzer target: a key directory and an arena (input: u8 mode, u32 directory length, the
// directory's bytes, the arena's bytes; mode bit 0: reseal every checksum first), written as the
// files of a store on tmpfs beside a real catalog and opened read-only through Store::open, as a
// user would open them. Opening, listing, looking up and reading every entry and checking the
// structure must end in success or a tdstore::Error: never a crash (SIGBUS included), a hang, an
// out-of-bounds read or undefined behaviour.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

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

namespace {
namespace fs = std::filesystem;

tdstore::StoreOptions options() {
  tdstore::StoreOptions o;
  o.arena_reserve = int64_t{1} << 30;
  return o;
}

// A store made once per process on tmpfs (when there is one): its catalog and lock files stay,
// its key directory and arena are replaced by each input. The catalog has gone through enough
// transactions that the seeds' headers (catalog_txn) do not stop the open before the directory.
const fs::path& store_dir() {
  static const fs::path dir = [] {
    const fs::path base =
        fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    const std::string prefix = "tdstore-fuzz-directory-";
    // libFuzzer ends a timed run without exit handlers: stores of runs that ended go here.
    for (const auto& e : fs::directory_iterator(base)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
        fs::remove_all(e.path());
    }
    fs::path d = base / (prefix + std::to_string(::getpid()));
    fs::remove_all(d);
    auto s = tdstore::storage::Store::create(d, {}, options());
    for (int i = 0; i < 16; ++i) {  // two catalog transactions each, leaving no record
      s->put_cache("graph/txn", "x");
      s->put_cache("graph/txn", std::nullopt);
    }
    s.reset();
    std::atexit([] { fs::remove_all(store_dir()); });
    return d;
  }();
  return dir;
}

void replace_file(const fs::path& p, const std::string& bytes) {
  int fd = ::open(p.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const bool resealed = data[0] & 1;
  uint32_t dir_len;
  std::memcpy(&dir_len, data + 1, 4);
  std::string_view rest(reinterpret_cast<const char*>(data) + 5, size - 5);
  if (dir_len > rest.size()) return 0;
  std::string directory(rest.substr(0, dir_len)), arena(rest.substr(dir_len));
  if (resealed) reseal(directory, arena);
  const fs::path& dir = store_dir();
  replace_file(dir / tdstore::storage::kDirectoryFile, directory);
  replace_file(dir / tdstore::storage::kArenaFile, arena);
  try {
    auto s = tdstore::storage::Store::open(dir, tdstore::OpenMode::ReadOnly, options());
    std::vector<std::string> keys;
    s->for_each([&](std::string_view k, const tdstore::storage::Entry&) { keys.emplace_back(k); });
    uint64_t sum = 0;
    for (const auto& k : keys) {
      try {
        if (auto e = s->find(k)) {
          sum ^= tdstore::storage::xxh3(s->view(*e).data, e->nbytes);
          if (e->compressed()) {  // what get() does: the index checked, then the raw size
            s->check_stored(k, *e);
            std::vector<uint8_t> raw(e->raw_nbytes);
            s->read_rows(k, *e, 0, e->shape.empty() ? 1 : e->shape[0], raw.data());
          }
        }
      } catch (const tdstore::Error&) {
      }
    }
    s->verify();
    (void)sum;
  } catch (const tdstore::Error&) {
  }
  return 0;
}
