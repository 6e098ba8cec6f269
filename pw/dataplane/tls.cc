#include "pw/dataplane/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw::dataplane {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  if (ss.str().find("-----BEGIN ") == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM block"));
  return ss.str();
}

// The queued OpenSSL errors, as text (and clears them).
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::Status Configure(SSL_CTX* ctx, const Tls& tls, bool server) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (tls.has_certificate()) {
    BioPtr bio = MemBio(tls.cert_pem);
    X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (leaf == nullptr || SSL_CTX_use_certificate(ctx, leaf) != 1) {
      X509_free(leaf);
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert: not a usable certificate: ", OpenSslErrors()));
    }
    X509_free(leaf);
    while (X509* more = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))
      SSL_CTX_add_extra_chain_cert(ctx, more);  // Owns `more`.
    ERR_clear_error();  // The end of the chain reads as an error.
    BioPtr key_bio = MemBio(tls.key_pem);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
    if (key == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key: not a usable private key: ", OpenSslErrors()));
    const bool used = SSL_CTX_use_PrivateKey(ctx, key) == 1;
    EVP_PKEY_free(key);
    if (!used || SSL_CTX_check_private_key(ctx) != 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls-key does not match --tls-cert: ", OpenSslErrors()));
  }
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  BioPtr ca_bio = MemBio(tls.ca_pem);
  int cas = 0;
  while (X509* ca = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, ca);
    X509_free(ca);
    ++cas;
  }
  ERR_clear_error();
  if (cas == 0) return absl::InvalidArgumentError("--tls-ca: no CA certificate in it");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                     nullptr);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tls>> LoadTls(const TlsFiles& files, bool server) {
  if (files.empty()) return std::shared_ptr<const Tls>();
  if (files.ca.empty())
    return absl::InvalidArgumentError("TLS needs --tls-ca (the CA that signs the peers' certificates)");
  if (server && (files.cert.empty() || files.key.empty()))
    return absl::InvalidArgumentError("a TLS server needs --tls-cert and --tls-key as well as --tls-ca");
  if (files.cert.empty() != files.key.empty())
    return absl::InvalidArgumentError("--tls-cert and --tls-key come together");
  auto tls = std::make_shared<Tls>();
  tls->server_name = files.server_name;
  PW_ASSIGN_OR_RETURN(tls->ca_pem, ReadPem(files.ca, "--tls-ca"));
  if (!files.cert.empty()) {
    PW_ASSIGN_OR_RETURN(tls->cert_pem, ReadPem(files.cert, "--tls-cert"));
    PW_ASSIGN_OR_RETURN(tls->key_pem, ReadPem(files.key, "--tls-key"));
  }
  // Checked once here, with OpenSSL, so a bad file is an error naming it, not a failed handshake.
  PW_RETURN_IF_ERROR(TlsContext::Create(*tls, server).status());
  return std::shared_ptr<const Tls>(std::move(tls));
}

absl::StatusOr<std::shared_ptr<const Tls>> TlsFromEnvironment() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  TlsFiles files{env("PW_TLS_CERT"), env("PW_TLS_KEY"), env("PW_TLS_CA"),
                 env("PW_TLS_SERVER_NAME")};
  auto tls = LoadTls(files, /*server=*/false);
  if (!tls.ok())
    return Annotate(tls.status(), "from $PW_TLS_CA / $PW_TLS_CERT / $PW_TLS_KEY");
  return tls;
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(const Tls& tls, bool server) {
  // OpenSSL writes to sockets with write(2): a peer that has gone must be an error, not SIGPIPE.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr)
    return absl::InternalError(absl::StrCat("OpenSSL: ", OpenSslErrors()));
  std::shared_ptr<const TlsContext> out(new TlsContext(ctx, tls.server_name));
  if (server && !tls.has_certificate())
    return absl::InvalidArgumentError("a TLS server needs --tls-cert and --tls-key");
  PW_RETURN_IF_ERROR(Configure(ctx, tls, server));
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::unique_ptr<bulk::Conn>> TlsContext::Accept(int fd) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::InternalError(absl::StrCat("OpenSSL: ", OpenSslErrors()));
  }
  auto conn = std::make_unique<bulk::Conn>(fd, ssl);
  if (SSL_accept(ssl) != 1)
    return absl::UnauthenticatedError(
        absl::StrCat("bulk stream: TLS handshake with a peer failed: ", OpenSslErrors()));
  return conn;
}

absl::StatusOr<std::unique_ptr<bulk::Conn>> TlsContext::Connect(int fd,
                                                                 const std::string& dialled) const {
  const std::string& host = server_name_.empty() ? dialled : server_name_;
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::InternalError(absl::StrCat("OpenSSL: ", OpenSslErrors()));
  }
  auto conn = std::make_unique<bulk::Conn>(fd, ssl);
  unsigned char ip[16];
  const bool is_ip = inet_pton(AF_INET, host.c_str(), ip) == 1 ||
                     inet_pton(AF_INET6, host.c_str(), ip) == 1;
  const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str())
                          : SSL_set1_host(ssl, host.c_str());
  if (named != 1) return absl::InvalidArgumentError(absl::StrCat("TLS: bad peer name ", host));
  if (!is_ip) SSL_set_tlsext_host_name(ssl, host.c_str());
  if (SSL_connect(ssl) != 1) {
    const long verify = SSL_get_verify_result(ssl);
    return absl::UnauthenticatedError(absl::StrCat(
        "bulk stream: TLS handshake with ", host, " failed: ",
        verify != X509_V_OK ? X509_verify_cert_error_string(verify) : OpenSslErrors().c_str()));
  }
  return conn;
}

}  // namespace pw::dataplane
