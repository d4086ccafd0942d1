// `tdstore`: inspect stored dicts from a shell. Subcommands, options, JSON schemas and exit codes
// are documented in docs/CLI.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"

using namespace tdstore::cli;

int main(int argc, char** argv) {
  CLI::App app{"tdstore: inspect memory-mapped TensorDict stores (docs/CLI.md)"};
  app.require_subcommand(1);
  Args a;
  auto store_arg = [&](CLI::App* c) {
    c->add_option("STORE", a.store, "store directory")->required();
  };
  auto json_flag = [&](CLI::App* c) {
    c->add_flag("--json", a.json, "machine-readable output (docs/CLI.md)");
  };
  auto progress_flag = [&](CLI::App* c) {
    c->add_flag("--progress", a.progress,
                "print progress lines on stderr (\"LABEL: DONE of TOTAL\"), terminal or not");
  };

  auto* info =
      app.add_subcommand("info", "format version, generation, keys, arena and catalog usage");
  store_arg(info), json_flag(info);

  auto* ls =
      app.add_subcommand("ls", "keys as a tree with dtype, shape, bytes, flags and checksum");
  store_arg(ls), json_flag(ls);
  ls->add_option("PREFIX", a.prefix, "list only keys under this prefix");
  ls->add_flag("--flat", a.flat, "one full path per line");
  ls->add_flag("--verify", a.verify, "re-hash each key and show ok/CORRUPT");

  auto* show = app.add_subcommand("show", "print a tensor's values (summarized when large)");
  store_arg(show), json_flag(show);
  show->add_option("KEY", a.key, "key path")->required();
  show->add_option("--rows", a.rows, "rows A:B of batch dim 0 (A: alone for one row)");
  show->add_option("--png", a.png,
                   "write image-like rows (uint8 [N,H,W] or [N,C,H,W]) to a PNG grid");
  show->add_flag("--draw", a.draw, "draw image-like rows in the terminal");

  auto* stats = app.add_subcommand("stats", "min, max, mean, std, NaN and Inf counts, histogram");
  store_arg(stats), json_flag(stats);
  stats->add_option("KEY", a.keys, "keys (default: all)");
  stats->add_option("--bins", a.bins, "histogram bins")->check(CLI::PositiveNumber);

  auto* verify = app.add_subcommand("verify", "re-hash tensors and compare their checksums");
  store_arg(verify), json_flag(verify);
  verify->add_option("KEY", a.keys, "keys (default: all)");
  progress_flag(verify);

  auto* du = app.add_subcommand("du", "bytes per key and prefix; used, reclaimable and free arena");
  store_arg(du), json_flag(du);

  auto* diff = app.add_subcommand("diff", "keys added, removed, changed in spec or content");
  diff->add_option("A", a.store, "first store")->required();
  diff->add_option("B", a.other, "second store")->required();
  json_flag(diff);

  auto* compact =
      app.add_subcommand("compact", "rewrite the arena without holes, swapped in atomically");
  store_arg(compact), json_flag(compact);
  compact
      ->add_option("--key-capacity", a.key_capacity, "rebuild the key directory for this many keys")
      ->check(CLI::PositiveNumber);
  compact->add_option("--compress", a.compress,
                      "rewrite every key zstd[:LEVEL[:BLOCK_BYTES]] or none, the store's new "
                      "default");
  progress_flag(compact);

  auto* lazy = app.add_subcommand("lazy", "lazy properties with their provenance");
  store_arg(lazy), json_flag(lazy);
  lazy->add_option("--invalidate", a.invalidate,
                   "forget KEY's provenance (opens the store for writing)");

  auto* cache = app.add_subcommand(
      "cache", "compiled graphs stored in a catalog, with who signed them (docs/CLI.md)");
  json_flag(cache);
  auto* cache_store = cache->add_option("STORE", a.store, "store directory");
  auto* cache_user = cache->add_flag("--user", a.user, "this user's graph cache instead of a store")
                         ->excludes(cache_store);
  cache_store->excludes(cache_user);
  cache->add_option("--function", a.function, "only this function's graphs");
  auto* cache_clear = cache->add_flag("--clear", a.clear, "remove the graphs listed");
  cache
      ->add_flag("--sign", a.sign,
                 "sign the unsigned graphs listed with this user's key (you vouch for them)")
      ->excludes(cache_clear);

  auto* key = app.add_subcommand("key", "the keys this user signs and trusts graphs with");
  json_flag(key);
  key->add_option("--new", a.new_key, "write a new random key (a team key) to this file");

  auto* import =
      app.add_subcommand("import",
                         "tensors from IDX, .npy, safetensors files or directories (a tensordict "
                         "memmap directory, a directory of .npy files) into a store");
  store_arg(import);
  import
      ->add_option("SOURCE", a.keys,
                   "KEY=FILE (.npy, IDX raw or .gz), [PREFIX=]FILE.safetensors or [PREFIX=]DIR "
                   "(tensordict memmap: DIR/meta.json; else every DIR/**.npy)")
      ->required();
  import->add_flag("--append", a.append,
                   "append the rows to the store's keys instead of setting them");
  import->add_option("--compress", a.compress,
                     "store new keys zstd[:LEVEL[:BLOCK_BYTES]] or none (default: the store's)");
  progress_flag(import);

  import->add_option("--chunk-mib", a.chunk_mib, "rows copied per commit, in MiB (default 64)");

  auto* exp =
      app.add_subcommand("export", "keys to safetensors, .npy files or a tensordict directory");
  store_arg(exp);
  exp->add_option("KEY", a.keys, "keys (default: all)");
  exp->add_option("--safetensors", a.safetensors, "write one safetensors file");
  exp->add_option("--npy", a.npy, "write KEY.npy files under this directory");
  exp->add_option(
      "--tensordict", a.tensordict,
      "write a tensordict memmap directory (tensordict.TensorDict.load_memmap reads it)");
  progress_flag(exp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }
  auto fail = [](int code, const std::exception& e) {
    std::string msg = e.what();
    fmt::print(stderr, "tdstore: {}\n", msg.substr(0, msg.find('\n')));
    return code;
  };
  try {
    if (!a.store.empty() && tdstore::is_dataset(a.store)) {  // a dataset directory
      if (*info) return dataset_info(a);
      if (*ls) return dataset_ls(a);
      if (*verify) return dataset_verify(a);
      if (*du) return dataset_du(a);
    }
    if (*info) return cmd_info(a);
    if (*ls) return cmd_ls(a);
    if (*show) return cmd_show(a);
    if (*stats) return cmd_stats(a);
    if (*verify) return cmd_verify(a);
    if (*du) return cmd_du(a);
    if (*diff) return cmd_diff(a);
    if (*compact) return cmd_compact(a);
    if (*lazy) return cmd_lazy(a);
    if (*cache) return cmd_cache(a);
    if (*key) return cmd_key(a);
    if (*import) return cmd_import(a);
    if (*exp) return cmd_export(a);
  } catch (const tdstore::FormatError& e) {
    return fail(kNotAStore, e);
  } catch (const tdstore::CorruptionError& e) {
    return fail(kCorrupt, e);
  } catch (const tdstore::LockError& e) {
    return fail(kLocked, e);
  } catch (const tdstore::IOError& e) {
    return fail(kIO, e);
  } catch (const std::exception& e) {
    return fail(kOther, e);
  }
  return kUsage;
}
