// The states a power loss can leave, built from the system calls a workload made (recorded by
// tests/crash/syscall_log.c), in the spirit of LevelDB's fault_injection_test and of ALICE
// (OSDI 2014). The model is POSIX's, not a kind file system's:
//
// - a write or truncate of a file survives for sure only when an fsync/fdatasync of that file
//   followed it; otherwise each 512-byte sector (or 4 KiB page) of the file holds what it held
//   at one point between the last sync and the crash, chosen per sector: an unsynced write may
//   be lost, kept or torn at sector boundaries, and writes to different sectors persist in any
//   order, but a later write to a sector never without the earlier ones (sectors are written
//   whole, from the page cache's current content);
// - a directory entry created, renamed or removed survives for sure only when an fsync of the
//   directory (of both, for a rename across two) followed; otherwise it may or may not;
// - a write through a descriptor opened with O_DSYNC or O_SYNC is synced when it returns;
// - bytes written through shared mappings are not in the log: the files they live in (the reader
//   table, LMDB's lock file) come back as zeros, as after a reboot that lost them.
//
// CrashStates turns a log into a list of operations on inodes, then builds, for a crash after
// the first k operations, the directory tree a power loss could leave given a choice for each
// unsynced operation. The workload marks its acknowledged states by writing "N\n" to
// <root>/ACK; those writes are acknowledgements, not files of the state.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "storage/checksum.h"

namespace tdstore::testing {

class CrashStates {
 public:
  struct Op {
    enum Kind { Create, Mkdir, Write, Truncate, Sync, Rename, Exchange, Unlink, Ack } kind;
    uint32_t inode = 0, inode2 = 0;    // the file or entry; Exchange: the second entry
    uint32_t parent = 0, parent2 = 0;  // directories whose entries change
    std::string name, name2;
    uint64_t offset = 0;  // Write: offset; Truncate: size; Ack: the state acknowledged
    std::string data;
  };

  // Reads the log of a workload run under `root` (which was empty when the run started).
  CrashStates(const std::filesystem::path& log, const std::filesystem::path& root)
      : root_(root.string()) {
    dirs_.push_back(true);  // inode 0: root
    ns_[root_] = 0;
    std::ifstream in(log, std::ios::binary);
    for (;;) {
      uint32_t kind, fd, lens[2];
      uint64_t ab[2], data_len;
      if (!in.read(reinterpret_cast<char*>(&kind), 4)) break;
      in.read(reinterpret_cast<char*>(&fd), 4);
      in.read(reinterpret_cast<char*>(ab), 16);
      in.read(reinterpret_cast<char*>(lens), 8);
      in.read(reinterpret_cast<char*>(&data_len), 8);
      std::string path(lens[0], '\0'), path2(lens[1], '\0'), data(data_len, '\0');
      in.read(path.data(), lens[0])
          .read(path2.data(), lens[1])
          .read(data.data(), static_cast<std::streamsize>(data_len));
      if (!in) throw std::runtime_error(log.string() + ": truncated syscall log");
      resolve(kind, static_cast<int32_t>(fd), ab[0], ab[1], path, path2, std::move(data));
    }
    // For each op, the index of the next sync of each inode after it.
    next_sync_.assign(ops_.size(), {});
    std::map<uint32_t, size_t> next;
    for (size_t i = ops_.size(); i-- > 0;) {
      next_sync_[i] = next;
      if (ops_[i].kind == Op::Sync) next[ops_[i].inode] = i;
    }
  }

  const std::vector<Op>& ops() const { return ops_; }
  size_t size() const { return ops_.size(); }

  // The last state acknowledged before a crash after ops [0, k) (-1: none), and whether a later
  // one was in flight.
  int64_t acked_before(size_t k) const {
    int64_t n = -1;
    for (size_t i = 0; i < k; ++i)
      if (ops_[i].kind == Op::Ack) n = static_cast<int64_t>(ops_[i].offset);
    return n;
  }

  // Whether op i certainly survives a crash after ops [0, k).
  bool synced(size_t i, size_t k) const {
    const Op& o = ops_[i];
    auto synced_after = [&](uint32_t inode) {
      auto it = next_sync_[i].find(inode);
      return it != next_sync_[i].end() && it->second < k;
    };
    switch (o.kind) {
      case Op::Write:
      case Op::Truncate:
        return synced_after(o.inode);
      case Op::Create:
      case Op::Mkdir:
      case Op::Unlink:
        return synced_after(o.parent);
      case Op::Rename:
      case Op::Exchange:
        return synced_after(o.parent) && synced_after(o.parent2);
      default:
        return true;
    }
  }

  // How a crash treats the unsynced calls before it.
  struct Choice {
    enum Kind { Lost, Kept, DropOne, Random } kind = Lost;
    size_t dropped = 0;  // DropOne: this call is lost (for a write: in every sector it touched)
    uint64_t sector =
        512;  // Random: the unit a file's bytes persist in (512 B sectors, 4 KiB pages)
  };

  // The tree a crash after ops [0, k) leaves under `choice`, written under `out` (which must
  // not exist); `rng` draws the Random choices. Returns a digest of the tree, equal for equal
  // trees.
  //
  // Directory entries: each unsynced entry operation is kept or lost by itself. File bytes:
  // each sector (choice.sector bytes) holds its content as of one point between the file's
  // last sync and the crash, chosen per sector, and the file's size is its size at one such
  // point: an unsynced write may be lost, kept or torn, writes to different sectors persist in
  // any order, and a later write to a sector never persists without the earlier ones to it
  // (the page cache writes back what a page holds then).
  uint64_t materialize(size_t k, const Choice& choice, std::mt19937& rng,
                       const std::filesystem::path& out) const {
    std::vector<std::map<std::string, uint32_t>> entries(dirs_.size());
    auto kept = [&](size_t i) {
      if (synced(i, k)) return true;
      switch (choice.kind) {
        case Choice::Lost:
          return false;
        case Choice::Kept:
          return true;
        case Choice::DropOne:
          return i != choice.dropped;
        default:
          return rng() % 2 == 0;
      }
    };
    const FileVersions& fv = file_versions(k);
    const auto& versions = fv.versions;
    const auto& version_op = fv.version_op;
    for (size_t i = 0; i < k; ++i) {
      const Op& o = ops_[i];
      switch (o.kind) {
        case Op::Create:
        case Op::Mkdir:
          if (kept(i)) entries[o.parent][o.name] = o.inode;
          break;
        case Op::Unlink:
          if (auto it = entries[o.parent].find(o.name);
              it != entries[o.parent].end() && it->second == o.inode && kept(i))
            entries[o.parent].erase(it);
          break;
        case Op::Rename:
          if (auto it = entries[o.parent].find(o.name);
              it != entries[o.parent].end() && it->second == o.inode && kept(i)) {
            entries[o.parent].erase(it);
            entries[o.parent2][o.name2] = o.inode;
          }
          break;
        case Op::Exchange: {
          auto a = entries[o.parent].find(o.name);
          auto b = entries[o.parent2].find(o.name2);
          if (a != entries[o.parent].end() && b != entries[o.parent2].end() &&
              a->second == o.inode && b->second == o.inode2 && kept(i))
            std::swap(a->second, b->second);
          break;
        }
        default:
          break;
      }
    }
    // A file's bytes at the crash.
    auto content = [&](uint32_t inode) {
      const auto& v = versions[inode];
      const size_t last = v.size() - 1;
      auto point = [&]() -> size_t {  // which version a sector (or the size) keeps
        switch (choice.kind) {
          case Choice::Lost:
            return 0;
          case Choice::Kept:
            return last;
          case Choice::DropOne: {
            size_t p = last;  // the versions from the dropped write on are lost
            for (size_t j = 1; j <= last; ++j)
              if (version_op[inode][j] == choice.dropped) p = j - 1;
            return p;
          }
          default:
            return rng() % (last + 1);
        }
      };
      if (last == 0) return v[0];
      std::string out(v[point()].size(), '\0');
      const uint64_t unit = choice.kind == Choice::Random ? choice.sector : 512;
      for (uint64_t at = 0; at < out.size(); at += unit) {
        size_t p = point();
        if (choice.kind == Choice::DropOne) {  // only the sectors the dropped write touched
          const Op& d = ops_[choice.dropped];
          if (d.kind != Op::Write || d.inode != inode || at + unit <= d.offset ||
              at >= d.offset + d.data.size())
            p = last;
        }
        const std::string& src = v[p];
        if (at < src.size())
          std::memcpy(out.data() + at, src.data() + at,
                      std::min<uint64_t>(unit, std::min(src.size(), out.size()) - at));
      }
      return out;
    };
    uint64_t digest = 0;
    auto mix = [&](const std::string& s) {
      digest = storage::xxh3(s.data(), s.size()) ^ (digest * 0x9E3779B97F4A7C15ull);
    };
    std::function<void(uint32_t, const std::filesystem::path&, const std::string&)> write_tree =
        [&](uint32_t dir, const std::filesystem::path& at, const std::string& rel) {
          std::filesystem::create_directories(at);
          for (const auto& [name, inode] : entries[dir]) {
            mix(rel + "/" + name);
            if (dirs_[inode]) {
              write_tree(inode, at / name, rel + "/" + name);
            } else {
              const std::string bytes = content(inode);
              mix(bytes);
              write_sparse(at / name, bytes);
            }
          }
        };
    write_tree(0, out, "");
    return digest;
  }

 private:
  // Per file: the durable content after ops [0, k), then its content after each later unsynced
  // write, and which op made each version. A function of k alone, so the variants of one crash
  // point share it (the last k's is kept: the callers visit each k's variants in a row).
  struct FileVersions {
    std::vector<std::vector<std::string>> versions;
    std::vector<std::vector<size_t>> version_op;
  };
  const FileVersions& file_versions(size_t k) const {
    if (versions_k_ == k) return versions_;
    FileVersions& fv = versions_;
    fv.versions.assign(dirs_.size(), std::vector<std::string>(1));
    fv.version_op.assign(dirs_.size(), std::vector<size_t>(1, SIZE_MAX));
    for (size_t i = 0; i < k; ++i) {
      const Op& o = ops_[i];
      if (o.kind != Op::Write && o.kind != Op::Truncate) continue;
      // A synced op follows only synced ones on its file (a sync covers every earlier write):
      // it changes the durable content in place. An unsynced one adds a version.
      if (!synced(i, k)) {
        fv.versions[o.inode].push_back(fv.versions[o.inode].back());
        fv.version_op[o.inode].push_back(i);
      }
      std::string& next = fv.versions[o.inode].back();
      if (o.kind == Op::Truncate) {
        next.resize(o.offset, '\0');
      } else {
        if (next.size() < o.offset + o.data.size()) next.resize(o.offset + o.data.size(), '\0');
        std::memcpy(next.data() + o.offset, o.data.data(), o.data.size());
      }
    }
    versions_k_ = k;
    return fv;
  }
  mutable FileVersions versions_;
  mutable size_t versions_k_ = SIZE_MAX;

  // Writes bytes to a new file, leaving its all-zero 4 KiB blocks as holes (cheap on tmpfs).
  static void write_sparse(const std::filesystem::path& file, const std::string& bytes) {
    static const char zero[4096] = {};
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes.size())) != 0)
      throw std::runtime_error(file.string() + ": cannot write a crash state");
    for (size_t at = 0; at < bytes.size(); at += sizeof zero) {
      const size_t n = std::min(sizeof zero, bytes.size() - at);
      if (std::memcmp(bytes.data() + at, zero, n) == 0) continue;
      if (::pwrite(fd, bytes.data() + at, n, static_cast<off_t>(at)) != static_cast<ssize_t>(n))
        throw std::runtime_error(file.string() + ": cannot write a crash state");
    }
    ::close(fd);
  }
  uint32_t new_inode(bool dir) {
    dirs_.push_back(dir);
    return static_cast<uint32_t>(dirs_.size() - 1);
  }
  // The parent directory's inode and the entry's name; false when the parent is unknown.
  bool split(const std::string& path, uint32_t* parent, std::string* name) const {
    const auto slash = path.rfind('/');
    if (slash == std::string::npos) return false;
    auto it = ns_.find(path.substr(0, slash));
    if (it == ns_.end()) return false;
    *parent = it->second;
    *name = path.substr(slash + 1);
    return true;
  }
  void move_tree(const std::string& from, const std::string& to,
                 std::map<std::string, uint32_t>& into) {
    for (auto it = ns_.lower_bound(from);
         it != ns_.end() && it->first.compare(0, from.size(), from) == 0;) {
      if (it->first.size() == from.size() || it->first[from.size()] == '/') {
        into[to + it->first.substr(from.size())] = it->second;
        it = ns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void resolve(uint32_t kind, int32_t fd, uint64_t a, uint64_t b, const std::string& path,
               const std::string& path2, std::string data) {
    const std::string ack = root_ + "/ACK";
    Op o{};
    switch (kind) {
      case 1: {  // open
        if (path == ack) {
          fds_[fd] = UINT32_MAX;
          return;
        }
        if (a == 1) {  // created
          o.kind = Op::Create;
          if (!split(path, &o.parent, &o.name)) return;
          o.inode = new_inode(false);
          ns_[path] = o.inode;
          ops_.push_back(o);
        }
        auto it = ns_.find(path);
        if (it != ns_.end()) fds_[fd] = it->second;
        if (b == 1)
          sync_fds_.insert(fd);
        else
          sync_fds_.erase(fd);
        return;
      }
      case 2:
        fds_.erase(fd);
        sync_fds_.erase(fd);
        return;
      case 3:
      case 4:
      case 5: {
        auto it = fds_.find(fd);
        if (it == fds_.end()) return;
        if (it->second == UINT32_MAX) {  // an acknowledgement
          if (kind == 3) ops_.push_back(Op{Op::Ack, 0, 0, 0, 0, "", "", std::stoull(data), ""});
          return;
        }
        o.kind = kind == 3 ? Op::Write : kind == 4 ? Op::Truncate : Op::Sync;
        o.inode = it->second;
        o.offset = a;
        o.data = std::move(data);
        ops_.push_back(std::move(o));
        // A write through an O_DSYNC descriptor (LMDB's meta pages) is durable when it returns.
        if (kind == 3 && sync_fds_.count(fd))
          ops_.push_back(Op{Op::Sync, it->second, 0, 0, 0, "", "", 0, ""});
        return;
      }
      case 6:  // mkdir
        o.kind = Op::Mkdir;
        if (!split(path, &o.parent, &o.name)) return;
        o.inode = new_inode(true);
        ns_[path] = o.inode;
        ops_.push_back(o);
        return;
      case 7: {  // rename, exchange
        auto from = ns_.find(path);
        if (from == ns_.end() || !split(path, &o.parent, &o.name) ||
            !split(path2, &o.parent2, &o.name2))
          return;
        o.inode = from->second;
        std::map<std::string, uint32_t> moved;
        if (a == 1) {
          auto to = ns_.find(path2);
          if (to == ns_.end()) return;
          o.kind = Op::Exchange;
          o.inode2 = to->second;
          move_tree(path, path2, moved);
          move_tree(path2, path, moved);
        } else {
          o.kind = Op::Rename;
          move_tree(path2, "", moved), moved.clear();  // a replaced entry goes away
          move_tree(path, path2, moved);
        }
        for (auto& [p, i] : moved) ns_[p] = i;
        ops_.push_back(o);
        return;
      }
      case 8: {  // unlink, rmdir
        auto it = ns_.find(path);
        if (it == ns_.end() || !split(path, &o.parent, &o.name)) return;
        o.kind = Op::Unlink;
        o.inode = it->second;
        std::map<std::string, uint32_t> gone;
        move_tree(path, "", gone);
        ops_.push_back(o);
        return;
      }
      default:
        throw std::runtime_error("syscall log: unknown record kind " + std::to_string(kind));
    }
  }

  std::string root_;
  std::vector<bool> dirs_;              // per inode: a directory
  std::map<std::string, uint32_t> ns_;  // the namespace as the run went (no crash)
  std::map<int32_t, uint32_t> fds_;     // open descriptors (UINT32_MAX: the ACK file)
  std::set<int32_t> sync_fds_;          // those opened with O_DSYNC or O_SYNC
  std::vector<Op> ops_;
  std::vector<std::map<uint32_t, size_t>> next_sync_;
};

}  // namespace tdstore::testing
