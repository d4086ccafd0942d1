// The main job: cache Fashion-MNIST into two stores (train, test), train an MLP with the Loader
// and a compiled training step, evaluate on the test set. A second run reuses everything: no
// import, no traces (graphs loaded from the stores), normalized images read from the store.
//
//   fashion_mnist [--data DIR] [--store DIR] [--epochs N] [--batch N] [--lr X] [--seed N]
//                 [--limit N] [--compress zstd[:LEVEL]]
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "cli/output.h"
#include "tdstore/tdstore.h"

namespace fs = std::filesystem;
using tdstore::TensorDict;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  fs::path data = "/usr/share/datasets/fashion-mnist";
  fs::path store = fs::path(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/var/tmp") /
                   "tdstore-fashion-mnist";
  int epochs = 10;
  int64_t batch = 128;
  int64_t hidden = 256;  // width of the MLP's hidden layer
  double lr = 1e-3;      // peak learning rate, decayed along a cosine to 0 over the run
  uint64_t seed = 0;
  int64_t limit = 0;  // use only the first N rows of each split (0: all)
  // The stores' keys compressed (tdstore::Compression::parse's text), features included.
  tdstore::Compression compression = tdstore::Compression::none();
  // Threads. Measured on 2 cores with OpenBLAS: libtorch's intra-op pool and OpenBLAS's own
  // pool oversubscribe when both have a thread per core (about 25,000 rows/s); one intra-op
  // thread with OpenBLAS on every core is fastest (about 80,000; the reverse about 50,000).
  // The loader's gathering threads mostly wait. With more cores, give BLAS the cores
  // (--blas-threads) and keep intra-op at 1 for an MLP this small.
  int intra_op_threads = 1;
  int blas_threads = 0;  // 0: one per core
};

// OpenBLAS's thread count, set through its own entry point when libblas.so.3 is OpenBLAS
// (looked up at run time: the reference BLAS has none). Returns the count set, or 0.
int set_blas_threads(int n) {
  using SetFn = void (*)(int);
  using GetFn = int (*)();
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!set || !get) return 0;
  set(n);
  return get();
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string fingerprint(const std::vector<fs::path>& files, int64_t limit) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(h.get());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    XXH3_64bits_update(h.get(), bytes.data(), bytes.size());
  }
  return fmt::format("{:016x}-limit{}", static_cast<uint64_t>(XXH3_64bits_digest(h.get())), limit);
}

tdstore::StoreOptions store_options(const Config& c) {
  tdstore::StoreOptions o;
  o.compression = c.compression;
  return o;
}

// Caches one split into `dir`, appending in chunks committed one by one: a killed import resumes
// from the committed rows. Returns true when the store was already complete.
bool cache_split(const Config& c, const std::string& split, const fs::path& dir) {
  fs::path images = c.data / (split + "-images-idx3-ubyte.gz");
  fs::path labels = c.data / (split + "-labels-idx1-ubyte.gz");
  // A store cached under another compression is made again.
  std::string source = fingerprint({images, labels}, c.limit) +
                       (c.compression.enabled() ? " " + c.compression.text() : "");
  if (fs::exists(dir / "keys.tdd")) {
    auto td = TensorDict::open(dir);
    if (td.attr("source") == source && td.attr("complete") == "1" && td.verify().empty())
      return true;
    if (td.attr("source") != source) fs::remove_all(dir);  // other data: start over
  }
  at::Tensor x = tdstore::read_idx(images), y = tdstore::read_idx(labels);
  if (c.limit > 0) x = x.slice(0, 0, c.limit), y = y.slice(0, 0, c.limit);
  const int64_t n = x.size(0);
  auto td = fs::exists(dir / "keys.tdd") ? TensorDict::open(dir, tdstore::OpenMode::ReadWrite)
                                         : TensorDict::create(dir, {0}, store_options(c));
  td.set_attr("source", source);
  td.reserve(n);
  int64_t done = td.batch_size()[0];
  if (done > 0) fmt::print("{}: resuming an interrupted import at row {}\n", split, done);
  tdstore::cli::Progress bar("import " + split, static_cast<uint64_t>(n));
  for (; done < n; done = std::min(n, done + 5000)) {
    int64_t end = std::min(n, done + 5000);
    TensorDict rows({end - done});
    rows.set("images", x.slice(0, done, end));
    rows.set("labels", y.slice(0, done, end));
    td.append(rows);
    td.commit();
    bar.update(static_cast<uint64_t>(end));
  }
  td.set_attr("complete", "1");
  td.commit();
  return false;
}

// Normalized float images, [rows, 784]: the row-wise feature the loader stores.
tdstore::RowFeature normalized_images() {
  return {"images_f32",
          {"images"},
          [](const TensorDict& rows) {
            return (rows.get("images").to(at::kFloat).flatten(1) / 255 - 0.2860) / 0.3530;
          },
          "v1"};
}

struct Mlp {
  std::vector<at::Tensor> params;  // w1 [784, 256], b1, w2 [256, 10], b2
  std::vector<at::Tensor> m, v;    // Adam moments
  int64_t t = 0;

  Mlp(uint64_t seed, int64_t hidden) {
    at::manual_seed(seed);
    params = {(at::randn({784, hidden}) * std::sqrt(2.0 / 784)).requires_grad_(true),
              at::zeros({hidden}).requires_grad_(true),
              (at::randn({hidden, 10}) * std::sqrt(2.0 / static_cast<double>(hidden)))
                  .requires_grad_(true),
              at::zeros({10}).requires_grad_(true)};
    for (const auto& p : params) m.push_back(at::zeros_like(p)), v.push_back(at::zeros_like(p));
  }
  at::Tensor logits(const at::Tensor& x) const {
    return (x.matmul(params[0]) + params[1]).relu().matmul(params[2]) + params[3];
  }
  void adam_step(double lr) {
    at::NoGradGuard no_grad;
    ++t;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = params[i].grad();
      m[i].mul_(b1).add_(g, 1 - b1);
      v[i].mul_(b2).addcmul_(g, g, 1 - b2);
      at::Tensor mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      params[i].sub_(mh / (vh.sqrt() + eps) * lr);
      g.zero_();
    }
  }
};

std::string stats_line(const tdstore::CompiledFunction& f) {
  auto s = f.stats();
  return fmt::format(
      "{}: {} traced, {} loaded from the store, {} calls served by graphs, {} eager, {} graph {}",
      f.name(), s.compiles, s.loads, s.hits, s.fallbacks, s.entries,
      s.entries == 1 ? "entry" : "entries");
}

// The BLAS libtorch's matrix products run on: the libblas.so.3 this process mapped (Debian
// selects it with update-alternatives). One line; a warning for the reference BLAS, which is
// about ten times slower here.
std::string blas_line() {
  std::ifstream maps("/proc/self/maps");
  std::string line, path;
  while (std::getline(maps, line)) {
    auto p = line.find('/');
    if (p == std::string::npos) continue;
    std::string file = line.substr(p);
    if (file.find("libopenblas") != std::string::npos ||
        file.find("libblas.so") != std::string::npos || file.find("libmkl") != std::string::npos ||
        file.find("libblis") != std::string::npos) {
      path = std::filesystem::canonical(file).string();
      if (file.find("libblas.so") == std::string::npos) break;  // the implementation itself
    }
  }
  if (path.empty()) return "blas: none found mapped (libtorch's own kernels)";
  if (path.find("openblas") != std::string::npos) return "blas: OpenBLAS (" + path + ")";
  if (path.find("/blas/libblas") != std::string::npos)
    return "blas: WARNING: the reference BLAS (" + path +
           "), about 10x slower; apt-get install libopenblas0-pthread (scripts/setup.sh does)";
  return "blas: " + path;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) try {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--data")
        c.data = next();
      else if (a == "--store")
        c.store = next();
      else if (a == "--epochs")
        c.epochs = std::stoi(next());
      else if (a == "--batch")
        c.batch = std::stoll(next());
      else if (a == "--lr")
        c.lr = std::stod(next());
      else if (a == "--hidden")
        c.hidden = std::stoll(next());
      else if (a == "--intra-op-threads")
        c.intra_op_threads = std::stoi(next());
      else if (a == "--blas-threads")
        c.blas_threads = std::stoi(next());
      else if (a == "--seed")
        c.seed = std::stoull(next());
      else if (a == "--limit")
        c.limit = std::stoll(next());
      else if (a == "--compress")
        c.compression = tdstore::Compression::parse(next());
      else {
        fmt::print(
            stderr,
            "usage: fashion_mnist [--data DIR] [--store DIR] [--epochs N] [--batch N] [--hidden N] "
            "[--lr X] [--seed N] [--limit N] [--intra-op-threads N] [--blas-threads N] "
            "[--compress zstd[:LEVEL]]\n");
        return 1;
      }
    } catch (const std::exception& e) {  // a value that does not parse
      fmt::print(stderr, "fashion_mnist: {}: {}\n", argv[i], e.what());
      return 1;
    }
  try {
    at::set_num_threads(std::max(1, c.intra_op_threads));
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int blas = set_blas_threads(c.blas_threads > 0 ? c.blas_threads : cores);
    fmt::print("{}; threads: {} intra-op, {}\n", blas_line(), at::get_num_threads(),
               blas > 0 ? fmt::format("{} BLAS", blas) : std::string("BLAS threads not settable"));
    auto t0 = Clock::now();
    bool cached_train = cache_split(c, "train", c.store / "train");
    bool cached_test = cache_split(c, "t10k", c.store / "test");
    auto open_t = Clock::now();
    auto train = TensorDict::open(c.store / "train", tdstore::OpenMode::ReadWrite);
    auto test = TensorDict::open(c.store / "test", tdstore::OpenMode::ReadWrite);
    fmt::print("dataset: train {} rows, test {} rows ({}; {:.2f} s)\n", train.batch_size()[0],
               test.batch_size()[0],
               cached_train && cached_test ? "reused the cached stores, no import"
                                           : "imported into " + c.store.string(),
               seconds_since(t0));

    Mlp model(c.seed, c.hidden);
    tdstore::CompileOptions opts;
    opts.inputs = model.params;
    opts.store = c.store / "train";  // batches are in memory: graphs go to the train store
    auto step = tdstore::compile(
        "fmnist_train_step",
        [&](TensorDict& batch) {
          at::Tensor logits = model.logits(batch.get("images_f32"));
          return at::nll_loss(at::log_softmax(logits, 1), batch.get("labels").to(at::kLong));
        },
        opts);
    auto predict = tdstore::compile(
        "fmnist_predict",
        [&](TensorDict& batch) { return at::argmax(model.logits(batch.get("images_f32")), 1); },
        opts);

    tdstore::LoaderOptions lo;
    lo.batch_size = c.batch;
    lo.seed = c.seed;
    lo.keys = {"labels"};
    tdstore::Loader train_loader(train, lo);
    bool train_feature_stored = train_loader.add_feature(normalized_images());
    lo.shuffle = false;
    lo.batch_size = 1000;
    tdstore::Loader test_loader(test, lo);
    bool test_feature_stored = test_loader.add_feature(normalized_images());
    int64_t first_batch_rows = 0;
    double first_batch_s = 0;

    double accuracy = 0;
    const double total_steps =
        static_cast<double>(c.epochs) * static_cast<double>(train_loader.size());
    int64_t steps = 0;
    for (int epoch = 0; epoch < c.epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      auto te = Clock::now();
      double loss_sum = 0;
      int64_t rows = 0, batches = 0;
      {
        tdstore::cli::Progress bar(fmt::format("epoch {}", epoch + 1),
                                   static_cast<uint64_t>(train_loader.rows()));
        for (TensorDict batch : train_loader) {
          if (epoch == 0 && batches == 0)
            first_batch_s = seconds_since(open_t), first_batch_rows = batch.batch_size()[0];
          at::Tensor loss = step(batch);
          loss.backward();
          model.adam_step(c.lr * 0.5 *
                          (1 + std::cos(M_PI * static_cast<double>(steps++) / total_steps)));
          loss_sum += loss.item<double>() * static_cast<double>(batch.batch_size()[0]);
          rows += batch.batch_size()[0];
          ++batches;
          bar.update(static_cast<uint64_t>(rows));
        }
      }
      double train_s = seconds_since(te);
      int64_t correct = 0, seen = 0;
      {
        at::NoGradGuard no_grad;
        for (TensorDict batch : test_loader) {
          at::Tensor pred = predict(batch);
          correct += (pred == batch.get("labels").to(at::kLong)).sum().item<int64_t>();
          seen += batch.batch_size()[0];
        }
      }
      accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
      fmt::print("epoch {}: loss {:.4f}, test accuracy {:.4f}, {:.0f} rows/s\n", epoch + 1,
                 loss_sum / static_cast<double>(rows), accuracy,
                 static_cast<double>(rows) / train_s);
    }
    fmt::print("first batch {:.1f} ms after opening the stores ({} rows)\n", first_batch_s * 1e3,
               first_batch_rows);
    fmt::print("compile: {}\n         {}\n", stats_line(step), stats_line(predict));
    fmt::print(
        "features: images_f32 {} (train), {} (test)\n",
        train_feature_stored ? "read from the store, 0 rows computed" : "computed and stored",
        test_feature_stored ? "read from the store, 0 rows computed" : "computed and stored");
    bool reused = cached_train && cached_test && step.stats().compiles == 0 &&
                  predict.stats().compiles == 0 && train_feature_stored && test_feature_stored;
    fmt::print(
        "{}\n",
        reused ? "second run: no import, zero traces (graphs loaded), features read, not recomputed"
               : "first run: run again to reuse the stores, graphs and features");
    fmt::print("final test accuracy {:.4f}\n", accuracy);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fashion_mnist: {}\n", e.what());
    return 2;
  }
}
