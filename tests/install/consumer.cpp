// A program built only with `pkg-config --cflags --libs tdstore`: proves the installed
// headers, library and pkg-config file are enough.
#include <ATen/ops/arange.h>
#include <tdstore/tdstore.h>

#include <cstdio>
#include <filesystem>

int main(int, char** argv) {
  std::filesystem::remove_all(argv[1]);
  {
    auto td = tdstore::TensorDict::create(argv[1], {3});
    td.set("x", at::arange(3, at::kFloat));
    td.commit();
  }
  auto td = tdstore::TensorDict::open(argv[1]);
  float sum = td.get("x").sum().item<float>();
  std::printf("consumer: %s, sum %.1f\n", td.to_string().c_str(), sum);
  return sum == 3.0f ? 0 : 1;
}
