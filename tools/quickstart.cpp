// The quick-start job: `quickstart write DIR` creates a store and commits a few tensors;
// `quickstart read DIR` (run as a new process) opens it, checks it and prints it.
#include <ATen/TensorOperators.h>
#include <ATen/core/Formatting.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <filesystem>
#include <iostream>

#include "tdstore/tdstore.h"

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "write" && std::string(argv[1]) != "read")) {
    std::cerr << "usage: quickstart write|read DIR\n";
    return 1;
  }
  std::filesystem::path dir = argv[2];
  try {
    if (std::string(argv[1]) == "write") {
      std::filesystem::remove_all(dir);
      auto td = tdstore::TensorDict::create(dir, {8});
      td.set("obs", at::randn({8, 4}));
      td.set("action", at::arange(8, at::kLong));
      td.set("next/obs", at::randn({8, 4}));
      td.set("next/reward", at::ones({8}) * 0.5);
      td.set("next/done", at::zeros({8}, at::kBool));
      td.set_attr("created_by", "quickstart");
      td.commit();
      std::cout << "wrote " << td.size() << " tensors to " << dir.string() << " (generation "
                << td.generation() << ")\n";
      return 0;
    }
    auto td = tdstore::TensorDict::open(dir);
    std::cout << td << "\n";
    auto bad = td.verify();
    std::cout << "checksums: " << (bad.empty() ? "all intact" : "CORRUPT") << "\n";
    std::cout << "rows 2..4 of next/reward: " << td.slice(2, 4).get("next/reward") << "\n";
    return bad.empty() ? 0 : 3;
  } catch (const tdstore::Error& e) {
    std::cerr << "quickstart: " << e.what() << "\n";
    return 2;
  }
}
