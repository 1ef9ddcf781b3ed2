// GenerationCore's single try of a request on the workers its route chose:
// the local-prefill path, the disaggregated path (admit, prefill, decode)
// and reading the decode stream. generation_core.cc decides what to try and
// whether to retry or migrate; this file holds how one try talks to the
// workers, and leaves no blocks behind on any of them when it fails.
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "router/generation_core.h"
#include "router/worker_calls.h"
#include "rpc/status_conversion.h"

namespace pdserve::router {

absl::Status GenerationCore::StreamDecode(const WorkerView& worker,
                                          const v1::StartDecodeRequest& start,
                                          absl::Time deadline,
                                          RequestStream& state) {
  AddOutstanding(worker.worker_id, 0, 1);
  struct Done {
    GenerationCore* core;
    const std::string& worker;
    ~Done() { core->AddOutstanding(worker, 0, -1); }
  } done{this, worker.worker_id};
  grpc::ClientContext context;
  SetDeadline(&context, deadline);
  CancelScope cancellable(state.cancel(), &context);
  WorkerCalls::Call call(&calls_, worker.worker_id, &context);
  std::unique_ptr<grpc::ClientReader<v1::DecodeChunk>> reader =
      DecodeStub(worker.address)->StartDecode(&context, start);
  v1::DecodeChunk chunk;
  while (reader->Read(&chunk)) {
    if (!state.SendDecode(chunk)) {
      // The client is gone: stop the stream (the decode worker cancels the
      // request and frees its blocks when the call is cancelled).
      context.TryCancel();
      break;
    }
  }
  const absl::Status status = call.Check(rpc::FromGrpcStatus(reader->Finish()));
  if (state.client_gone() && !state.finished()) {
    CancelAttempt(DecodeStub(worker.address), start.request_id(),
                  start.attempt());
    return absl::CancelledError("the client went away");
  }
  // The last chunk arrived: the answer is complete, whatever the stream's
  // status says after it (a worker dying right then must not cause a retry).
  if (state.finished()) return absl::OkStatus();
  if (!status.ok()) {
    return WorkerError(absl::StrCat("decode on ", worker.worker_id), status,
                       deadline);
  }
  return absl::UnavailableError(absl::StrCat("decode worker ", worker.worker_id,
                                             " ended the stream early"));
}

absl::Status GenerationCore::RunLocal(const Attempt& a,
                                      const WorkerView& worker) {
  v1::StartDecodeRequest start;
  start.set_request_id(a.state.id());
  start.set_attempt(a.number);
  for (int32_t t : a.tokens) {
    start.mutable_local_prefill()->add_prompt_token_ids(t);
  }
  *start.mutable_sampling() = a.request.sampling();
  // After a migration the worker recomputes prompt + what was sent.
  for (uint32_t t : a.replayed) start.add_generated_token_ids(t);
  start.set_priority(a.request.priority());
  AddOutstanding(worker.worker_id, a.tokens.size(), 0);
  absl::Status status = StreamDecode(worker, start, a.deadline, a.state);
  AddOutstanding(worker.worker_id, -static_cast<int64_t>(a.tokens.size()), 0);
  if (!status.ok()) a.culprits->push_back(worker.worker_id);
  return status;
}

absl::Status GenerationCore::RunDisaggregated(
    const Attempt& a, const WorkerView& prefill,
    const std::vector<const WorkerView*>& decode) {
  // 1. Admission first: blocks on a decode worker with room.
  PD_ASSIGN_OR_RETURN(const Admission admission, Admit(a, prefill, decode));
  // 2. Prefill, with the KV pushed into the admitted blocks.
  PD_ASSIGN_OR_RETURN(const v1::PrefillResponse first,
                      Prefill(a, prefill, admission));
  // 3. The first token goes to the client now; decoding continues it.
  return DecodeAfterPrefill(a, admission, first);
}

v1::AdmitRequest GenerationCore::AdmitRequestFor(
    const Attempt& a, const WorkerView& prefill) const {
  v1::AdmitRequest admit;
  admit.set_request_id(a.state.id());
  admit.set_attempt(a.number);
  for (int32_t t : a.tokens) admit.add_token_ids(t);
  for (uint32_t t : a.replayed) admit.add_token_ids(t);
  admit.set_num_prompt_tokens(a.tokens.size());
  *admit.mutable_writer_layout() = prefill.kv_layout;
  for (v1::TransportKind kind : prefill.transports) {
    admit.add_writer_transports(kind);
  }
  admit.set_prefill_worker_id(prefill.worker_id);
  // The blocks are useless after the request's deadline: a failed or hung
  // prefill must not hold them longer.
  admit.set_reservation_timeout_ms(absl::ToInt64Milliseconds(
      std::max(std::min(a.deadline - absl::Now(), options_.reservation_timeout),
               absl::Milliseconds(1))));
  admit.set_priority(a.request.priority());
  return admit;
}

absl::StatusOr<GenerationCore::Admission> GenerationCore::Admit(
    const Attempt& a, const WorkerView& prefill,
    const std::vector<const WorkerView*>& decode) {
  const v1::AdmitRequest admit = AdmitRequestFor(a, prefill);
  v1::AdmitResponse admitted;
  absl::Status refused;
  for (const WorkerView* candidate : decode) {
    if (a.state.client_gone()) {
      return absl::CancelledError("the client went away");
    }
    grpc::ClientContext context;
    SetDeadline(&context, a.deadline);
    CancelScope cancellable(a.state.cancel(), &context);
    WorkerCalls::Call call(&calls_, candidate->worker_id, &context);
    const absl::Status s = call.Check(rpc::FromGrpcStatus(
        DecodeStub(candidate->address)->Admit(&context, admit, &admitted)));
    if (s.ok()) return Admission{candidate, admitted.target()};
    refused = s;
    if (s.code() == absl::StatusCode::kCancelled ||
        s.code() == absl::StatusCode::kDeadlineExceeded) {
      // The worker may have reserved before the call was cut short: ask it
      // to drop whatever this attempt holds (no prefill was sent for it).
      CancelAttempt(DecodeStub(candidate->address), a.state.id(), a.number,
                    /*writes_quiesced=*/true);
      break;
    }
    if (s.code() == absl::StatusCode::kUnavailable) {
      a.culprits->push_back(candidate->worker_id);
    } else if (s.code() != absl::StatusCode::kResourceExhausted) {
      break;
    }
  }
  if (a.state.client_gone()) {
    return absl::CancelledError("the client went away");
  }
  return WorkerError("admission on a decode worker", refused, a.deadline);
}

void GenerationCore::Release(const Admission& admission,
                             const std::string& request_id,
                             bool writes_quiesced, const std::string& why) {
  v1::ReleaseRequest release;
  release.set_transfer_id(admission.target.transfer_id());
  release.set_request_id(request_id);
  release.set_writes_quiesced(writes_quiesced);
  release.set_reason(why);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Now() + absl::Seconds(2));
  v1::ReleaseResponse ignored;
  DecodeStub(admission.decoder->address)->Release(&context, release, &ignored);
}

absl::StatusOr<v1::PrefillResponse> GenerationCore::Prefill(
    const Attempt& a, const WorkerView& prefill, const Admission& admission) {
  v1::PrefillRequest prefill_request;
  prefill_request.set_request_id(a.state.id());
  prefill_request.set_attempt(a.number);
  for (int32_t t : a.tokens) prefill_request.add_prompt_token_ids(t);
  // After a migration the prefill computes prompt + the tokens already sent
  // and samples the next one.
  for (uint32_t t : a.replayed) prefill_request.add_generated_token_ids(t);
  *prefill_request.mutable_sampling() = a.request.sampling();
  *prefill_request.mutable_target() = admission.target;
  prefill_request.set_priority(a.request.priority());
  v1::PrefillResponse first;
  AddOutstanding(prefill.worker_id, a.tokens.size(), 0);
  a.state.count_prefill_attempt();
  absl::Status prefilled;
  {
    grpc::ClientContext context;
    SetDeadline(&context, a.deadline);
    CancelScope cancellable(a.state.cancel(), &context);
    WorkerCalls::Call call(&calls_, prefill.worker_id, &context);
    prefilled = call.Check(
        rpc::FromGrpcStatus(PrefillStub(prefill.address)
                                ->Prefill(&context, prefill_request, &first)));
  }
  AddOutstanding(prefill.worker_id, -static_cast<int64_t>(a.tokens.size()), 0);
  if (!prefilled.ok()) return PrefillFailed(a, prefill, admission, prefilled);
  a.state.set_prefill(prefill.worker_id, first);
  return first;
}

absl::Status GenerationCore::PrefillFailed(const Attempt& a,
                                           const WorkerView& prefill,
                                           const Admission& admission,
                                           const absl::Status& prefilled) {
  // Whether a write may still land is known only to the prefill worker,
  // which frees the blocks itself once its writes are over (or when it
  // refused the prompt). Told to stop, a worker that has nothing for the
  // attempt will never write for it (it refuses the attempt should its
  // Prefill still arrive), so the blocks can go at once; otherwise (and
  // for a worker that cannot be reached) this release quarantines them.
  bool may_write = true;
  if (prefilled.code() != absl::StatusCode::kUnavailable) {
    may_write =
        CancelAttempt(PrefillStub(prefill.address), a.state.id(), a.number);
  }
  Release(admission, a.state.id(), /*writes_quiesced=*/!may_write,
          absl::StrCat("prefill failed: ",
                       absl::StatusCodeToString(prefilled.code())));
  // An unreachable prefill worker is the one to avoid next time; a
  // transfer that failed may be either end's fault (a corrupting writer,
  // a receiver that lost its region): the retry avoids both if it can.
  a.culprits->push_back(prefill.worker_id);
  if (prefilled.code() != absl::StatusCode::kUnavailable) {
    a.culprits->push_back(admission.decoder->worker_id);
  }
  if (a.state.client_gone()) {
    return absl::CancelledError("the client went away");
  }
  return WorkerError(absl::StrCat("prefill on ", prefill.worker_id), prefilled,
                     a.deadline);
}

absl::Status GenerationCore::DecodeAfterPrefill(
    const Attempt& a, const Admission& admission,
    const v1::PrefillResponse& first) {
  const bool client_there = a.state.SendFirst(first, a.tokens.size());
  if (!client_there || a.state.finished()) {
    Release(admission, a.state.id(), /*writes_quiesced=*/true,
            client_there ? "finished at the first token" : "client went away");
    return client_there ? absl::OkStatus()
                        : absl::CancelledError("the client went away");
  }
  v1::StartDecodeRequest start;
  start.set_request_id(a.state.id());
  start.set_attempt(a.number);
  start.set_transfer_id(admission.target.transfer_id());
  *start.mutable_sampling() = a.request.sampling();
  for (uint32_t t : a.replayed) start.add_generated_token_ids(t);
  start.add_generated_token_ids(first.first_token_id());
  start.set_priority(a.request.priority());
  const absl::Status decoded =
      StreamDecode(*admission.decoder, start, a.deadline, a.state);
  if (!decoded.ok() && !a.state.client_gone()) {
    // A StartDecode refused before it began leaves the admission to free.
    Release(admission, a.state.id(), /*writes_quiesced=*/true, "decode failed");
    a.culprits->push_back(admission.decoder->worker_id);
  }
  return decoded;
}

}  // namespace pdserve::router
