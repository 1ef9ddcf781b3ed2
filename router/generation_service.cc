#include "router/generation_service.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "router/request_ids.h"
#include "rpc/status_conversion.h"
#include "rpc/stream_writer.h"
#include "rpc/unary.h"

namespace pdserve::router {

GenerationService::~GenerationService() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto [reactor, stream] = rpc::MakeServerStream<v1::GenerateResponse>(context);
  v1::GenerateRequest owned = *request;
  if (owned.request_id().empty()) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kRequestIdHeader);
    owned.set_request_id(it != metadata.end()
                             ? std::string(it->second.data(), it->second.size())
                             : NewRequestId());
  }
  // Echoed only when fit for a header; otherwise the core refuses it.
  if (CheckRequestId(owned.request_id()).ok()) {
    context->AddInitialMetadata(kRequestIdHeader, owned.request_id());
  }
  const absl::Time deadline =
      context->deadline() == std::chrono::system_clock::time_point::max()
          ? absl::Now() + default_timeout_
          : absl::FromChrono(context->deadline());
  {
    absl::MutexLock lock(&mu_);
    ++running_;
  }
  // A client that cancels while its request waits (for a prefill, say)
  // stops it at once, not at the next chunk.
  auto cancel = std::make_shared<CancelToken>();
  stream->OnCancel([cancel] { cancel->Cancel(); });
  std::thread([this, stream = stream, cancel, request = std::move(owned),
               deadline]() mutable {
    const absl::Status status = api_->Generate(
        std::move(request), deadline,
        [&stream](const v1::GenerateResponse& chunk) {
          return stream->Push(chunk);
        },
        cancel.get());
    metrics_->RecordRequest(Endpoint::kGenerate, status);
    std::optional<std::pair<std::string, std::string>> trailer;
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      trailer.emplace("retry-after-ms",
                      absl::StrCat(absl::ToInt64Milliseconds(retry_after_)));
    }
    stream->Finish(rpc::ToGrpcStatus(status), std::move(trailer));
    absl::MutexLock lock(&mu_);
    --running_;
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(
    grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
    v1::TokenizeResponse* response) {
  return rpc::FinishUnary(context, api_->Tokenize(*request), response);
}

grpc::ServerUnaryReactor* GenerationService::ListModels(
    grpc::CallbackServerContext* context,
    const v1::ListModelsRequest* /*request*/,
    v1::ListModelsResponse* response) {
  return rpc::FinishUnary(context, api_->ListModels(), response);
}

}  // namespace pdserve::router
