// The subcommands of the tdstore CLI. Each returns the process exit code (docs/CLI.md) and
// throws tdstore::Error subclasses, which main() maps to exit codes.
#pragma once

#include <string>
#include <vector>

namespace tdstore::cli {

// Exit codes (docs/CLI.md).
enum Exit : int {
  kOk = 0,
  kUsage = 1,
  kNotAStore = 2,
  kCorrupt = 3,
  kLocked = 4,
  kIO = 5,
  kOther = 6,
  kDiffer = 8,
};

struct Args {
  std::string store, other, key, prefix, rows, png;
  std::vector<std::string> keys;
  bool json = false, flat = false, verify = false, draw = false, clear = false, append = false;
  bool progress = false;                     // --progress: progress lines on stderr
  bool user = false, sign = false;           // cache: --user, --sign
  std::string new_key;                       // key --new
  std::string safetensors, npy, tensordict;  // export targets
  int64_t chunk_mib = 64;                    // import: rows copied per commit
  std::string invalidate, function;
  int bins = 20;
  int64_t key_capacity = 0;  // compact: 0 keeps the capacity
  std::string compress;      // import, compact: --compress (Compression::parse); "" unset
};

int cmd_info(const Args& a);
int cmd_ls(const Args& a);
int cmd_show(const Args& a);
int cmd_stats(const Args& a);
int cmd_du(const Args& a);
int cmd_verify(const Args& a);
int cmd_diff(const Args& a);
int cmd_compact(const Args& a);
int cmd_lazy(const Args& a);
int cmd_cache(const Args& a);
int cmd_key(const Args& a);
int cmd_import(const Args& a);
int cmd_export(const Args& a);

// The same subcommands on a dataset directory (tools/cli/dataset.cpp), per shard and in total.
int dataset_info(const Args& a);
int dataset_ls(const Args& a);
int dataset_verify(const Args& a);
int dataset_du(const Args& a);

}  // namespace tdstore::cli
