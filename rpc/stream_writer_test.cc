#include "rpc/stream_writer.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/server.h"

namespace pdserve::rpc {
namespace {

using Handle = std::shared_ptr<StreamHandle<v1::DecodeChunk>>;

// Every wait in this file is bounded by one of these.
constexpr absl::Duration kWait = absl::Seconds(20);
// Client-side deadline of calls that are expected to end by themselves.
constexpr auto kCallDeadline = std::chrono::seconds(30);

v1::DecodeChunk Chunk(int i, size_t payload_bytes = 0) {
  v1::DecodeChunk chunk;
  chunk.set_request_id("r");
  chunk.add_token_ids(i);
  chunk.set_generated_offset(i);
  chunk.set_text(std::string(payload_bytes, 'a' + i % 26));
  return chunk;
}

// Handles of started StartDecode calls, in arrival order.
class HandleQueue {
 public:
  void Put(Handle handle) {
    absl::MutexLock lock(&mu_);
    handles_.push_back(std::move(handle));
  }
  // The oldest handle not taken yet; nullptr after `timeout`.
  Handle Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(this, &HandleQueue::NonEmpty),
                              timeout)) {
      return nullptr;
    }
    Handle handle = std::move(handles_.front());
    handles_.pop_front();
    return handle;
  }

 private:
  bool NonEmpty() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !handles_.empty();
  }

  absl::Mutex mu_;
  std::deque<Handle> handles_ ABSL_GUARDED_BY(mu_);
};

// StartDecode hands its stream to the test; the other RPCs stay
// unimplemented. A request_id of "inline" pushes two chunks and finishes
// inside the method, before gRPC has the reactor (as DecodeService does when
// StartDecode is refused).
class TestDecodeWorker final : public v1::DecodeWorker::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::DecodeChunk>* StartDecode(
      grpc::CallbackServerContext* context,
      const v1::StartDecodeRequest* request) override {
    auto [reactor, handle] = MakeServerStream<v1::DecodeChunk>(context);
    if (request->request_id() == "inline") {
      handle->Push(Chunk(0));
      handle->Push(Chunk(1));
      handle->Finish(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not verified"),
          std::make_pair("retry-after-ms", "5"));
    }
    handles_.Put(handle);
    return reactor;
  }

  HandleQueue& handles() { return handles_; }

 private:
  HandleQueue handles_;
};

// Counts OnCancel runs and notifies on the first.
struct CancelProbe {
  std::atomic<int> runs{0};
  absl::Notification ran;

  void Watch(const Handle& handle) {
    handle->OnCancel([this] {
      if (runs.fetch_add(1) == 0) ran.Notify();
    });
  }
};

// Pushes chunks until Push fails (or a bound is hit), pausing `pause`
// every `burst` chunks; never calls Finish.
class Producer {
 public:
  Producer(Handle handle, size_t payload_bytes, int burst, absl::Duration pause)
      : handle_(std::move(handle)), thread_([=, this] {
          const absl::Time give_up = absl::Now() + kWait;
          for (int i = 0; i < kMaxChunks && absl::Now() < give_up; ++i) {
            if (!handle_->Push(Chunk(i, payload_bytes))) {
              push_failed_.Notify();
              return;
            }
            pushed_.fetch_add(1);
            if (i % burst == burst - 1) absl::SleepFor(pause);
          }
        }) {}
  ~Producer() { thread_.join(); }

  // True once Push has returned false.
  bool WaitForPushFailure() {
    return push_failed_.WaitForNotificationWithTimeout(kWait);
  }
  int pushed() const { return pushed_.load(); }

 private:
  static constexpr int kMaxChunks = 200000;
  Handle handle_;
  std::atomic<int> pushed_{0};
  absl::Notification push_failed_;
  std::thread thread_;
};

class StreamWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.services = {&service_};
    auto server = GrpcServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (server_ != nullptr) ShutdownServer();
  }

  // A channel with its own connection, so dropping it closes the socket.
  std::shared_ptr<grpc::Channel> NewChannel() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(server_->address(),
                                     grpc::InsecureChannelCredentials(), args);
  }

  // Starts a call on `stub`; `context` must outlive the reader.
  std::unique_ptr<grpc::ClientReader<v1::DecodeChunk>> StartCall(
      v1::DecodeWorker::Stub& stub, grpc::ClientContext& context,
      const std::string& request_id = "r") {
    v1::StartDecodeRequest request;
    request.set_request_id(request_id);
    return stub.StartDecode(&context, request);
  }

  // Shuts the server down; a stream whose reactor never finishes would make
  // this block forever, so it is bounded and a hang aborts the test binary.
  void ShutdownServer() {
    absl::Notification done;
    std::thread shutdown([&] {
      server_->Shutdown(absl::Seconds(1));
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(kWait)) {
      std::cerr << "GrpcServer::Shutdown did not return: a stream reactor "
                   "never finished"
                << std::endl;
      std::abort();
    }
    shutdown.join();
    server_.reset();
  }

  static void SetDeadline(grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  }

  TestDecodeWorker service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(StreamWriterTest, PushedChunksArriveInOrderThenOk) {
  constexpr int kChunks = 1000;
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);

  // Bursts of large chunks (far more than the flow-control window, queued
  // in one go) alternate with single small chunks and short pauses.
  std::thread producer([&] {
    for (int i = 0; i < kChunks; ++i) {
      const bool big = (i / 100) % 2 == 0;
      EXPECT_TRUE(handle->Push(Chunk(i, big ? 16 << 10 : 8))) << i;
      if (!big && i % 10 == 0) absl::SleepFor(absl::Microseconds(200));
    }
    handle->Finish(grpc::Status::OK);
  });

  std::vector<int> received;
  v1::DecodeChunk chunk;
  while (reader->Read(&chunk)) {
    ASSERT_EQ(chunk.token_ids_size(), 1);
    const int i = static_cast<int>(chunk.token_ids(0));
    EXPECT_EQ(chunk.generated_offset(), i);
    EXPECT_EQ(chunk.text().size(), (i / 100) % 2 == 0 ? 16 << 10 : 8) << i;
    received.push_back(i);
  }
  producer.join();
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  ASSERT_EQ(received.size(), kChunks);
  for (int i = 0; i < kChunks; ++i) ASSERT_EQ(received[i], i);
  EXPECT_FALSE(handle->Cancelled());
  EXPECT_FALSE(handle->Push(Chunk(kChunks)));
}

TEST_F(StreamWriterTest, ChunksQueuedBeforeTheClientReadsAllArrive) {
  // The whole stream, Finish included, is queued before the client reads
  // anything.
  constexpr int kChunks = 300;
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  for (int i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(handle->Push(Chunk(i, 32 << 10)));
  }
  handle->Finish(grpc::Status::OK);

  v1::DecodeChunk chunk;
  int next = 0;
  while (reader->Read(&chunk)) {
    ASSERT_EQ(chunk.token_ids_size(), 1);
    ASSERT_EQ(chunk.token_ids(0), next);
    ++next;
  }
  EXPECT_EQ(next, kChunks);
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(StreamWriterTest, ErrorStatusAndTrailerReachTheClient) {
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  ASSERT_TRUE(handle->Push(Chunk(0)));
  ASSERT_TRUE(handle->Push(Chunk(1)));
  handle->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "busy"),
                 std::make_pair("retry-after-ms", "1000"));

  v1::DecodeChunk chunk;
  int received = 0;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.token_ids(0), received);
    ++received;
  }
  EXPECT_EQ(received, 2);
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "busy");
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find("retry-after-ms");
  ASSERT_NE(it, trailers.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "1000");
}

TEST_F(StreamWriterTest, FinishInsideTheServiceMethodIsDelivered) {
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context, "inline");
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  v1::DecodeChunk chunk;
  int received = 0;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.token_ids(0), received);
    ++received;
  }
  EXPECT_EQ(received, 2);
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "not verified");
  auto it = context.GetServerTrailingMetadata().find("retry-after-ms");
  ASSERT_NE(it, context.GetServerTrailingMetadata().end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "5");
  EXPECT_FALSE(handle->Push(Chunk(2)));
}

TEST_F(StreamWriterTest, FinishIsIdempotentAndPushAfterFinishFails) {
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  ASSERT_TRUE(handle->Push(Chunk(0)));
  handle->Finish(grpc::Status::OK);
  // Neither the second status nor its trailer may reach the client.
  handle->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "second"),
                 std::make_pair("second-finish", "1"));
  EXPECT_FALSE(handle->Push(Chunk(1)));

  v1::DecodeChunk chunk;
  int received = 0;
  while (reader->Read(&chunk)) ++received;
  EXPECT_EQ(received, 1);
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(context.GetServerTrailingMetadata().count("second-finish"), 0);

  // After the call is over, both stay harmless.
  handle->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "third"));
  EXPECT_FALSE(handle->Push(Chunk(2)));
  EXPECT_FALSE(handle->Cancelled());
}

TEST_F(StreamWriterTest, CancelWhileIdleRunsOnCancelOnce) {
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  CancelProbe probe;
  probe.Watch(handle);

  // One chunk through, so the call is fully established, then idle.
  ASSERT_TRUE(handle->Push(Chunk(0)));
  v1::DecodeChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_FALSE(handle->Cancelled());

  context.TryCancel();
  ASSERT_TRUE(probe.ran.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(handle->Cancelled());
  EXPECT_FALSE(handle->Push(Chunk(1)));
  handle->Finish(grpc::Status::OK);  // Harmless after a cancel.
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // A callback registered after the cancel runs at once, on this thread.
  bool late_ran = false;
  handle->OnCancel([&late_ran] { late_ran = true; });
  EXPECT_TRUE(late_ran);

  ShutdownServer();
  EXPECT_EQ(probe.runs.load(), 1);
  EXPECT_FALSE(handle->Push(Chunk(2)));
}

TEST_F(StreamWriterTest, CancelWhilePushesAreInFlightRunsOnCancelOnce) {
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  CancelProbe probe;
  probe.Watch(handle);
  {
    Producer producer(handle, 4 << 10, 50, absl::Microseconds(100));
    v1::DecodeChunk chunk;
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(reader->Read(&chunk));
      ASSERT_EQ(chunk.token_ids(0), i);
    }
    context.TryCancel();
    ASSERT_TRUE(probe.ran.WaitForNotificationWithTimeout(kWait));
    EXPECT_TRUE(handle->Cancelled());
    // The producer pushes until a Push fails, and never calls Finish.
    ASSERT_TRUE(producer.WaitForPushFailure());
    EXPECT_GE(producer.pushed(), 20);
  }
  EXPECT_FALSE(handle->Push(Chunk(0)));
  v1::DecodeChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  bool late_ran = false;
  handle->OnCancel([&late_ran] { late_ran = true; });
  EXPECT_TRUE(late_ran);
  // Nobody called Finish: the stream must have ended by itself, or this
  // blocks (and aborts).
  ShutdownServer();
  EXPECT_EQ(probe.runs.load(), 1);
}

TEST_F(StreamWriterTest, CancelRightAfterAPushAlwaysEndsTheCall) {
  // Races the cancel against the completion of a single write, many times.
  // Whatever the order, Push must fail once the cancel is seen and the call
  // must end without a Finish from the producer.
  constexpr int kCalls = 100;
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  std::vector<Handle> handles;
  std::vector<std::unique_ptr<CancelProbe>> probes;
  for (int c = 0; c < kCalls; ++c) {
    grpc::ClientContext context;
    SetDeadline(context);
    auto reader = StartCall(*stub, context);
    Handle handle = service_.handles().Take(kWait);
    ASSERT_NE(handle, nullptr);
    auto probe = std::make_unique<CancelProbe>();
    probe->Watch(handle);
    ASSERT_TRUE(handle->Push(Chunk(0, ((c / 4) % 4) << 12)));
    if (c % 2 == 0) {
      v1::DecodeChunk chunk;
      ASSERT_TRUE(reader->Read(&chunk));
    }
    context.TryCancel();
    ASSERT_TRUE(probe->ran.WaitForNotificationWithTimeout(kWait)) << c;
    EXPECT_TRUE(handle->Cancelled());
    // Half the calls see no Push at all after the cancel: nothing but the
    // cancel itself may be needed to end them.
    if (c % 4 >= 2) {
      EXPECT_FALSE(handle->Push(Chunk(1))) << c;
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    handles.push_back(std::move(handle));
    probes.push_back(std::move(probe));
  }
  ShutdownServer();
  for (int c = 0; c < kCalls; ++c) {
    EXPECT_EQ(probes[c]->runs.load(), 1) << c;
    EXPECT_FALSE(handles[c]->Push(Chunk(2))) << c;
  }
}

TEST_F(StreamWriterTest, DroppedClientMakesPushFail) {
  Handle handle;
  CancelProbe probe;
  std::unique_ptr<Producer> producer;
  {
    auto channel = NewChannel();
    auto stub = v1::DecodeWorker::NewStub(channel);
    auto context = std::make_unique<grpc::ClientContext>();
    SetDeadline(*context);
    auto reader = StartCall(*stub, *context);
    handle = service_.handles().Take(kWait);
    ASSERT_NE(handle, nullptr);
    probe.Watch(handle);
    producer = std::make_unique<Producer>(handle, 4 << 10, 20,
                                          absl::Microseconds(200));
    v1::DecodeChunk chunk;
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(reader->Read(&chunk));
    // Mid-stream, the client goes away without finishing the call.
    reader.reset();
    context.reset();
    stub.reset();
    channel.reset();
  }
  ASSERT_TRUE(producer->WaitForPushFailure());
  producer.reset();
  // A failed write can stop Push a moment before gRPC reports the cancel.
  EXPECT_TRUE(probe.ran.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(handle->Cancelled());
  EXPECT_FALSE(handle->Push(Chunk(0)));
  ShutdownServer();
  EXPECT_EQ(probe.runs.load(), 1);
}

TEST_F(StreamWriterTest, ClientDeadlineMakesPushFail) {
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(500));
  auto reader = StartCall(*stub, context);
  Handle handle = service_.handles().Take(kWait);
  ASSERT_NE(handle, nullptr);
  CancelProbe probe;
  probe.Watch(handle);
  {
    // The client reads a little and then stops; the server keeps pushing.
    Producer producer(handle, 4 << 10, 20, absl::Microseconds(200));
    v1::DecodeChunk chunk;
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(reader->Read(&chunk));
    ASSERT_TRUE(producer.WaitForPushFailure());
  }
  EXPECT_TRUE(probe.ran.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(handle->Cancelled());
  EXPECT_FALSE(handle->Push(Chunk(0)));
  v1::DecodeChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ShutdownServer();
  EXPECT_EQ(probe.runs.load(), 1);
}

TEST_F(StreamWriterTest, ShutdownWithOpenStreamsEndsThem) {
  // The server goes away while a producer is still pushing and another
  // stream sits idle; both end and Push fails afterwards.
  auto stub = v1::DecodeWorker::NewStub(NewChannel());
  grpc::ClientContext busy_context;
  grpc::ClientContext idle_context;
  SetDeadline(busy_context);
  SetDeadline(idle_context);
  auto busy_reader = StartCall(*stub, busy_context);
  Handle busy = service_.handles().Take(kWait);
  ASSERT_NE(busy, nullptr);
  auto idle_reader = StartCall(*stub, idle_context);
  Handle idle = service_.handles().Take(kWait);
  ASSERT_NE(idle, nullptr);
  {
    Producer producer(busy, 1 << 10, 20, absl::Microseconds(200));
    v1::DecodeChunk chunk;
    ASSERT_TRUE(busy_reader->Read(&chunk));
    ShutdownServer();
    ASSERT_TRUE(producer.WaitForPushFailure());
  }
  EXPECT_FALSE(busy->Push(Chunk(0)));
  EXPECT_FALSE(idle->Push(Chunk(0)));
  v1::DecodeChunk chunk;
  while (busy_reader->Read(&chunk)) {
  }
  EXPECT_FALSE(busy_reader->Finish().ok());
  EXPECT_FALSE(idle_reader->Read(&chunk));
  EXPECT_FALSE(idle_reader->Finish().ok());
}

}  // namespace
}  // namespace pdserve::rpc
