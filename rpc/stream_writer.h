// Server-streaming replies for the gRPC callback API, fed from any thread.
//
// A service method returns a reactor that the gRPC library drives; the
// messages, however, come from elsewhere (the engine loop, a request
// driver thread) and must never wait for the network. MakeServerStream
// gives both halves:
//   - the reactor, returned from the service method;
//   - a StreamHandle the producer keeps: Push() queues a message, Finish()
//     ends the call once everything queued is written, Cancelled() tells
//     whether the client went away. Both are non-blocking and safe after the
//     call is over (they do nothing then), so a producer never has to know
//     when gRPC deleted the reactor.
// An optional on_cancel callback runs (on a gRPC thread, once) when the
// client cancels or disconnects before Finish; it must not block.
//
// Ownership: the reactor deletes itself when gRPC is done with it; the
// handle is shared. Thread-safety: every StreamHandle method is thread-safe.
#ifndef PDSERVE_RPC_STREAM_WRITER_H_
#define PDSERVE_RPC_STREAM_WRITER_H_

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace pdserve::rpc {

template <typename Msg>
class ServerStreamReactor;

template <typename Msg>
class StreamHandle {
 public:
  // Queues `msg`; false when the call is already over (cancelled or done).
  bool Push(Msg msg) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finishing_ || cancelled_) return false;
    queue_.push_back(std::move(msg));
    PumpLocked();
    return true;
  }
  // Ends the call with `status` after the queued messages. Idempotent.
  // `trailer` (key, value) is added to the trailing metadata when given
  // (needs the context passed to MakeServerStream).
  void Finish(grpc::Status status,
              std::optional<std::pair<std::string, std::string>> trailer =
                  std::nullopt) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finishing_) return;
    if (trailer.has_value() && context_ != nullptr) {
      context_->AddTrailingMetadata(trailer->first, trailer->second);
    }
    finishing_ = true;
    final_status_ = std::move(status);
    PumpLocked();
  }
  bool Cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // Runs `fn` once when the client cancels (at once if it already has).
  void OnCancel(std::function<void()> fn) {
    bool run_now = false;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        run_now = true;
      } else {
        on_cancel_ = std::move(fn);
      }
    }
    if (run_now) fn();
  }

 private:
  friend class ServerStreamReactor<Msg>;

  // Starts the next write, or the finish, when nothing is in flight.
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor_ == nullptr || writing_ || finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      current_ = std::move(queue_.front());
      queue_.pop_front();
      reactor_->StartWrite(&current_);
    } else if (finishing_) {
      finished_ = true;
      reactor_->Finish(final_status_);
    }
  }
  void WriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    // A cancel that arrived while this write was in flight could not end
    // the call (Cancelled leaves that to us), even if the write itself
    // succeeded.
    if (!ok || cancelled_) {
      // The client is gone; end the call now.
      queue_.clear();
      if (!finished_) {
        finished_ = finishing_ = true;
        reactor_->Finish(
            grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      }
      return;
    }
    PumpLocked();
  }
  void Cancelled(bool) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      fn = std::move(on_cancel_);
      on_cancel_ = nullptr;
      if (!finished_ && !writing_) {
        finished_ = finishing_ = true;
        queue_.clear();
        reactor_->Finish(grpc::Status::CANCELLED);
      }
    }
    if (fn) fn();
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    context_ = nullptr;
    queue_.clear();
  }

  absl::Mutex mu_;
  ServerStreamReactor<Msg>* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Valid while reactor_ is set.
  grpc::CallbackServerContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<Msg> queue_ ABSL_GUARDED_BY(mu_);
  Msg current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

template <typename Msg>
class ServerStreamReactor : public grpc::ServerWriteReactor<Msg> {
 public:
  ServerStreamReactor(std::shared_ptr<StreamHandle<Msg>> handle,
                      grpc::CallbackServerContext* context)
      : handle_(std::move(handle)) {
    absl::MutexLock lock(&handle_->mu_);
    handle_->reactor_ = this;
    handle_->context_ = context;
  }

  void OnWriteDone(bool ok) override { handle_->WriteDone(ok); }
  void OnCancel() override { handle_->Cancelled(true); }
  void OnDone() override {
    handle_->Done();
    delete this;
  }

 private:
  std::shared_ptr<StreamHandle<Msg>> handle_;
};

// The reactor to return from the service method, and the producer's handle.
template <typename Msg>
std::pair<grpc::ServerWriteReactor<Msg>*, std::shared_ptr<StreamHandle<Msg>>>
MakeServerStream(grpc::CallbackServerContext* context = nullptr) {
  auto handle = std::make_shared<StreamHandle<Msg>>();
  auto* reactor = new ServerStreamReactor<Msg>(handle, context);
  return {reactor, handle};
}

}  // namespace pdserve::rpc

#endif  // PDSERVE_RPC_STREAM_WRITER_H_
