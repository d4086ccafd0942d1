// Test helper: replaces the raw value of one catalog record, as damage would.
#pragma once

#include <gtest/gtest.h>
#include <lmdb.h>

#include <filesystem>
#include <string>

namespace tdstore::testing {

inline void overwrite_catalog_record(const std::filesystem::path& store, const std::string& key,
                                     const std::string& value) {
  MDB_env* env;
  ASSERT_EQ(mdb_env_create(&env), 0);
  ASSERT_EQ(mdb_env_open(env, (store / "catalog").c_str(), 0, 0644), 0);
  MDB_txn* txn;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi dbi;
  ASSERT_EQ(mdb_dbi_open(txn, nullptr, 0, &dbi), 0);
  MDB_val k{key.size(), const_cast<char*>(key.data())},
      v{value.size(), const_cast<char*>(value.data())};
  ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

}  // namespace tdstore::testing
