// TLS for the gRPC transport and the bulk stream (OpenSSL, which gRPC's Debian build uses too).
//
// One certificate setup per cluster process: its certificate chain and key, and the CA that signs
// its peers' certificates (`--tls-cert`, `--tls-key`, `--tls-ca`). Between the controller and the
// workers, and between workers (gRPC and bulk stream), TLS is mutual: each side presents its
// certificate and verifies the other's against the CA (and a client checks that the server's
// certificate names the address it dialled). Clients of the controller verify it against the CA
// ($PW_TLS_CA) and present a certificate only if they have one ($PW_TLS_CERT, $PW_TLS_KEY): the
// controller verifies a certificate a client sends, but tokens, not certificates, say who a
// client is.
//
// Thread-safe: Tls is immutable; TlsContext may be shared by threads (OpenSSL's SSL_CTX is, once
// configured); each Conn it makes is used by one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pw/dataplane/bulk_wire.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX.

namespace pw::dataplane {

// PEM contents. A server needs all three; a client at least `ca_pem`.
struct Tls {
  std::string cert_pem;  // This process's certificate (then any intermediates).
  std::string key_pem;   // Its private key.
  std::string ca_pem;    // The CA(s) that sign the peers' certificates.
  // The name every server's certificate must carry (--tls-server-name): one name for the whole
  // cluster, where addresses are not known ahead (pods). Empty: the host part of the address
  // dialled.
  std::string server_name;
  bool has_certificate() const { return !cert_pem.empty(); }
};

struct TlsFiles {
  std::string cert, key, ca;  // Paths; all empty: no TLS.
  std::string server_name;    // As Tls::server_name.
  bool empty() const { return cert.empty() && key.empty() && ca.empty(); }
};

// Reads the files (null when `files` is empty). `server`: all three are required; otherwise the
// CA is, and the certificate and key come together or not at all. Errors name the flag and file.
absl::StatusOr<std::shared_ptr<const Tls>> LoadTls(const TlsFiles& files, bool server);
// A client's TLS from $PW_TLS_CA, $PW_TLS_CERT, $PW_TLS_KEY and $PW_TLS_SERVER_NAME (null when
// none of the files is set).
absl::StatusOr<std::shared_ptr<const Tls>> TlsFromEnvironment();

// An OpenSSL context for the bulk stream's sockets.
class TlsContext {
 public:
  // `server`: presents its certificate and requires a certificate the CA signed from every peer.
  // Otherwise: presents its certificate (if any) and verifies the server's.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Create(const Tls& tls, bool server);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // TLS over the connected blocking socket `fd` (not owned), the handshake bounded by the
  // socket's timeouts. Connect also checks that the server's certificate names `host` (a DNS
  // name or an IP address), or the TLS server name if one is set.
  absl::StatusOr<std::unique_ptr<bulk::Conn>> Accept(int fd) const;
  absl::StatusOr<std::unique_ptr<bulk::Conn>> Connect(int fd, const std::string& host) const;

 private:
  TlsContext(ssl_ctx_st* ctx, std::string server_name)
      : ctx_(ctx), server_name_(std::move(server_name)) {}
  ssl_ctx_st* const ctx_;
  const std::string server_name_;
};

}  // namespace pw::dataplane
