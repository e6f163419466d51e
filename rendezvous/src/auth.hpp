// Token authentication by HMAC challenge-response; the token never crosses the wire.
//
// The server opens every connection with a random 32-byte nonce. The client answers
// with its own nonce and HMAC-SHA256(token, "ddprun-store-v1 client" | server nonce |
// client nonce | namespace); the server answers with HMAC-SHA256(token,
// "ddprun-store-v1 server" | client nonce | server nonce), so each side proves it
// knows the token to the other, and a recorded exchange is useless on a new connection.
//
// Which key opens which namespace lives here too (Authenticator): the shared token
// opens every namespace; a job credential, derived from the daemon's secret
// (job_credential in rdzv/token.hpp), opens only its own job's namespace.
#pragma once

#include <memory>
#include <mutex>
#include <string>

namespace rdzv::auth {

std::string random_bytes(size_t n);  // cryptographically random; throws StoreError

std::string client_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce,
                         const std::string& ns);
std::string server_proof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce);

// Constant-time comparison of two proofs.
bool proofs_equal(const std::string& a, const std::string& b);

// The outcome of a HELLO: admitted with the proof the server sends back (empty
// without authentication), or refused with the error message for the client.
struct Admission {
  bool admitted = false;
  std::string server_proof;
  std::string error;
};

// The server's side of authentication. An empty token and an empty secret mean no
// authentication. Thread-safe: set_keys() may run on any thread while the server's
// thread calls required() and admit().
class Authenticator {
 public:
  Authenticator(std::string token, std::string secret);

  // Replaces both keys for HELLOs from now on; admitted connections are unaffected.
  void set_keys(std::string token, std::string secret);

  bool required() const;  // what the CHALLENGE announces

  // Checks a HELLO's `proof` for namespace `ns` against the shared token, then
  // against the credential of the job named `ns`.
  Admission admit(const std::string& ns, const std::string& server_nonce, const std::string& client_nonce,
                  const std::string& proof) const;

 private:
  struct Keys {
    std::string token;
    std::string secret;
  };
  std::shared_ptr<const Keys> keys() const;

  mutable std::mutex mutex_;  // guards the pointer only; a Keys is never changed once made
  std::shared_ptr<const Keys> keys_;
};

}  // namespace rdzv::auth
