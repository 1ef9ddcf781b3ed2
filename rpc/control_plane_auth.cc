#include "rpc/control_plane_auth.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace pdserve::rpc {
namespace {

// Adds the token to the initial metadata of every call on its channel.
class ClusterTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ClusterTokenInterceptor(const std::string* token) : token_(token) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kClusterTokenMetadataKey,
                                                 *token_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const
      token_;  // The factory's; it outlives the channel's calls.
};

class ClusterTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit ClusterTokenInterceptorFactory(std::string token)
      : token_(std::move(token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new ClusterTokenInterceptor(&token_);
  }

 private:
  const std::string token_;
};

}  // namespace

grpc::Status RefuseUnlessClusterCaller(const grpc::ServerContextBase& context,
                                       const ClusterCredential& credential) {
  if (!credential.enabled()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto [begin, end] = metadata.equal_range(kClusterTokenMetadataKey);
  if (begin == end) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("control-plane call without the cluster credential: "
                     "metadata '",
                     kClusterTokenMetadataKey, "' is missing"));
  }
  // One entry only: a second could otherwise smuggle a guess past a proxy
  // that checks the first.
  if (std::next(begin) != end) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("metadata '", kClusterTokenMetadataKey,
                                     "' appears more than once"));
  }
  const absl::string_view presented(begin->second.data(), begin->second.size());
  if (!credential.Accepts(presented)) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("metadata '", kClusterTokenMetadataKey,
                     "' does not hold an accepted cluster token"));
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* RefusedUnary(grpc::CallbackServerContext* context,
                                       const ClusterCredential& credential) {
  grpc::Status status = RefuseUnlessClusterCaller(*context, credential);
  if (status.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

std::shared_ptr<grpc::Channel> NewControlPlaneChannel(
    const std::string& target, const ClusterCredential& credential,
    const grpc::ChannelArguments& args) {
  if (!credential.enabled()) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                     args);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<ClusterTokenInterceptorFactory>(
      credential.presented_token()));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, grpc::InsecureChannelCredentials(), args,
      std::move(interceptors));
}

}  // namespace pdserve::rpc
