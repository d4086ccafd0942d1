// A torch-free program built only with `pkg-config --cflags --libs tdstore-storage`: the admin
// API and the file formats of the installed libtdstore_storage, on the store consumer.cpp made.
#include <tdstore/admin.h>
#include <tdstore/errors.h>
#include <tdstore/formats.h>

#include <cstdio>
#include <cstring>

int main(int, char** argv) {
  auto reader = tdstore::StoreReader::open(argv[1]);
  auto entries = reader.entries();
  if (entries.size() != 1 || entries[0].key != "x" || entries[0].dtype != tdstore::DType::Float32)
    return 1;
  tdstore::Array x = reader.read("x");
  float v[3];
  std::memcpy(v, x.data, sizeof v);
  try {
    tdstore::StoreReader::open(argv[2]);
    return 2;
  } catch (const tdstore::Error& e) {  // an error thrown in the library, caught by its base here
    std::printf("consumer_storage: %s, x = [%.0f, %.0f, %.0f], missing store: %s\n",
                tdstore::dtype_name(x.dtype).data(), v[0], v[1], v[2], e.what());
  }
  return reader.verify().ok() && v[2] == 2.0f ? 0 : 3;
}
