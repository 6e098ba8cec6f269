#include "pw/rpc/auth.h"

#include <memory>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/server_interceptor.h"

namespace pw::rpc {
namespace {
constexpr absl::string_view kBearer = "Bearer ";
}  // namespace

void AddToken(grpc::ClientContext* ctx, const std::string& token) {
  if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat(kBearer, token));
}

std::string Metadata(const grpc::ServerContextBase* ctx, absl::string_view key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

namespace {
bool CarriesToken(const grpc::ServerContextBase* ctx, const std::string& token) {
  const std::string got = Metadata(ctx, "authorization");
  return absl::StartsWith(got, kBearer) &&
         SecretEquals(absl::string_view(got).substr(kBearer.size()), token);
}
}  // namespace

absl::Status CheckToken(const grpc::ServerContextBase* ctx, const std::string& token) {
  if (token.empty() || CarriesToken(ctx, token)) return absl::OkStatus();
  return absl::UnauthenticatedError(
      "this pathways server requires a token: set PW_TOKEN (or --token) to the cluster's token");
}

absl::Status CheckClusterToken(const grpc::ServerContextBase* ctx, const std::string& token) {
  if (token.empty() || CarriesToken(ctx, token)) return absl::OkStatus();
  return absl::UnauthenticatedError(
      "this call is only for the controller and its workers: it needs the cluster token "
      "(PW_CLUSTER_TOKEN), which clients do not hold");
}

std::string HostOf(absl::string_view address) {
  absl::string_view host = address;
  if (absl::StartsWith(host, "[")) {  // [::1]:port
    host = host.substr(1, host.find(']') - 1);
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  return std::string(host);
}

bool IsLoopback(absl::string_view address) {
  const std::string host = HostOf(address);
  if (host == "localhost" || host == "::1") return true;
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  int first = 0;
  return parts.size() == 4 && absl::SimpleAtoi(parts[0], &first) && first == 127;
}

absl::Status CheckListenAddress(absl::string_view address, const std::string& token, bool tls,
                                bool insecure) {
  if (IsLoopback(address) || IsInProcess(address)) return absl::OkStatus();
  if (token.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "listening on ", address, " (not loopback) requires a token: pass --token or set PW_TOKEN"));
  if (!tls && !insecure)
    return absl::FailedPreconditionError(absl::StrCat(
        "listening on ", address, " (not loopback) without TLS: pass --tls-cert, --tls-key and "
        "--tls-ca, or --insecure to serve in plaintext on a network you trust"));
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const ChannelOptions& o,
                                           uint64_t* in_process_generation) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(o.max_message_bytes, INT32_MAX)));
  args.SetMaxSendMessageSize(static_cast<int>(std::min<int64_t>(o.max_message_bytes, INT32_MAX)));
  // Reconnect quickly to a restarted peer.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (IsInProcess(address)) {
    auto [channel, generation] = InProcessChannel(address, args);
    if (in_process_generation != nullptr) *in_process_generation = generation;
    return channel;
  }
  if (o.tls == nullptr)
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  if (!o.tls->server_name.empty()) args.SetSslTargetNameOverride(o.tls->server_name);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = o.tls->ca_pem;
  ssl.pem_private_key = o.tls->key_pem;
  ssl.pem_cert_chain = o.tls->cert_pem;
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

bool WaitForConnected(grpc::Channel& channel, const std::string& address,
                      uint64_t in_process_generation, absl::Time deadline) {
  if (IsInProcess(address)) return InProcessServes(address, in_process_generation);
  return channel.WaitForConnected(absl::ToChronoTime(deadline));
}

namespace {

// gRPC answers a request body that does not parse as the method's message with UNIMPLEMENTED and
// no message, before any handler runs (our handlers never answer UNIMPLEMENTED): this says what
// happened, and where.
class MalformedBodyInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit MalformedBodyInterceptor(std::string method) : method_(std::move(method)) {}
  // Whether "/package.Service/Method" is a method of the protocol (its generated descriptor).
  static bool Known(absl::string_view path) {
    if (path.size() < 2 || path[0] != '/') return false;
    std::string name(path.substr(1));
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos) return false;
    name[slash] = '.';
    return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name) != nullptr;
  }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status s = methods->GetSendStatus();
      if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED && s.error_message().empty())
        methods->ModifySendStatus(Known(method_)
            ? grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           absl::StrCat("malformed request to ", method_,
                                        ": its body is not a message of the method's type "
                                        "(pathways.proto; a client of another protocol version?)"))
            : grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                           absl::StrCat("no method ", method_, " here (pathways.proto)")));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class MalformedBodyInterceptors final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MalformedBodyInterceptor(info->method() == nullptr ? "" : info->method());
  }
};

}  // namespace

absl::StatusOr<Serving> StartServer(const std::string& listen, const ChannelOptions& o,
                                    grpc::Service* service, bool require_peer_certificate) {
  const int limit = static_cast<int>(std::min<int64_t>(o.max_message_bytes, INT32_MAX));
  grpc::ServerBuilder builder;
  Serving s;
  const bool in_process = IsInProcess(listen);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (o.tls != nullptr && !in_process) {
    grpc::SslServerCredentialsOptions ssl(
        require_peer_certificate ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = o.tls->ca_pem;
    ssl.pem_key_cert_pairs.push_back({o.tls->key_pem, o.tls->cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  if (!in_process) builder.AddListeningPort(listen, credentials, &s.port);
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
  builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedBodyInterceptors>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  s.server = builder.BuildAndStart();
  if (s.server == nullptr || (s.port == 0 && !in_process))
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  if (in_process) {
    absl::StatusOr<std::unique_ptr<InProcessName>> name =
        InProcessName::Register(listen, s.server.get());
    if (!name.ok()) {
      s.server->Shutdown();
      return name.status();
    }
    s.name = *std::move(name);
  }
  return s;
}

void Serving::Shutdown(absl::Duration grace) {
  name.reset();
  if (server != nullptr) server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

}  // namespace pw::rpc
