#include "loadgen/target.h"

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/client.grpc.pb.h"
#include "rpc/status_conversion.h"

namespace pdserve::loadgen {

absl::Duration RequestRecord::tpot() const {
  if (output_tokens <= 1 || ttft == absl::InfiniteDuration()) {
    return absl::ZeroDuration();
  }
  return (e2e - ttft) / (output_tokens - 1);
}

namespace {

using json = nlohmann::json;

// Stamps output-carrying chunks as they arrive.
class Stopwatch {
 public:
  Stopwatch(RequestRecord* record, absl::Time run_start)
      : record_(record), start_(absl::Now()) {
    record_->sent_at = start_ - run_start;
  }
  void Output(int32_t tokens) {
    const absl::Time now = absl::Now();
    if (record_->ttft == absl::InfiniteDuration()) {
      record_->ttft = now - start_;
    } else {
      record_->itl_ms.push_back(absl::ToDoubleMilliseconds(now - last_));
    }
    last_ = now;
    record_->output_tokens += tokens;
  }
  void Finish() { record_->e2e = absl::Now() - start_; }

 private:
  RequestRecord* record_;
  absl::Time start_;
  absl::Time last_;
};

RequestRecord NewRecord(const BenchRequest& request) {
  RequestRecord r;
  r.index = request.index;
  r.prompt_tokens = request.prompt.size();
  r.expected_output_tokens = request.output_tokens;
  return r;
}

// A complete answer has every token asked for (ignore_eos): fewer means
// the server cut it short without saying so.
void CheckLength(RequestRecord* r) {
  if (r->ok() && r->output_tokens < r->expected_output_tokens) {
    r->error_kind = "SHORT_OUTPUT";
    r->error = absl::StrCat(r->output_tokens, " of ", r->expected_output_tokens,
                            " tokens");
  }
}

class GrpcTarget : public Target {
 public:
  GrpcTarget(std::string address, double temperature)
      : address_(std::move(address)), temperature_(temperature) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = v1::Generation::NewStub(grpc::CreateCustomChannel(
        address_, grpc::InsecureChannelCredentials(), args));
  }

  RequestRecord Send(const BenchRequest& request, absl::Time run_start,
                     absl::Duration timeout) override {
    v1::GenerateRequest call;
    call.set_request_id(absl::StrCat("bench-", request.index));
    *call.mutable_token_ids()->mutable_ids() = {request.prompt.begin(),
                                                request.prompt.end()};
    v1::SamplingParams* s = call.mutable_sampling();
    s->set_temperature(temperature_);
    s->set_max_tokens(request.output_tokens);
    s->set_ignore_eos(true);
    call.mutable_stream_options()->set_include_timing(true);
    RequestRecord record = NewRecord(request);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    Stopwatch watch(&record, run_start);
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Generate(&context, call);
    v1::GenerateResponse chunk;
    while (reader->Read(&chunk)) {
      if (chunk.token_ids_size() > 0) watch.Output(chunk.token_ids_size());
      if (chunk.has_timing()) {
        record.server_queue_ms = chunk.timing().queue_ms();
        record.server_prefill_ms = chunk.timing().prefill_compute_ms();
        record.server_transfer_tail_ms = chunk.timing().kv_transfer_tail_ms();
      }
    }
    watch.Finish();
    if (const absl::Status status = rpc::FromGrpcStatus(reader->Finish());
        !status.ok()) {
      record.error_kind = absl::StatusCodeToString(status.code());
      record.error = std::string(status.message());
    }
    CheckLength(&record);
    return record;
  }

  std::string Describe() const override {
    return absl::StrCat("grpc://", address_);
  }

 private:
  const std::string address_;
  const double temperature_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

class OpenAiHttpTarget : public Target {
 public:
  OpenAiHttpTarget(std::string host, int port, std::string model,
                   double temperature)
      : host_(std::move(host)),
        port_(port),
        model_(std::move(model)),
        temperature_(temperature) {}

  RequestRecord Send(const BenchRequest& request, absl::Time run_start,
                     absl::Duration timeout) override {
    json body = {{"prompt", request.prompt},
                 {"max_tokens", request.output_tokens},
                 {"temperature", temperature_},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (!model_.empty()) body["model"] = model_;
    RequestRecord record = NewRecord(request);
    httplib::Client client(host_, port_);
    const int64_t us = absl::ToInt64Microseconds(timeout);
    client.set_read_timeout(us / 1000000, us % 1000000);
    client.set_write_timeout(us / 1000000, us % 1000000);
    client.set_connection_timeout(10, 0);
    httplib::Request post;
    post.method = "POST";
    post.path = "/v1/completions";
    post.set_header("Content-Type", "application/json");
    post.body = body.dump();
    std::string pending;
    // The start of the body as received: an error status's body goes to the
    // receiver too, and says what went wrong.
    std::string head;
    int64_t usage_tokens = -1;
    bool done = false;
    Stopwatch watch(&record, run_start);
    const absl::Time give_up = absl::Now() + timeout;
    // One SSE event: its data lines joined by newlines (the SSE rule);
    // comments and other fields ignored.
    auto on_event = [&](absl::string_view event) {
      std::string payload;
      bool has_data = false;
      for (absl::string_view line : absl::StrSplit(event, '\n')) {
        if (!absl::ConsumePrefix(&line, "data:")) continue;
        absl::ConsumePrefix(&line, " ");
        if (has_data) payload.push_back('\n');
        absl::StrAppend(&payload, line);
        has_data = true;
      }
      if (!has_data) return;
      if (absl::StripAsciiWhitespace(payload) == "[DONE]") {
        done = true;
        return;
      }
      OnEvent(json::parse(payload, nullptr, false), &watch, &record,
              &usage_tokens);
    };
    post.content_receiver = [&](const char* data, size_t size, uint64_t,
                                uint64_t) {
      if (head.size() < 200)
        head.append(data, std::min(size, 200 - head.size()));
      // Servers may end lines with CRLF (sse-starlette does); events are
      // split on blank lines either way.
      for (size_t i = 0; i < size; ++i) {
        if (data[i] != '\r') pending.push_back(data[i]);
      }
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        on_event(absl::string_view(pending).substr(0, end));
        pending.erase(0, end + 2);
      }
      return absl::Now() < give_up;
    };
    httplib::Result result = client.send(post);
    // A last event the server did not end with a blank line.
    if (result && result->status == 200 && !pending.empty()) on_event(pending);
    watch.Finish();
    if (record.ok()) {
      if (!result) {
        record.error_kind = absl::Now() >= give_up ? "TIMEOUT" : "CONNECT";
        record.error = httplib::to_string(result.error());
      } else if (result->status != 200) {
        record.error_kind = absl::StrCat("HTTP ", result->status);
        record.error =
            result->body.empty() ? head : result->body.substr(0, 200);
      } else if (!done) {
        record.error_kind = "TRUNCATED";
        record.error = "stream ended without [DONE]";
      }
    }
    // Chunks may carry several tokens; usage, when sent, is exact.
    if (usage_tokens >= 0) record.output_tokens = usage_tokens;
    CheckLength(&record);
    return record;
  }

  std::string Describe() const override {
    return absl::StrCat("http://", host_, ":", port_, "/v1/completions");
  }

 private:
  static void OnEvent(const json& event, Stopwatch* watch,
                      RequestRecord* record, int64_t* usage_tokens) {
    if (!event.is_object()) {
      if (record->ok()) {
        record->error_kind = "BAD_EVENT";
        record->error = "an SSE event that is not JSON";
      }
      return;
    }
    if (auto e = event.find("error"); e != event.end() && record->ok()) {
      record->error_kind = "STREAM_ERROR";
      record->error = e->dump().substr(0, 200);
      return;
    }
    if (auto c = event.find("choices");
        c != event.end() && c->is_array() && !c->empty()) {
      const json& choice = c->front();
      auto text = choice.find("text");
      if (text != choice.end() && text->is_string() &&
          !text->get<std::string>().empty()) {
        watch->Output(1);
      }
    }
    if (auto u = event.find("usage"); u != event.end() && u->is_object()) {
      if (auto n = u->find("completion_tokens");
          n != u->end() && n->is_number_integer()) {
        *usage_tokens = n->get<int64_t>();
      }
    }
  }

  const std::string host_;
  const int port_;
  const std::string model_;
  const double temperature_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Target>> MakeTarget(
    const TargetOptions& options) {
  absl::string_view rest = options.url;
  const bool grpc = absl::ConsumePrefix(&rest, "grpc://");
  if (!grpc && !absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target '", options.url, "' must start with grpc:// or http://"));
  }
  rest = absl::StripSuffix(rest, "/");
  rest = absl::StripSuffix(rest, "/v1");
  const size_t colon = rest.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(rest.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", options.url, "' needs HOST:PORT"));
  }
  if (grpc) {
    return std::make_unique<GrpcTarget>(std::string(rest), options.temperature);
  }
  return std::make_unique<OpenAiHttpTarget>(std::string(rest.substr(0, colon)),
                                            port, options.model,
                                            options.temperature);
}

}  // namespace pdserve::loadgen
