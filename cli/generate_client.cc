#include "cli/generate_client.h"

#include <memory>

#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/client.grpc.pb.h"
#include "rpc/status_conversion.h"

namespace pdserve::cli {

absl::Status StreamGenerate(
    const std::string& address, const v1::GenerateRequest& request,
    absl::Duration timeout,
    const std::function<void(const v1::GenerateResponse&)>& on_chunk) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::Generation::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  v1::GenerateResponse chunk;
  while (reader->Read(&chunk)) on_chunk(chunk);
  return rpc::FromGrpcStatus(reader->Finish());
}

}  // namespace pdserve::cli
