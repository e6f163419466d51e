// Token authentication by HMAC challenge-response; the token never crosses the wire.
//
// The server opens every connection with a random 32-byte nonce. The client answers
// with its own nonce and HMAC-SHA256(token, "ddprun-store-v1 client" | server nonce |
// client nonce | namespace); the server answers with HMAC-SHA256(token,
// "ddprun-store-v1 server" | client nonce | server nonce), so each side proves it
// knows the token to the other, and a recorded exchange is useless on a new connection.
#pragma once

#include <string>

namespace rdzv::auth {

std::string random_bytes(size_t n);  // cryptographically random; throws StoreError

std::string client_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce,
                         const std::string& ns);
std::string server_proof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce);

// Constant-time comparison of two proofs.
bool proofs_equal(const std::string& a, const std::string& b);

}  // namespace rdzv::auth
