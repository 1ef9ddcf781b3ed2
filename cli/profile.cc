#include "cli/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "nlohmann/json.hpp"
#include "proto/client.grpc.pb.h"
#include "rpc/status_conversion.h"

namespace pdserve::cli {

// ---- Pure parts ------------------------------------------------------------

TokenRange PromptTokenRange(uint32_t vocab_size) {
  if (vocab_size >= 1024) return {256, vocab_size};
  return {vocab_size / 2, vocab_size};
}

std::vector<uint32_t> MakePromptTokens(uint64_t serial, int length,
                                       TokenRange range, std::mt19937_64& rng) {
  const uint64_t base = std::max<uint32_t>(range.end - range.first, 1);
  std::vector<uint32_t> ids;
  ids.reserve(std::max(length, 0));
  for (int i = 0; i < length && i < kSerialDigits; ++i) {
    ids.push_back(range.first + static_cast<uint32_t>(serial % base));
    serial /= base;
  }
  std::uniform_int_distribution<uint32_t> any(range.first, range.end - 1);
  while (static_cast<int>(ids.size()) < length) ids.push_back(any(rng));
  return ids;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

absl::StatusOr<double> BurstTokensPerSecond(int prompt_tokens, int burst,
                                            double lone_ttft_s,
                                            double burst_last_ttft_s) {
  const double busy_s = burst_last_ttft_s - lone_ttft_s;
  if (burst < 2 || busy_s <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a burst of %d prompts of %d tokens finished %.4f s after it was "
        "sent, no later than a lone prompt (%.4f s): nothing to measure the "
        "busy worker by (raise --burst)",
        burst, prompt_tokens, burst_last_ttft_s, lone_ttft_s));
  }
  return (burst - 1) * static_cast<double>(prompt_tokens) / busy_s;
}

absl::StatusOr<SteadyItl> SteadyStateItl(
    const std::vector<TokenArrivals>& streams) {
  if (streams.empty()) return absl::InvalidArgumentError("no streams");
  SteadyItl result;
  result.window_start_s = -INFINITY;
  result.window_end_s = INFINITY;
  for (size_t s = 0; s < streams.size(); ++s) {
    if (streams[s].times_s.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream ", s, " received no tokens"));
    }
    result.window_start_s =
        std::max(result.window_start_s, streams[s].times_s.front());
    result.window_end_s =
        std::min(result.window_end_s, streams[s].times_s.back());
  }
  std::vector<double> gaps;
  for (const TokenArrivals& stream : streams) {
    for (size_t i = 1; i < stream.times_s.size(); ++i) {
      const double from = stream.times_s[i - 1], to = stream.times_s[i];
      if (from < result.window_start_s || to > result.window_end_s) continue;
      const int n = std::max(stream.tokens[i], 1);
      for (int k = 0; k < n; ++k) gaps.push_back((to - from) / n);
    }
  }
  const int needed = std::max(
      kMinWindowGaps, kMinWindowSteps * static_cast<int>(streams.size()));
  if (static_cast<int>(gaps.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "only %d inter-token gaps while all %d streams ran (a %.3f s "
        "window), %d needed: the streams' start-up took most of their "
        "tokens (raise --decode_tokens)",
        gaps.size(), streams.size(),
        std::max(result.window_end_s - result.window_start_s, 0.0), needed));
  }
  result.gaps = static_cast<int>(gaps.size());
  result.itl_s = Median(std::move(gaps));
  return result;
}

std::vector<std::string> EnforceNonDecreasingInBatch(
    const std::vector<int>& batch_sizes, const std::vector<int>& contexts,
    std::vector<std::vector<double>>* itl_s) {
  std::vector<std::string> raised;
  for (size_t j = 0; j < contexts.size(); ++j) {
    for (size_t i = 1; i < batch_sizes.size(); ++i) {
      double& here = (*itl_s)[i][j];
      const double below = (*itl_s)[i - 1][j];
      if (here >= below) continue;
      raised.push_back(absl::StrFormat(
          "batch %d, context %d: %.6f s raised to %.6f s (batch %d's): a "
          "larger batch measured faster than a smaller one",
          batch_sizes[i], contexts[j], here, below, batch_sizes[i - 1]));
      here = below;
    }
  }
  return raised;
}

std::string CpuDescription(const std::string& cpuinfo) {
  std::string model = "unknown CPU";
  int threads = 0;
  for (absl::string_view line : absl::StrSplit(cpuinfo, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    if (key == "processor") ++threads;
    if (key == "model name" && model == "unknown CPU") {
      model = std::string(absl::StripAsciiWhitespace(kv.second));
    }
  }
  return threads > 0 ? absl::StrCat(model, " (", threads, " threads)") : model;
}

int LastIntFlag(const std::vector<std::string>& args, const std::string& name,
                int fallback) {
  const std::string prefix = absl::StrCat("--", name, "=");
  int value = fallback;
  for (const std::string& arg : args) {
    absl::string_view rest = arg;
    int parsed = 0;
    if (absl::ConsumePrefix(&rest, prefix) && absl::SimpleAtoi(rest, &parsed)) {
      value = parsed;
    }
  }
  return value;
}

absl::StatusOr<std::vector<int>> ParseGrid(const std::string& flag,
                                           const std::vector<std::string>& v) {
  std::set<int> values;
  for (const std::string& s : v) {
    int x = 0;
    if (!absl::SimpleAtoi(s, &x) || x <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", s, "' is not a whole number > 0"));
    }
    values.insert(x);
  }
  if (values.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " is empty: it needs at least one value"));
  }
  return std::vector<int>(values.begin(), values.end());
}

namespace {

std::string Number(double x) { return absl::StrFormat("%.6g", x); }

std::string Quote(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

std::string ProfileJson(const ProfileResult& r) {
  std::string out = "{\n  \"version\": 1,\n";
  absl::StrAppend(&out, "  \"model\": ", Quote(r.model), ",\n");
  absl::StrAppend(&out, "  \"hardware\": ", Quote(r.hardware), ",\n");
  absl::StrAppend(&out, "  \"source\": ", Quote(r.source), ",\n");
  absl::StrAppend(&out, "  \"cost_unit\": ", Quote(r.cost_unit), ",\n");
  absl::StrAppend(&out, "  \"prefill\": {\n    \"cost\": 1,\n",
                  "    \"load_time_s\": ", Number(r.prefill_load_time_s),
                  ",\n    \"points\": [\n");
  for (size_t i = 0; i < r.prefill.size(); ++i) {
    const planner::PrefillPoint& p = r.prefill[i];
    absl::StrAppend(&out, "      {\"prompt_tokens\": ", Number(p.prompt_tokens),
                    ", \"tokens_per_s\": ", Number(p.tokens_per_s),
                    ", \"ttft_s\": ", Number(p.ttft_s), "}",
                    i + 1 < r.prefill.size() ? "," : "", "\n");
  }
  absl::StrAppend(
      &out, "    ]\n  },\n  \"decode\": {\n    \"cost\": 1,\n",
      "    \"load_time_s\": ", Number(r.decode_load_time_s), ",\n",
      "    \"max_batch\": ", r.max_batch, ",\n",
      "    \"kv_capacity_tokens\": ", Number(r.kv_capacity_tokens),
      ",\n    \"batch_sizes\": [", absl::StrJoin(r.batch_sizes, ", "), "],\n",
      "    \"context_tokens\": [", absl::StrJoin(r.context_lengths, ", "),
      "],\n", "    \"itl_s\": [\n");
  for (size_t i = 0; i < r.itl_s.size(); ++i) {
    std::vector<std::string> row;
    for (double x : r.itl_s[i]) row.push_back(Number(x));
    absl::StrAppend(&out, "      [", absl::StrJoin(row, ", "), "]",
                    i + 1 < r.itl_s.size() ? "," : "", "\n");
  }
  absl::StrAppend(&out, "    ],\n    \"measurement\": [\n");
  for (size_t i = 0; i < r.cells.size(); ++i) {
    const DecodeCell& c = r.cells[i];
    absl::StrAppend(&out, "      {\"batch\": ", c.batch,
                    ", \"context_tokens\": ", c.context,
                    ", \"measured_itl_s\": ", Number(c.itl_s),
                    ", \"window_gaps\": ", c.window_gaps,
                    ", \"window_s\": ", Number(c.window_s), "}",
                    i + 1 < r.cells.size() ? "," : "", "\n");
  }
  absl::StrAppend(&out, "    ]\n  },\n  \"notes\": [");
  for (size_t i = 0; i < r.notes.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "\n    " : ",\n    ", Quote(r.notes[i]));
  }
  absl::StrAppend(&out, r.notes.empty() ? "]\n}\n" : "\n  ]\n}\n");
  return out;
}

absl::StatusOr<std::string> ValidatedProfileJson(const ProfileResult& result) {
  std::string text = ProfileJson(result);
  absl::StatusOr<planner::CapacityProfile> parsed =
      planner::CapacityProfile::Parse(text);
  if (!parsed.ok()) {
    return absl::InternalError(
        absl::StrCat("the measured profile does not parse (a bug): ",
                     parsed.status().message(), "\n", text));
  }
  return text;
}

// ---- Measuring -------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

// One request's outcome at the client, times in seconds since the profile's
// epoch.
struct StreamResult {
  absl::Status status;
  double sent_s = 0;
  TokenArrivals arrivals;
};

class ProfileClient {
 public:
  explicit ProfileClient(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub_ = v1::Generation::NewStub(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args));
  }

  double Now() const {
    return std::chrono::duration<double>(Clock::now() - epoch_).count();
  }

  // `enough`, when set, is asked after each chunk with the tokens so far;
  // true ends the stream there (cancelled by the client, not an error).
  StreamResult Run(
      const v1::GenerateRequest& request, absl::Duration timeout,
      const std::function<bool(const TokenArrivals&)>& enough = nullptr) const {
    StreamResult result;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    result.sent_s = Now();
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Generate(&context, request);
    v1::GenerateResponse chunk;
    bool stopped = false;
    while (reader->Read(&chunk)) {
      if (chunk.token_ids_size() == 0) continue;
      result.arrivals.times_s.push_back(Now());
      result.arrivals.tokens.push_back(chunk.token_ids_size());
      if (enough && enough(result.arrivals)) {
        stopped = true;
        context.TryCancel();
        break;
      }
    }
    result.status = rpc::FromGrpcStatus(reader->Finish());
    if (stopped) result.status = absl::OkStatus();
    if (result.status.ok() && result.arrivals.times_s.empty()) {
      result.status = absl::InternalError("the stream carried no token");
    }
    return result;
  }

  // Sends every request at once (threads released together) and waits for
  // all; the results in request order.
  // With `window_tokens` > 0, each stream ends (cancelled) once it has
  // received that many tokens after every stream had its first: the window
  // where all run then holds about window_tokens steps, however long the
  // streams took to start.
  std::vector<StreamResult> RunTogether(
      const std::vector<v1::GenerateRequest>& requests, absl::Duration timeout,
      int window_tokens = 0) const {
    std::vector<StreamResult> results(requests.size());
    absl::Notification go;
    std::atomic<int> started{0};
    const int all = static_cast<int>(requests.size());
    std::vector<std::thread> threads;
    threads.reserve(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([&, i] {
        go.WaitForNotification();
        int in_window = -1;  // tokens since this stream saw all started
        auto enough = [&](const TokenArrivals& a) {
          if (a.times_s.size() == 1) started.fetch_add(1);
          if (in_window < 0) {
            if (started.load() == all) in_window = 0;
            return false;
          }
          in_window += a.tokens.back();
          return in_window >= window_tokens;
        };
        results[i] = window_tokens > 0 ? Run(requests[i], timeout, enough)
                                       : Run(requests[i], timeout);
      });
    }
    go.Notify();
    for (std::thread& t : threads) t.join();
    return results;
  }

 private:
  std::unique_ptr<v1::Generation::Stub> stub_;
  const Clock::time_point epoch_ = Clock::now();
};

v1::GenerateRequest Request(std::vector<uint32_t> tokens, int max_tokens,
                            bool ignore_eos) {
  v1::GenerateRequest request;
  for (uint32_t id : tokens) request.mutable_token_ids()->add_ids(id);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(ignore_eos);
  return request;
}

absl::Status FirstError(const std::vector<StreamResult>& results,
                        const std::string& what) {
  for (const StreamResult& r : results) {
    if (!r.status.ok()) {
      return absl::Status(r.status.code(),
                          absl::StrCat(what, ": ", r.status.message()));
    }
  }
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Today() {
  return absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone());
}

// Keeps the values within `limit`; a line in *notes for what is cut.
std::vector<int> Cap(const std::vector<int>& values, int limit,
                     const std::string& what, const std::string& why,
                     std::vector<std::string>* notes) {
  std::vector<int> kept, cut;
  for (int v : values) (v <= limit ? kept : cut).push_back(v);
  if (!cut.empty()) {
    notes->push_back(absl::StrCat(what, " ", absl::StrJoin(cut, ","),
                                  " left out: above ", limit, " (", why, ")"));
  }
  return kept;
}

class Profiler {
 public:
  Profiler(const ProfileOptions& options, LocalCluster& cluster,
           std::ostream& log)
      : options_(options),
        cluster_(cluster),
        log_(log),
        client_(cluster.router_address()),
        rng_(options.seed) {}

  absl::Status Run(ProfileResult* result);

 private:
  absl::Status CheckInterrupted() const {
    if (options_.interrupted && options_.interrupted()) {
      return absl::CancelledError("interrupted");
    }
    return absl::OkStatus();
  }
  std::vector<uint32_t> Prompt(int length) {
    return MakePromptTokens(next_serial_++, length, range_, rng_);
  }
  absl::Status MeasurePrefill(int length, planner::PrefillPoint* point);
  absl::Status MeasureDecode(int batch, int context, DecodeCell* cell);
  absl::StatusOr<double> LoadTime(const std::string& pool);
  // Waits until the decode worker runs and holds no sequence.
  absl::Status AwaitIdleDecode(const std::string& what);

  const ProfileOptions& options_;
  LocalCluster& cluster_;
  std::ostream& log_;
  ProfileClient client_;
  std::mt19937_64 rng_;
  TokenRange range_;
  uint64_t next_serial_ = 1;
  int block_size_ = 16;
  int64_t num_blocks_ = 0;
  int context_length_ = 0;
};

absl::Status Profiler::MeasurePrefill(int length,
                                      planner::PrefillPoint* point) {
  const std::string what = absl::StrCat("prefill, ", length, " tokens");
  std::vector<double> lone;
  for (int i = 0; i < options_.lone_runs; ++i) {
    PD_RETURN_IF_ERROR(CheckInterrupted());
    const StreamResult r = client_.Run(Request(Prompt(length), 1, false),
                                       options_.request_timeout);
    if (!r.status.ok()) {
      return absl::Status(r.status.code(),
                          absl::StrCat(what, ": ", r.status.message()));
    }
    lone.push_back(r.arrivals.times_s.front() - r.sent_s);
  }
  const double lone_ttft = Median(lone);
  std::vector<v1::GenerateRequest> burst;
  for (int i = 0; i < options_.burst; ++i) {
    burst.push_back(Request(Prompt(length), 1, false));
  }
  PD_RETURN_IF_ERROR(CheckInterrupted());
  const std::vector<StreamResult> results =
      client_.RunTogether(burst, options_.request_timeout);
  PD_RETURN_IF_ERROR(FirstError(results, what));
  double sent = INFINITY, last = 0;
  for (const StreamResult& r : results) {
    sent = std::min(sent, r.sent_s);
    last = std::max(last, r.arrivals.times_s.front());
  }
  absl::StatusOr<double> throughput =
      BurstTokensPerSecond(length, options_.burst, lone_ttft, last - sent);
  if (!throughput.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", throughput.status().message()));
  }
  point->prompt_tokens = length;
  point->ttft_s = lone_ttft;
  point->tokens_per_s = *throughput;
  log_ << absl::StrFormat(
              "  prefill %5d tokens: lone TTFT %.4f s (median of %d), busy "
              "%.1f tokens/s (burst of %d done %.4f s after sending)",
              length, lone_ttft, options_.lone_runs, *throughput,
              options_.burst, last - sent)
       << std::endl;
  return absl::OkStatus();
}

absl::Status Profiler::MeasureDecode(int batch, int context, DecodeCell* cell) {
  const std::string what =
      absl::StrCat("decode cell batch ", batch, ", context ", context);
  // A shared prefix of whole KV blocks, cached by a warm-up request, and a
  // tail of 1..block_size tokens per stream.
  const int prefix_len = (context - 1) / block_size_ * block_size_;
  const std::vector<uint32_t> prefix = Prompt(prefix_len);
  auto prompt = [&] {
    std::vector<uint32_t> tokens = prefix;
    const std::vector<uint32_t> tail = Prompt(context - prefix_len);
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    return tokens;
  };
  PD_RETURN_IF_ERROR(CheckInterrupted());
  if (prefix_len > 0) {
    const StreamResult warm =
        client_.Run(Request(prompt(), 2, true), options_.request_timeout);
    if (!warm.status.ok()) {
      return absl::Status(
          warm.status.code(),
          absl::StrCat(what, " (warm-up): ", warm.status.message()));
    }
  }
  // Each stream may run past --decode_tokens while the others start (it is
  // cancelled once the window holds enough), as far as the model's context
  // and each stream's share of the KV pool allow, at most 4x.
  const int64_t stream_blocks =
      (num_blocks_ - prefix_len / block_size_) / std::max(batch, 1);
  const int max_tokens = static_cast<int>(std::max<int64_t>(
      options_.decode_tokens,
      std::min<int64_t>({int64_t{4} * options_.decode_tokens,
                         int64_t{context_length_} - context - 1,
                         stream_blocks * block_size_ - (context - prefix_len) -
                             block_size_})));
  std::vector<v1::GenerateRequest> streams;
  for (int i = 0; i < batch; ++i) {
    streams.push_back(Request(prompt(), max_tokens, true));
  }
  const std::vector<StreamResult> results = client_.RunTogether(
      streams, options_.request_timeout, options_.decode_tokens);
  PD_RETURN_IF_ERROR(FirstError(results, what));
  // The cancelled streams leave the decode worker before the next cell.
  PD_RETURN_IF_ERROR(AwaitIdleDecode(what));
  std::vector<TokenArrivals> arrivals;
  for (const StreamResult& r : results) arrivals.push_back(r.arrivals);
  absl::StatusOr<SteadyItl> itl = SteadyStateItl(arrivals);
  if (!itl.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", itl.status().message()));
  }
  cell->batch = batch;
  cell->context = context;
  cell->itl_s = itl->itl_s;
  cell->window_gaps = itl->gaps;
  cell->window_s = itl->window_end_s - itl->window_start_s;
  log_ << absl::StrFormat(
              "  decode batch %3d, context %5d: ITL %.5f s (%.1f tokens/s; "
              "median of %d gaps over %.3f s with all %d streams running)",
              batch, context, itl->itl_s, batch / itl->itl_s, itl->gaps,
              cell->window_s, batch)
       << std::endl;
  return absl::OkStatus();
}

absl::Status Profiler::AwaitIdleDecode(const std::string& what) {
  // Two heartbeats, so the load read is from after the cancel.
  absl::SleepFor(absl::Seconds(1));
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::StatusOr<v1::ListWorkersResponse> listed =
        ListWorkers(cluster_.control_address(), v1::WORKER_ROLE_DECODE,
                    absl::Seconds(5), cluster_.credential());
    if (!listed.ok()) return listed.status();
    bool idle = true;
    for (const v1::WorkerInfo& w : listed->workers()) {
      idle &= w.load().running_sequences() == 0 &&
              w.load().waiting_sequences() == 0;
    }
    if (idle) return absl::OkStatus();
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          what,
          ": the decode worker still runs sequences 30 s after the "
          "cell's streams were cancelled"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<double> Profiler::LoadTime(const std::string& pool) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> name =
      cluster_.AddWorker(pool, options_.cluster.startup_timeout);
  if (!name.ok()) {
    return absl::Status(name.status().code(),
                        absl::StrCat("timing a ", pool, " worker's start: ",
                                     name.status().message()));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  log_ << absl::StrFormat("  %s load time: %.2f s (%s, launch to SERVING)",
                          pool, seconds, *name)
       << std::endl;
  return seconds;
}

absl::Status Profiler::Run(ProfileResult* r) {
  // The decode worker's model and KV pool, as it registered them.
  absl::StatusOr<v1::ListWorkersResponse> decoders =
      ListWorkers(cluster_.control_address(), v1::WORKER_ROLE_DECODE,
                  absl::Seconds(5), cluster_.credential());
  if (!decoders.ok()) return decoders.status();
  if (decoders->workers().empty()) {
    return absl::UnavailableError("the router lists no decode worker");
  }
  const v1::ModelInfo& model = decoders->workers(0).model();
  range_ = PromptTokenRange(model.vocab_size());
  block_size_ = std::max<int>(model.kv_layout().block_size_tokens(), 1);
  const int context_length = static_cast<int>(model.context_length());
  context_length_ = context_length;
  num_blocks_ = model.kv_layout().num_blocks();
  r->kv_capacity_tokens =
      static_cast<double>(model.kv_layout().num_blocks()) * block_size_;
  std::vector<std::string> decode_args = options_.cluster.worker_args;
  if (auto it = options_.cluster.pool_args.find("decode");
      it != options_.cluster.pool_args.end()) {
    decode_args.insert(decode_args.end(), it->second.begin(), it->second.end());
  }
  r->max_batch = LastIntFlag(decode_args, "max_running", 64);
  r->model = absl::StrCat(model.id(), " ", model.quantization(), " (",
                          model.architecture(), ")");

  // The grid, within what the model and the decode worker allow.
  const std::vector<int> prompt_lengths =
      Cap(options_.prompt_lengths, context_length - 1, "prompt lengths",
          absl::StrCat("the model's context is ", context_length, " tokens"),
          &r->notes);
  r->batch_sizes = Cap(options_.batch_sizes, r->max_batch, "batch sizes",
                       "the decode worker's --max_running", &r->notes);
  r->context_lengths =
      Cap(options_.context_lengths, context_length - options_.decode_tokens,
          "context lengths",
          absl::StrCat("the model's context is ", context_length,
                       " tokens, of which --decode_tokens are generated"),
          &r->notes);
  for (const std::string& note : r->notes) log_ << "  " << note << std::endl;
  if (prompt_lengths.empty() || r->batch_sizes.empty() ||
      r->context_lengths.empty()) {
    return absl::InvalidArgumentError(
        "nothing left to measure after the caps above");
  }
  if (r->batch_sizes.front() != 1) {
    return absl::InvalidArgumentError(
        "--batch_sizes must include 1 (the profile starts from one stream)");
  }
  // The largest cell's KV: the shared prefix once, each stream's tail and
  // generated tokens.
  const int64_t num_blocks = model.kv_layout().num_blocks();
  const int largest_context = r->context_lengths.back();
  const int prefix_blocks = (largest_context - 1) / block_size_;
  const int stream_blocks = (largest_context - prefix_blocks * block_size_ +
                             options_.decode_tokens + block_size_ - 1) /
                            block_size_;
  const int64_t needed =
      prefix_blocks + int64_t{r->batch_sizes.back()} * stream_blocks;
  if (needed > num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode cell batch ", r->batch_sizes.back(), ", context ",
                     largest_context, " needs ", needed,
                     " KV blocks; the decode worker "
                     "has ",
                     num_blocks,
                     " (raise --kv_cache_mb in --decode_worker_args, "
                     "or measure a smaller grid)"));
  }

  // One request first: connections, the KV transport's endpoints, the
  // caches of the first forward pass.
  {
    const StreamResult warm =
        client_.Run(Request(Prompt(std::min(32, context_length - 2)), 2, true),
                    options_.request_timeout);
    if (!warm.status.ok()) {
      return absl::Status(
          warm.status.code(),
          absl::StrCat("warm-up request: ", warm.status.message()));
    }
  }

  log_ << "prefill (one worker):" << std::endl;
  for (int length : prompt_lengths) {
    planner::PrefillPoint point;
    PD_RETURN_IF_ERROR(MeasurePrefill(length, &point));
    r->prefill.push_back(point);
  }
  log_ << "decode (one worker):" << std::endl;
  r->itl_s.assign(r->batch_sizes.size(),
                  std::vector<double>(r->context_lengths.size(), 0));
  for (size_t i = 0; i < r->batch_sizes.size(); ++i) {
    for (size_t j = 0; j < r->context_lengths.size(); ++j) {
      DecodeCell cell;
      PD_RETURN_IF_ERROR(
          MeasureDecode(r->batch_sizes[i], r->context_lengths[j], &cell));
      r->itl_s[i][j] = cell.itl_s;
      r->cells.push_back(cell);
    }
  }
  for (std::string& raised : EnforceNonDecreasingInBatch(
           r->batch_sizes, r->context_lengths, &r->itl_s)) {
    log_ << "  " << raised << std::endl;
    r->notes.push_back(std::move(raised));
  }
  log_ << "load times:" << std::endl;
  PD_RETURN_IF_ERROR(CheckInterrupted());
  absl::StatusOr<double> prefill_load = LoadTime("prefill");
  if (!prefill_load.ok()) return prefill_load.status();
  absl::StatusOr<double> decode_load = LoadTime("decode");
  if (!decode_load.ok()) return decode_load.status();
  r->prefill_load_time_s = *prefill_load;
  r->decode_load_time_s = *decode_load;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProfileResult> RunProfile(const ProfileOptions& options,
                                         std::ostream& log) {
  const absl::Time start = absl::Now();
  if (options.prompt_lengths.empty() || options.batch_sizes.empty() ||
      options.context_lengths.empty()) {
    return absl::InvalidArgumentError(
        "--prompt_lengths, --batch_sizes and --context_lengths each need at "
        "least one value");
  }
  if (options.lone_runs < 1 || options.burst < 2 || options.decode_tokens < 2) {
    return absl::InvalidArgumentError(
        "--lone_runs must be >= 1, --burst >= 2 and --decode_tokens >= 2");
  }
  if (!options.cluster.model_path.empty() &&
      !std::filesystem::is_regular_file(options.cluster.model_path)) {
    return absl::NotFoundError(
        absl::StrCat("no model file ", options.cluster.model_path));
  }
  LocalClusterOptions cluster_options = options.cluster;
  cluster_options.num_prefill = 1;
  cluster_options.num_decode = 1;
  cluster_options.num_colocated = 0;
  cluster_options.router_listen = "127.0.0.1:0";
  cluster_options.http_listen = "127.0.0.1:0";
  cluster_options.control_listen = "127.0.0.1:0";
  log << "starting router, 1 prefill and 1 decode worker (logs in "
      << cluster_options.work_dir << ")" << std::endl;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(cluster_options);
  if (!cluster.ok()) return cluster.status();

  ProfileResult result;
  result.cost_unit = options.cost_unit;
  result.hardware =
      absl::StrCat(CpuDescription(ReadFile("/proc/cpuinfo")), "; workers: ",
                   options.cluster.worker_args.empty()
                       ? std::string("default flags")
                       : absl::StrJoin(options.cluster.worker_args, " "));
  for (const char* pool : {"prefill", "decode"}) {
    if (auto it = options.cluster.pool_args.find(pool);
        it != options.cluster.pool_args.end() && !it->second.empty()) {
      absl::StrAppend(&result.hardware, "; ", pool,
                      " workers: ", absl::StrJoin(it->second, " "));
    }
  }
  Profiler profiler(options, **cluster, log);
  const absl::Status measured = profiler.Run(&result);
  // Stopped on every path; the destructor kills what does not stop.
  const absl::Status stopped = (*cluster)->Stop(absl::Seconds(30));
  cluster->reset();
  if (!measured.ok()) return measured;
  if (!stopped.ok()) {
    log << "warning: the cluster did not stop cleanly: " << stopped
        << std::endl;
  }
  result.source = absl::StrCat(
      "pdctl profile ", options.date.empty() ? Today() : options.date,
      " prompts ",
      absl::StrJoin(result.prefill, ",",
                    [](std::string* out, const planner::PrefillPoint& p) {
                      absl::StrAppend(out, p.prompt_tokens);
                    }),
      " batches ", absl::StrJoin(result.batch_sizes, ","), " contexts ",
      absl::StrJoin(result.context_lengths, ","), " decode_tokens ",
      options.decode_tokens, " burst ", options.burst, " lone_runs ",
      options.lone_runs);
  result.total_s = absl::ToDoubleSeconds(absl::Now() - start);
  log << absl::StrFormat("profile measured in %.1f s", result.total_s)
      << std::endl;
  return result;
}

}  // namespace pdserve::cli
