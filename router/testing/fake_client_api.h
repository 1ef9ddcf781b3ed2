// FakeClientApi: a scripted ClientApi, the fake of the seam between the
// router's front ends and its core. Front-end tests drive it instead of a
// cluster: Generate sends the script's chunks and returns its status, and
// everything the front end asked is recorded for the test to check.
//
// Thread-safety: thread-safe, like every ClientApi.
#ifndef PDSERVE_ROUTER_TESTING_FAKE_CLIENT_API_H_
#define PDSERVE_ROUTER_TESTING_FAKE_CLIENT_API_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/client.pb.h"
#include "router/client_api.h"

namespace pdserve::router {

// Generate sends `chunks`, then returns `status`. A stalled Generate returns
// CANCELLED once the request's CancelToken fires, as the core does.
class FakeClientApi : public ClientApi {
 public:
  // Bounds every wait of the fake (and of the tests using it), so a bug
  // fails a test instead of hanging.
  static constexpr absl::Duration kWait = absl::Seconds(10);

  struct Script {
    std::vector<v1::GenerateResponse> chunks;
    absl::Status status;
    // After the scripted chunks, keep sending empty-text token chunks every
    // 10 ms until the sink refuses one (or kWait passes).
    bool endless = false;
    // Before sending anything, wait until this many Generate calls are in
    // flight at once (or kWait passes).
    int wait_for_concurrent = 0;
    // Before sending anything, wait this long (a long prefill), or until
    // the CancelToken fires: then Generate returns CANCELLED at once.
    absl::Duration stall = absl::ZeroDuration();
  };

  void SetScript(Script script);
  void SetModels(v1::ListModelsResponse models);
  void SetReady(absl::Status ready);

  absl::Status Generate(v1::GenerateRequest request, absl::Time deadline,
                        const ChunkSink& sink, CancelToken* cancel) override;
  // Answers every request with ids {1, 15043} and a 2048-token context.
  absl::StatusOr<v1::TokenizeResponse> Tokenize(
      const v1::TokenizeRequest& request) override;
  absl::StatusOr<v1::ListModelsResponse> ListModels() override;
  absl::Status CheckReady() override;

  std::vector<v1::GenerateRequest> requests();
  std::vector<absl::Time> deadlines();
  std::vector<v1::TokenizeRequest> tokenize_requests();
  int max_active();
  // Waits until a sink refused a chunk (the client was gone).
  bool WaitForSinkRefusal(absl::Duration timeout);
  // Waits until `n` Generate calls have begun.
  bool WaitForStarted(int n, absl::Duration timeout);
  // Waits until a stalled Generate saw its CancelToken fire.
  bool WaitForCancel(absl::Duration timeout);
  // Waits until `n` Generate calls have returned.
  bool WaitForFinished(int n, absl::Duration timeout);

 private:
  absl::Status Run(const Script& script, const std::string& request_id,
                   const ChunkSink& sink, CancelToken* cancel);

  absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  v1::ListModelsResponse models_ ABSL_GUARDED_BY(mu_);
  absl::Status ready_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::TokenizeRequest> tokenize_requests_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int max_active_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool sink_refused_ ABSL_GUARDED_BY(mu_) = false;
  bool saw_cancel_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pdserve::router

#endif  // PDSERVE_ROUTER_TESTING_FAKE_CLIENT_API_H_
