#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

constexpr double kOverloaded = 1e9;  // "never": a pool past saturation

// Erlang C: the chance an arrival waits in an M/M/c queue with offered
// load a (< c), through Erlang B's recursion (stable for hundreds of
// servers).
double ErlangC(int c, double a) {
  double b = 1;
  for (int k = 1; k <= c; ++k) b = a * b / (k + a * b);
  return c * b / (c - a * (1 - b));
}

struct PrefillStats {
  double mean_s = 0, scv = 1;  // busy seconds per request, its spread
  double quantile_tokens = 0, quantile_service_s = 0;
};

PrefillStats PrefillService(const CapacityProfile& profile,
                            const LoadEstimate& load, double quantile) {
  PrefillStats s;
  const double keep = std::clamp(1 - load.cached_prompt_fraction, 0.0, 1.0);
  auto busy = [&](double l) {
    return profile.PrefillSeconds(std::max(1.0, l * keep));
  };
  s.mean_s = load.prompt.Expect(busy);
  const double second = load.prompt.Expect([&](double l) {
    const double b = busy(l);
    return b * b;
  });
  s.scv = s.mean_s > 0 ? std::max(0.0, second / (s.mean_s * s.mean_s) - 1) : 1;
  s.quantile_tokens = std::max(1.0, load.prompt.Quantile(quantile) * keep);
  s.quantile_service_s = std::max(profile.LoneTtftSeconds(s.quantile_tokens),
                                  profile.PrefillSeconds(s.quantile_tokens));
  return s;
}

struct DecodeStats {
  double tokens_per_request = 0;  // decode steps each stream takes
  double context = 0;             // mean context of a running stream
  double limit = 0;               // batch the KV cache and max_batch allow
};

DecodeStats DecodeService(const CapacityProfile& profile,
                          const LoadEstimate& load) {
  DecodeStats s;
  // The first token comes from prefill; decode makes the rest.
  s.tokens_per_request =
      load.output.Expect([](double o) { return std::max(0.0, o - 1); });
  const double out = load.output.Mean();
  const double out2 = load.output.Expect([](double o) { return o * o; });
  // A stream's context grows from its prompt to prompt + output while it
  // runs; averaged over the time streams spend running, the mean context
  // is E[P] + E[O²] / (2 E[O]).
  s.context = load.prompt.Mean() + (out > 0 ? out2 / (2 * out) : 0);
  s.limit = std::min<double>(profile.max_batch(), profile.kv_capacity_tokens() /
                                                      std::max(1.0, s.context));
  return s;
}

// The mean batch per worker: b = (rate / n) × tokens × step(b). 0 when
// overloaded (no fixed point within the limit).
double MeanBatch(const CapacityProfile& profile, const DecodeStats& s,
                 double rate, int replicas) {
  const double per_worker = rate / replicas * s.tokens_per_request;
  auto excess = [&](double b) {
    return per_worker * profile.DecodeStepSeconds(b, s.context) - b;
  };
  if (s.limit < 1 || excess(s.limit) > 0) return 0;
  double lo = 0, hi = s.limit;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (excess(mid) > 0 ? lo : hi) = mid;
  }
  return hi;
}

// Smallest n in [1, max] with latency(n) <= target (latency falls with n).
int SmallestMeeting(const std::function<double(int)>& latency, double target,
                    int lo, int max) {
  lo = std::clamp(lo, 1, max);
  if (latency(lo) <= target) return lo;
  if (latency(max) > target) return -1;
  int hi = max;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (latency(mid) <= target ? hi : lo) = mid;
  }
  return hi;
}

bool Empty(const LoadEstimate& load, const LengthHistogram& lengths) {
  return load.request_rate <= 0 || lengths.count() <= 0;
}

}  // namespace

double PredictTtft(const CapacityProfile& profile, const LoadEstimate& load,
                   int replicas, double quantile) {
  if (Empty(load, load.prompt)) return 0;
  if (replicas <= 0) return kOverloaded;
  const PrefillStats s = PrefillService(profile, load, quantile);
  const double a = load.request_rate * s.mean_s;
  if (a >= replicas) return kOverloaded;
  const double wait_chance = ErlangC(replicas, a);
  // Allen-Cunneen: waiting scales with (1 + cs²) / 2 for Poisson arrivals;
  // its tail is close to exponential.
  const double decay = (replicas - a) / s.mean_s * 2 / (1 + s.scv);
  const double wait = wait_chance > 1 - quantile
                          ? std::log(wait_chance / (1 - quantile)) / decay
                          : 0;
  return wait + s.quantile_service_s;
}

Sizing SizePrefill(const CapacityProfile& profile, const LoadEstimate& load,
                   double ttft_target_s, double quantile, int max_replicas) {
  Sizing z;
  if (Empty(load, load.prompt)) {
    z.why = "no prompt load";
    return z;
  }
  const PrefillStats s = PrefillService(profile, load, quantile);
  const double a = load.request_rate * s.mean_s;
  if (s.quantile_service_s > ttft_target_s) {
    // No count helps a prompt that alone takes longer than the target:
    // size for throughput at 80 % utilisation and say so.
    z.feasible = false;
    z.replicas = std::clamp<int>(std::ceil(a / 0.8), 1, max_replicas);
    z.why = absl::StrFormat(
        "infeasible: a p%g prompt (%.0f tokens) alone takes %.3f s > TTFT "
        "target %.3f s; sized for 80%% utilisation",
        quantile * 100, s.quantile_tokens, s.quantile_service_s, ttft_target_s);
  } else {
    const int n = SmallestMeeting(
        [&](int c) { return PredictTtft(profile, load, c, quantile); },
        ttft_target_s, static_cast<int>(std::floor(a)) + 1, max_replicas);
    z.feasible = n > 0;
    z.replicas = n > 0 ? n : max_replicas;
    z.why = absl::StrFormat(
        "%.2f req/s x %.3f s busy each = %.2f workers busy; p%g prompt %.0f "
        "tokens",
        load.request_rate, s.mean_s, a, quantile * 100, s.quantile_tokens);
    if (n < 0) absl::StrAppend(&z.why, "; even the maximum misses the target");
  }
  z.predicted_latency_s = PredictTtft(profile, load, z.replicas, quantile);
  return z;
}

double PredictItl(const CapacityProfile& profile, const LoadEstimate& load,
                  int replicas, double quantile) {
  if (Empty(load, load.output)) return 0;
  if (replicas <= 0) return kOverloaded;
  const DecodeStats s = DecodeService(profile, load);
  const double b = MeanBatch(profile, s, load.request_rate, replicas);
  if (b <= 0) return kOverloaded;
  // Streams per worker vary like a Poisson count: the quantile batch.
  const double bq = b + NormalQuantile(quantile) * std::sqrt(b);
  double itl = profile.DecodeStepSeconds(bq, s.context);
  // Past the limit streams wait for a slot: their gaps stretch.
  if (bq > s.limit) itl *= bq / s.limit;
  return itl;
}

double PredictMeanItl(const CapacityProfile& profile, const LoadEstimate& load,
                      int replicas) {
  if (Empty(load, load.output)) return 0;
  if (replicas <= 0) return kOverloaded;
  const DecodeStats s = DecodeService(profile, load);
  const double b = MeanBatch(profile, s, load.request_rate, replicas);
  if (b <= 0) return kOverloaded;
  const double streams = b + 1;
  double itl = profile.DecodeStepSeconds(streams, s.context);
  if (streams > s.limit) itl *= streams / s.limit;
  return itl;
}

Sizing SizeDecode(const CapacityProfile& profile, const LoadEstimate& load,
                  double itl_target_s, double quantile, int max_replicas) {
  Sizing z;
  if (Empty(load, load.output)) {
    z.why = "no decode load";
    return z;
  }
  const DecodeStats s = DecodeService(profile, load);
  const double one = profile.DecodeStepSeconds(1, s.context);
  const double tokens_per_s = load.request_rate * s.tokens_per_request;
  if (one > itl_target_s) {
    z.feasible = false;
    // Throughput at the largest batch, 90 % of it.
    const double per_worker =
        s.limit / profile.DecodeStepSeconds(s.limit, s.context);
    z.replicas = std::clamp<int>(std::ceil(tokens_per_s / (0.9 * per_worker)),
                                 1, max_replicas);
    z.why = absl::StrFormat(
        "infeasible: one stream's step at context %.0f is %.4f s > ITL "
        "target %.4f s; sized for 90%% of max-batch throughput",
        s.context, one, itl_target_s);
  } else {
    const int n = SmallestMeeting(
        [&](int c) { return PredictItl(profile, load, c, quantile); },
        itl_target_s, 1, max_replicas);
    z.feasible = n > 0;
    z.replicas = n > 0 ? n : max_replicas;
    const double b = MeanBatch(profile, s, load.request_rate, z.replicas);
    z.why = absl::StrFormat(
        "%.1f tokens/s to decode; mean batch %.2f per worker at context %.0f",
        tokens_per_s, b, s.context);
    if (n < 0) absl::StrAppend(&z.why, "; even the maximum misses the target");
  }
  z.predicted_latency_s = PredictItl(profile, load, z.replicas, quantile);
  return z;
}

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(
    const PlannerOptions& o, CapacityProfile profile) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("planner: ", what));
  };
  if (!(o.ttft_target_s > 0) || !(o.itl_target_s > 0)) {
    return bad("ttft and itl targets must be > 0");
  }
  if (!(o.quantile > 0 && o.quantile < 1)) {
    return bad("quantile must be in (0, 1)");
  }
  if (!(o.interval_s > 0)) return bad("interval must be > 0");
  if (o.min_prefill < 0 || o.min_decode < 0 || o.min_prefill > o.max_prefill ||
      o.min_decode > o.max_decode || o.max_prefill < 1 || o.max_decode < 1) {
    return bad("need 0 <= min <= max and max >= 1 for each pool");
  }
  if (o.budget < 0) return bad("budget must be >= 0 (0: none)");
  const double min_cost = o.min_prefill * profile.prefill_cost() +
                          o.min_decode * profile.decode_cost();
  if (o.budget > 0 && min_cost > o.budget) {
    return bad(absl::StrCat("the minimum replicas cost ", min_cost, " ",
                            profile.cost_unit(), ", over the budget of ",
                            o.budget));
  }
  if (o.hysteresis < 0 || !(o.max_scale_down_fraction > 0) ||
      o.scale_down_window_s < 0 || o.manual_hold_s < 0) {
    return bad(
        "hysteresis, window and hold must be >= 0, the scale-down "
        "fraction > 0");
  }
  if (o.forecast_headroom_z < 0) return bad("forecast_headroom_z must be >= 0");
  if (!(o.min_correction > 0) || o.max_correction < o.min_correction) {
    return bad("need 0 < min_correction <= max_correction");
  }
  if (o.min_correction_samples < 0 || o.min_correction_tail_samples < 0) {
    return bad("correction sample minimums must be >= 0");
  }
  return std::unique_ptr<Planner>(new Planner(o, std::move(profile)));
}

Planner::Planner(const PlannerOptions& options, CapacityProfile profile)
    : options_(options),
      profile_(std::move(profile)),
      predictor_(options.predictor) {}

PoolDecision Planner::DecidePool(bool prefill, const Observation& o,
                                 const LoadEstimate& observed,
                                 const LoadEstimate& forecast, double weight,
                                 PoolState& state) {
  const PlannerOptions& opt = options_;
  const PoolObservation& pool = prefill ? o.prefill : o.decode;
  const int min = prefill ? opt.min_prefill : opt.min_decode;
  const int max = prefill ? opt.max_prefill : opt.max_decode;
  const double target = prefill ? opt.ttft_target_s : opt.itl_target_s;
  auto size = [&](const LoadEstimate& load, double t) {
    return prefill ? SizePrefill(profile_, load, t, opt.quantile, max)
                   : SizeDecode(profile_, load, t, opt.quantile, max);
  };
  auto predict = [&](const LoadEstimate& load, int n) {
    return prefill ? PredictTtft(profile_, load, n, opt.quantile)
                   : PredictItl(profile_, load, n, opt.quantile);
  };

  PoolDecision d;
  d.pool = prefill ? "prefill" : "decode";
  d.configured = pool.configured > 0 ? pool.configured : pool.ready;
  d.ready = pool.ready;
  const int current = d.configured;

  // An operator's change: the configured count is not what we asked for.
  if (state.last_desired.has_value() &&
      pool.configured != *state.last_desired) {
    state.manual_until = o.time_s + opt.manual_hold_s;
    state.need_down_history.clear();
    d.reasons.push_back(absl::StrFormat(
        "replicas changed from %d to %d by someone else: holding %d for "
        "%.0f s",
        *state.last_desired, pool.configured, pool.configured,
        opt.manual_hold_s));
  }

  // How far the profile is off: observed latency over the model's at the
  // observed load and the ready workers. Only from steady intervals: warm
  // and well sampled (a cold start's first requests are slow for other
  // reasons), no backlog (latency then measures the queue a burst left,
  // which the queue depth already plans for), no scaling under way or just
  // done (the ready count was not the count all along) and no request
  // moved between workers.
  //
  // Prefill compares the TTFT quantile; decode the mean inter-token gap,
  // not its quantile. A quantile of gaps is set by the rarest, slowest
  // ones, such as each stream's first gap after its hand-off from prefill
  // (the KV transfer and admission), which the profile's step times leave
  // out and more decode workers do not shorten: in the closed-loop test
  // at 1 request/s per worker it put the ITL p99 in the histogram bucket
  // above the model's (1.9x), and the correction kept extra decode workers
  // after the load fell. A slower cluster than profiled shows in the mean
  // as much as in the tail.
  d.observed_latency_s = prefill ? o.ttft_s : o.itl_s;
  const double samples = prefill ? o.ttft_samples : o.itl_samples;
  d.model_latency_s = pool.ready > 0 ? predict(observed, pool.ready) : 0;
  d.compared_observed_s = prefill ? o.ttft_s : o.itl_mean_s;
  d.compared_model_s = prefill || pool.ready <= 0
                           ? d.model_latency_s
                           : PredictMeanItl(profile_, observed, pool.ready);
  const bool unchanged =
      pool.ready == current &&
      (!state.last_desired || *state.last_desired == current) &&
      state.ready_before == pool.ready;
  if (!unchanged) state.scaled_at = o.time_s;
  state.ready_before = pool.ready;
  // Steady: also no scaling in the interval before this one (a scale-down
  // at its end migrates streams whose long gap lands in this one).
  // Nor a request moved between workers (a scale-down's hand-back can come
  // a drain deadline after the scale).
  const bool steady = unchanged && pool.queue_depth <= pool.ready &&
                      o.time_s - state.scaled_at > 1.5 * opt.interval_s &&
                      o.migrations == 0 && (!prefill || o.retries == 0);
  if (d.compared_observed_s.has_value() && weight >= 1 && steady &&
      samples >= opt.min_correction_samples &&
      (!prefill ||
       samples * (1 - opt.quantile) >= opt.min_correction_tail_samples) &&
      d.compared_model_s > 0 && d.compared_model_s < kOverloaded) {
    // A histogram's quantile is known to its bucket only: the model's
    // prediction, moved into that bucket, is what the observation can
    // vouch for. (A mean is exact.)
    const double seen =
        prefill && o.ttft_bucket.has_value()
            ? std::clamp(d.compared_model_s, o.ttft_bucket->lower,
                         o.ttft_bucket->upper)
            : *d.compared_observed_s;
    const double ratio = std::clamp(seen / d.compared_model_s,
                                    opt.min_correction, opt.max_correction);
    state.correction =
        std::clamp(opt.correction_alpha * ratio +
                       (1 - opt.correction_alpha) * state.correction,
                   opt.min_correction, opt.max_correction);
  }
  d.correction = state.correction;
  const double effective = target / d.correction;
  if (std::abs(d.correction - 1) > 0.05) {
    d.reasons.push_back(absl::StrFormat(
        "latency correction %.2f: planning for %.4f s instead of %.4f s",
        d.correction, effective, target));
  }

  Sizing need = size(forecast, effective);
  LoadEstimate heavier = forecast;
  heavier.request_rate *= 1 + opt.hysteresis;
  Sizing need_down = size(heavier, effective);
  d.feasible = need.feasible;
  d.reasons.push_back(need.why);
  d.need = need.replicas;
  d.need_down = std::max(need.replicas, need_down.replicas);
  // A decode pool whose KV cache is nearly full needs workers whatever the
  // latency model says (long contexts the histograms under-state).
  if (!prefill && pool.kv_usage > opt.kv_usage_high && pool.ready > 0) {
    const int floor_kv = static_cast<int>(
        std::ceil(pool.ready * pool.kv_usage / opt.kv_usage_target));
    if (floor_kv > d.need) {
      d.reasons.push_back(
          absl::StrFormat("KV cache %.0f%% used: at least %d workers",
                          100 * pool.kv_usage, floor_kv));
      d.need = floor_kv;
    }
    d.need_down = std::max(d.need_down, floor_kv);
  }
  d.need = std::clamp(d.need, min, max);
  d.need_down = std::clamp(d.need_down, min, max);

  // Scale-down stabilization: the largest need over the window.
  state.need_down_history.emplace_back(o.time_s, d.need_down);
  while (!state.need_down_history.empty() &&
         state.need_down_history.front().first <
             o.time_s - opt.scale_down_window_s) {
    state.need_down_history.pop_front();
  }
  d.stabilized = d.need_down;
  for (const auto& [t, n] : state.need_down_history) {
    d.stabilized = std::max(d.stabilized, n);
  }

  if (o.time_s < state.manual_until) {
    d.manual_hold = true;
    d.desired = current;
    d.reasons.push_back(absl::StrFormat(
        "holding the operator's %d for %.0f s more (would want %d)", current,
        state.manual_until - o.time_s, d.need));
  } else if (d.need > current) {
    // Up: all the way at once (cold start: only part of the way).
    d.desired =
        current + static_cast<int>(std::ceil(weight * (d.need - current)));
    d.reasons.push_back(
        absl::StrFormat("scale up %d -> %d", current, d.desired));
  } else if (d.stabilized < current && weight >= 1) {
    const int step = std::max(
        1, static_cast<int>(std::floor(current * opt.max_scale_down_fraction)));
    d.desired = std::max(d.stabilized, current - step);
    d.reasons.push_back(absl::StrFormat(
        "scale down %d -> %d (largest need with %.0f%% margin over %.0f s: %d)",
        current, d.desired, 100 * opt.hysteresis, opt.scale_down_window_s,
        d.stabilized));
  } else {
    d.desired = current;
    if (d.need < current) {
      d.reasons.push_back(
          weight < 1 ? "hold: no scale-down while cold"
                     : absl::StrFormat("hold %d: need %d, but %d within the "
                                       "margin or window",
                                       current, d.need, d.stabilized));
    }
  }
  if (!d.manual_hold) d.desired = std::clamp(d.desired, min, max);
  return d;
}

namespace {

// Metrics can be missing or garbage (a scrape of a restarting process, a
// counter reset read as a negative increase): what is not a finite,
// non-negative number is taken as absent or zero, and said so.
Observation Sanitized(const Observation& in, std::vector<std::string>* notes) {
  Observation o = in;
  auto fix = [&](double* v, const char* name) {
    if (!std::isfinite(*v) || *v < 0) {
      notes->push_back(absl::StrCat("ignored ", name, " = ", *v));
      *v = 0;
    }
  };
  auto fix_latency = [&](std::optional<double>* v, const char* name) {
    if (v->has_value() && (!std::isfinite(**v) || **v < 0)) {
      notes->push_back(absl::StrCat("ignored ", name, " = ", **v));
      v->reset();
    }
  };
  if (!(o.load.duration_s > 0) || !std::isfinite(o.load.duration_s)) {
    notes->push_back(absl::StrCat("ignored interval duration ",
                                  o.load.duration_s, " s: no load sample"));
    o.load.duration_s = 1;
    o.load.requests = 0;
  }
  fix(&o.load.requests, "requests");
  fix(&o.cached_prompt_fraction, "cached prompt fraction");
  o.cached_prompt_fraction = std::min(o.cached_prompt_fraction, 1.0);
  fix_latency(&o.ttft_s, "TTFT");
  fix_latency(&o.itl_s, "ITL");
  fix_latency(&o.itl_mean_s, "ITL mean");
  fix(&o.ttft_samples, "TTFT samples");
  fix(&o.itl_samples, "ITL samples");
  for (PoolObservation* p : {&o.prefill, &o.decode}) {
    fix(&p->queue_depth, "queue depth");
    fix(&p->kv_usage, "KV usage");
    p->configured = std::max(0, p->configured);
    p->ready = std::max(0, p->ready);
  }
  return o;
}

}  // namespace

Decision Planner::Decide(const Observation& raw) {
  const PlannerOptions& opt = options_;
  std::vector<std::string> notes;
  const Observation o = Sanitized(raw, &notes);
  predictor_.Observe(o.load);
  Decision d;
  d.reasons = notes;
  d.time_s = o.time_s;
  const double duration = std::max(o.load.duration_s, 1e-9);
  d.observed_rate = o.load.requests / duration;

  LoadEstimate observed;
  observed.request_rate = d.observed_rate;
  observed.cached_prompt_fraction = o.cached_prompt_fraction;

  auto forecast_for = [&](double load_time_s, double queue_depth) {
    // Plan for when a worker started now would be ready.
    const LoadForecast f =
        predictor_.Predict((opt.interval_s + load_time_s) / opt.interval_s);
    LoadEstimate e;
    // Requests already waiting are load too: clear them in one interval.
    e.request_rate =
        f.request_rate +
        opt.forecast_headroom_z * std::sqrt(f.request_rate / opt.interval_s) +
        queue_depth / opt.interval_s;
    e.prompt = f.prompt;
    e.output = f.output;
    e.cached_prompt_fraction = o.cached_prompt_fraction;
    return std::make_pair(f, e);
  };
  auto [fp, prefill_load] =
      forecast_for(profile_.prefill_load_time_s(), o.prefill.queue_depth);
  auto [fd, decode_load] =
      forecast_for(profile_.decode_load_time_s(), o.decode.queue_depth);
  observed.prompt = o.load.prompt.count() > 0 ? o.load.prompt : fp.prompt;
  observed.output = o.load.output.count() > 0 ? o.load.output : fp.output;

  d.prompt_p50 = fp.prompt.Quantile(0.5);
  d.prompt_p90 = fp.prompt.Quantile(0.9);
  d.prompt_mean = fp.prompt.Mean();
  d.output_p50 = fp.output.Quantile(0.5);
  d.output_p90 = fp.output.Quantile(0.9);
  d.output_mean = fp.output.Mean();
  d.observed_ttft_s = o.ttft_s;
  d.observed_itl_s = o.itl_s;
  d.observed_itl_mean_s = o.itl_mean_s;
  d.prefill_queue_depth = o.prefill.queue_depth;
  d.decode_kv_usage = o.decode.kv_usage;
  d.forecast_rate = fp.request_rate;
  d.forecast_level = fp.level;
  d.forecast_trend = fp.trend;
  d.forecast_samples = fp.samples;
  d.warm = fp.warm;
  const int min_samples = std::max(1, opt.predictor.min_samples);
  d.cold_start_weight =
      fp.warm ? 1.0 : std::min(1.0, double(fp.samples) / min_samples);
  if (!fp.warm) {
    d.reasons.push_back(absl::StrFormat(
        "cold start: %d of %d samples, moving %.0f%% of the way up, never down",
        fp.samples, min_samples, 100 * d.cold_start_weight));
  }

  d.prefill = DecidePool(true, o, observed, prefill_load, d.cold_start_weight,
                         prefill_state_);
  d.decode = DecidePool(false, o, observed, decode_load, d.cold_start_weight,
                        decode_state_);

  // The budget: scale what each pool wants above its minimum by one
  // factor, then give what is left one worker at a time to the pool
  // furthest below its want. A pool an operator holds keeps its count.
  const double cp = profile_.prefill_cost(), cd = profile_.decode_cost();
  auto cost = [&](int p, int q) { return p * cp + q * cd; };
  if (opt.budget > 0 &&
      cost(d.prefill.desired, d.decode.desired) > opt.budget) {
    d.budget_clamped = true;
    const int want_p = d.prefill.desired, want_d = d.decode.desired;
    const int base_p = d.prefill.manual_hold ? want_p : opt.min_prefill;
    const int base_d = d.decode.manual_hold ? want_d : opt.min_decode;
    const double spare = opt.budget - cost(base_p, base_d);
    const double extra = cost(want_p - base_p, want_d - base_d);
    const double f = extra > 0 ? std::clamp(spare / extra, 0.0, 1.0) : 0;
    int p = base_p + static_cast<int>(std::floor((want_p - base_p) * f));
    int q = base_d + static_cast<int>(std::floor((want_d - base_d) * f));
    while (true) {
      const double short_p = want_p > 0 ? double(want_p - p) / want_p : 0;
      const double short_d = want_d > 0 ? double(want_d - q) / want_d : 0;
      const bool can_p = p < want_p && cost(p + 1, q) <= opt.budget;
      const bool can_d = q < want_d && cost(p, q + 1) <= opt.budget;
      if (can_p && (!can_d || short_p >= short_d)) {
        ++p;
      } else if (can_d) {
        ++q;
      } else {
        break;
      }
    }
    d.reasons.push_back(absl::StrFormat(
        "budget %.4g %s: wanted %d prefill + %d decode (%.4g), giving %d + %d",
        opt.budget, profile_.cost_unit(), want_p, want_d, cost(want_p, want_d),
        p, q));
    d.prefill.desired = p;
    d.decode.desired = q;
  }
  d.cost = cost(d.prefill.desired, d.decode.desired);
  d.prefill.predicted_latency_s =
      PredictTtft(profile_, prefill_load, d.prefill.desired, opt.quantile);
  d.decode.predicted_latency_s =
      PredictItl(profile_, decode_load, d.decode.desired, opt.quantile);
  prefill_state_.last_desired = d.prefill.desired;
  decode_state_.last_desired = d.decode.desired;
  return d;
}

namespace {

nlohmann::json Optional(const std::optional<double>& v) {
  return v.has_value() ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json PoolJson(const PoolDecision& p) {
  return {{"configured", p.configured},
          {"ready", p.ready},
          {"observed_latency_s", Optional(p.observed_latency_s)},
          {"model_latency_s", p.model_latency_s},
          {"compared_observed_s", Optional(p.compared_observed_s)},
          {"compared_model_s", p.compared_model_s},
          {"correction", p.correction},
          {"need", p.need},
          {"need_down", p.need_down},
          {"stabilized", p.stabilized},
          {"desired", p.desired},
          {"predicted_latency_s", p.predicted_latency_s},
          {"feasible", p.feasible},
          {"manual_hold", p.manual_hold},
          {"reasons", p.reasons}};
}

}  // namespace

std::string Decision::ToJson() const {
  nlohmann::json j = {
      {"time_s", time_s},
      {"observed",
       {{"request_rate", observed_rate},
        {"ttft_s", Optional(observed_ttft_s)},
        {"itl_s", Optional(observed_itl_s)},
        {"itl_mean_s", Optional(observed_itl_mean_s)},
        {"prefill_queue_depth", prefill_queue_depth},
        {"decode_kv_usage", decode_kv_usage}}},
      {"forecast",
       {{"request_rate", forecast_rate},
        {"level", forecast_level},
        {"trend", forecast_trend},
        {"samples", forecast_samples},
        {"warm", warm},
        {"prompt_tokens",
         {{"p50", prompt_p50}, {"p90", prompt_p90}, {"mean", prompt_mean}}},
        {"output_tokens",
         {{"p50", output_p50}, {"p90", output_p90}, {"mean", output_mean}}}}},
      {"cold_start_weight", cold_start_weight},
      {"prefill", PoolJson(prefill)},
      {"decode", PoolJson(decode)},
      {"cost", cost},
      {"budget_clamped", budget_clamped},
      {"reasons", reasons}};
  return j.dump();
}

std::vector<Decision::Gauge> Decision::Gauges() const {
  std::vector<Gauge> g;
  for (const PoolDecision* p : {&prefill, &decode}) {
    const std::vector<std::pair<std::string, std::string>> pool = {
        {"pool", p->pool}};
    g.push_back({"pdserve_planner_desired_replicas", pool, double(p->desired)});
    g.push_back({"pdserve_planner_needed_replicas", pool, double(p->need)});
    g.push_back({"pdserve_planner_latency_correction", pool, p->correction});
    g.push_back({"pdserve_planner_predicted_latency_seconds", pool,
                 p->predicted_latency_s});
    g.push_back(
        {"pdserve_planner_manual_hold", pool, p->manual_hold ? 1.0 : 0.0});
  }
  g.push_back({"pdserve_planner_observed_request_rate", {}, observed_rate});
  g.push_back({"pdserve_planner_forecast_request_rate", {}, forecast_rate});
  g.push_back({"pdserve_planner_cost", {}, cost});
  g.push_back(
      {"pdserve_planner_budget_clamped", {}, budget_clamped ? 1.0 : 0.0});
  return g;
}

}  // namespace pdserve::planner
