#include "storage/keyring.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "storage/messages.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;
namespace {

constexpr size_t kKeyFileMax = 256;

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) out += {digits[p[i] >> 4], digits[p[i] & 15]};
  return out;
}

std::string octal(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%03o", mode);
  return buf;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

fs::path home() {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_dir) return pw->pw_dir;
  return {};
}

fs::path xdg(const char* var, const char* fallback) {
  if (const char* v = std::getenv(var); v && *v == '/') return fs::path(v) / "tdstore";
  fs::path h = home();
  return h.empty() ? fs::path() : h / fallback / "tdstore";
}

// The key in path, or the reason it is refused.
std::optional<Key> read_key(const fs::path& path, std::string* why) {
  // Symlinks are followed (secrets are often mounted as links); the file itself is checked.
  // O_NONBLOCK: a FIFO in its place never blocks the process (it is no regular file).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *why = path.string() + ": " + std::strerror(errno);
    return std::nullopt;
  }
  struct stat st;
  char buf[kKeyFileMax];
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = ::read(fd, buf, sizeof buf);
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    *why = path.string() + ": not a readable regular file" +
           (err ? std::string(": ") + std::strerror(err) : "");
    return std::nullopt;
  }
  if (st.st_uid != ::geteuid()) {
    *why = path.string() + ": owned by uid " + std::to_string(st.st_uid) +
           ", not by this user (uid " + std::to_string(::geteuid()) + ")";
    return std::nullopt;
  }
  if (st.st_mode & 077) {
    *why = path.string() + ": its group or others may access it (mode " + octal(st.st_mode & 0777) +
           "; chmod 600 it)";
    return std::nullopt;
  }
  std::string_view text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  Key k;
  if (text.size() != 64 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return hex_value(c) >= 0; })) {
    *why = path.string() + ": not a key (64 hexadecimal digits expected)";
    return std::nullopt;
  }
  for (size_t i = 0; i < 32; ++i)
    k.secret[i] = static_cast<uint8_t>(hex_value(text[2 * i]) * 16 + hex_value(text[2 * i + 1]));
  k.id = key_id(k.secret);
  k.path = path;
  return k;
}

// Writes a random key into a new file at path (O_EXCL, 0600), synced.
Key write_new_key(const fs::path& path) {
  Key k;
  for (size_t got = 0; got < k.secret.size();) {
    ssize_t r = ::getrandom(k.secret.data() + got, k.secret.size() - got, 0);
    if (r < 0 && errno != EINTR) throw_os_error(path, "getrandom failed", errno);
    if (r > 0) got += static_cast<size_t>(r);
  }
  k.id = key_id(k.secret);
  k.path = path;
  const std::string text = hex(k.secret.data(), k.secret.size()) + "\n";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      throw IOError(path.string() + ": exists (a key file is never overwritten)");
    throw_os_error(path, "cannot create the key file", errno);
  }
  bool ok = ::fchmod(fd, 0600) == 0 &&
            ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    throw_os_error(path, "cannot write the key file", err);
  }
  return k;
}

// This user's own key at <config>/key, created when missing: written under a temporary name
// and linked into place, so that processes starting at once agree on one key and none reads a
// partly written file.
std::optional<Key> own_key(const fs::path& config, std::vector<std::string>* refused) {
  const fs::path path = config / "key";
  std::string why;
  if (auto k = read_key(path, &why)) return k;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec))) {
    // Another process may have created it since the read above: read it once more.
    if (auto k = read_key(path, &why)) return k;
    refused->push_back(why);
    return std::nullopt;
  }
  try {
    fs::create_directories(config, ec);
    if (ec) throw IOError(config.string() + ": cannot create directory: " + ec.message());
    ::chmod(config.c_str(), 0700);
    // A name no other process uses (processes of other PID namespaces may share the pid).
    std::array<uint8_t, 8> nonce{};
    if (::getrandom(nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size()))
      throw_os_error(config, "getrandom failed", errno);
    fs::path tmp =
        config / ("key.new." + std::to_string(::getpid()) + "." + hex(nonce.data(), nonce.size()));
    write_new_key(tmp);
    const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
    const int err = errno;
    ::unlink(tmp.c_str());
    if (!linked && err != EEXIST) throw_os_error(path, "cannot create the key file", err);
    if (linked) {
      int dfd = ::open(config.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) ::fsync(dfd), ::close(dfd);
    }
    // The key is what the file holds: this process's, or one another process linked first.
    if (auto k = read_key(path, &why)) return k;
    refused->push_back(why);
  } catch (const std::exception& ex) {
    refused->push_back(std::string("no key of this user's own: ") + ex.what());
  }
  return std::nullopt;
}

}  // namespace

std::string key_id(const std::array<uint8_t, 32>& secret) {
  auto mac = hmac_sha256(secret, {"tdstore key id"});
  return hex(mac.data(), 8);
}

std::array<uint8_t, 32> hmac_sha256(const std::array<uint8_t, 32>& secret,
                                    std::initializer_list<std::string_view> parts) {
  // Fetched once: a fetch looks the algorithm up among the providers (microseconds).
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  std::array<uint8_t, 32> out{};
  EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t len = 0;
  bool ok = ctx && EVP_MAC_init(ctx, secret.data(), secret.size(), params);
  for (auto p : parts)
    ok = ok && EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(p.data()), p.size());
  ok = ok && EVP_MAC_final(ctx, out.data(), &len, out.size()) && len == out.size();
  EVP_MAC_CTX_free(ctx);
  if (!ok) throw Error("HMAC-SHA-256 failed (libcrypto)");
  return out;
}

const Key* Keyring::find(std::string_view id) const {
  if (signing && signing->id == id) return &*signing;
  for (const auto& k : trusted)
    if (k.id == id) return &k;
  return nullptr;
}

Keyring Keyring::load() {
  Keyring r;
  r.config_dir = xdg("XDG_CONFIG_HOME", ".config");
  r.cache_dir = xdg("XDG_CACHE_HOME", ".cache");
  if (r.config_dir.empty()) {
    r.refused.push_back("no home directory and no XDG_CONFIG_HOME: no key of this user's own");
  }
  std::optional<Key> own = r.config_dir.empty() ? std::nullopt : own_key(r.config_dir, &r.refused);
  if (const char* f = std::getenv("TDSTORE_KEY_FILE"); f && *f) {
    std::string why;
    if (auto k = read_key(f, &why))
      r.signing = std::move(k);
    else
      r.refused.push_back("TDSTORE_KEY_FILE " + why);
    if (own && (!r.signing || own->id != r.signing->id)) r.trusted.push_back(std::move(*own));
  } else {
    r.signing = std::move(own);
  }
  std::error_code ec;
  if (!r.config_dir.empty() && fs::is_directory(r.config_dir / "trusted", ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(r.config_dir / "trusted", ec))
      files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& p : files) {
      std::string why;
      if (auto k = read_key(p, &why)) {
        if (!r.find(k->id)) r.trusted.push_back(std::move(*k));
      } else {
        r.refused.push_back(why);
      }
    }
  }
  return r;
}

const Keyring& Keyring::process() {
  static const Keyring keyring = load();
  return keyring;
}

Key create_key(const fs::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  return write_new_key(path);
}

}  // namespace tdstore::storage
