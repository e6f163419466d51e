#include "auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "rdzv/store.hpp"
#include "rdzv/token.hpp"

namespace rdzv::auth {
namespace {

// Job credentials are derived under their own label, so no credential is ever a
// handshake proof made with the same key or the reverse.
constexpr const char* kCredentialLabel = "ddprun-job-credential-v1|";

std::string hex(const std::string& raw) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string hmac(const std::string& token, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len) == nullptr) {
    throw StoreError("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<char*>(out), len);
}

}  // namespace

std::string random_bytes(size_t n) {
  // The kernel's CSPRNG directly: no OpenSSL initialisation (config files, several
  // milliseconds and megabytes) on ddprun's start-up path.
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    ssize_t got = getrandom(out.data() + done, n - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw StoreError(std::string("getrandom failed: ") + std::strerror(errno));
    }
    done += static_cast<size_t>(got);
  }
  return out;
}

std::string client_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce,
                         const std::string& ns) {
  return hmac(token, "ddprun-store-v1 client|" + server_nonce + client_nonce + ns);
}

std::string server_proof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce) {
  return hmac(token, "ddprun-store-v1 server|" + client_nonce + server_nonce);
}

bool proofs_equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Authenticator::Authenticator(std::string token, std::string secret) { set_keys(std::move(token), std::move(secret)); }

void Authenticator::set_keys(std::string token, std::string secret) {
  auto fresh = std::make_shared<const Keys>(Keys{std::move(token), std::move(secret)});
  std::lock_guard lock(mutex_);
  keys_ = std::move(fresh);
}

std::shared_ptr<const Authenticator::Keys> Authenticator::keys() const {
  std::lock_guard lock(mutex_);
  return keys_;
}

bool Authenticator::required() const {
  auto k = keys();
  return !k->token.empty() || !k->secret.empty();
}

Admission Authenticator::admit(const std::string& ns, const std::string& server_nonce,
                               const std::string& client_nonce, const std::string& proof) const {
  auto k = keys();
  if (k->token.empty() && k->secret.empty()) return {true, "", ""};
  auto opens = [&](const std::string& key) {
    return proofs_equal(proof, client_proof(key, server_nonce, client_nonce, ns));
  };
  // The shared token first: with no secret this is the only HMAC, as it always was.
  if (!k->token.empty() && opens(k->token)) return {true, server_proof(k->token, client_nonce, server_nonce), ""};
  if (!k->secret.empty()) {
    std::string credential = job_credential(k->secret, ns);
    if (opens(credential)) return {true, server_proof(credential, client_nonce, server_nonce), ""};
  }
  if (k->secret.empty()) return {false, "", "authentication failed: wrong or missing token"};
  return {false, "", "authentication failed: neither the shared token nor this job's credential "
                     "(a job credential opens only the job it was made for)"};
}

}  // namespace rdzv::auth

namespace rdzv {

std::string job_credential(const std::string& secret, const std::string& job) {
  return auth::hex(auth::hmac(secret, auth::kCredentialLabel + job));
}

std::optional<std::string> job_id_error(const std::string& flag, const std::string& id) {
  const bool valid = !id.empty() && id.size() <= kMaxJobId && id != "." && id != ".." &&
                     id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                         std::string::npos;
  if (valid) return std::nullopt;
  std::string shown;  // the id on one line: bytes outside printable ASCII as \xHH
  for (unsigned char c : id.substr(0, kMaxJobId)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      shown += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += hex;
    }
  }
  if (id.size() > kMaxJobId) shown += "...";
  return "invalid " + flag + " '" + shown + "': expected 1 to " + std::to_string(kMaxJobId) +
         " letters, digits, '.', '_' or '-' (not '.' or '..')";
}

std::string generate_token() { return auth::hex(auth::random_bytes(32)); }

std::string read_token_file(const std::string& path, const std::string& kind) {
  std::ifstream in(path);
  if (!in) throw StoreError("cannot read " + kind + " file '" + path + "'");
  std::string line;
  std::getline(in, line);
  auto begin = line.find_first_not_of(" \t\r");
  auto end = line.find_last_not_of(" \t\r");
  if (begin == std::string::npos) throw StoreError(kind + " file '" + path + "' is empty");
  return line.substr(begin, end - begin + 1);
}

std::string configured_token(const std::string& token_file) {
  if (!token_file.empty()) return read_token_file(token_file);
  const char* t = std::getenv(kTokenVariable);
  return t != nullptr ? std::string(t) : std::string();
}

}  // namespace rdzv
