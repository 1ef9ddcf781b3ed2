#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>

namespace pdserve::planner {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// Latencies in log-spaced bins 1 % wide from 0.1 ms: quantiles of tens of
// millions of token gaps without keeping them.
class LogHistogram {
 public:
  LogHistogram() : counts_(kBins, 0) {}
  void Add(double v) {
    int i = 0;
    if (v > kMin) {
      i = std::min<int>(kBins - 1, 1 + int(std::log(v / kMin) / kLogStep));
    }
    ++counts_[i];
    ++count_;
    sum_ += v;
  }
  double Mean() const { return count_ > 0 ? sum_ / count_ : 0; }
  // The upper edge of the bin holding the quantile (within 1 %).
  double Quantile(double q) const {
    if (count_ == 0) return 0;
    const double rank = q * count_;
    int64_t seen = 0;
    for (int i = 0; i < kBins; ++i) {
      seen += counts_[i];
      if (seen >= rank && seen > 0) return kMin * std::exp(i * kLogStep);
    }
    return kMin * std::exp((kBins - 1) * kLogStep);
  }
  int64_t count() const { return count_; }
  void Clear() {
    std::fill(counts_.begin(), counts_.end(), 0);
    count_ = 0;
    sum_ = 0;
  }

 private:
  static constexpr double kMin = 1e-4;
  static constexpr int kBins = 1900;  // up to about 1.6e4 s
  static inline const double kLogStep = std::log(1.01);
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  double sum_ = 0;
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

struct RequestState {
  double first_token = -1;
  double last_token = -1;
  int32_t generated = 0;  // by decode
  bool done = false, met = false, ttft_met = false, itl_met = false;
};

struct Worker {
  double start = 0, ready_at = 0, end = -1;
  bool draining = false, gone = false;
  bool Ready(double now) const { return !gone && !draining && ready_at <= now; }
  // Prefill.
  std::deque<int> queue;
  bool busy = false;
  double queued_work = 0;
  // Decode.
  std::deque<int> waiting;
  std::vector<int> running;
  bool stepping = false;
  double context = 0;  // tokens of the running streams
};

enum Kind { kPrefillDone, kStepDone, kPrefillReady, kDecodeReady, kJoin };

struct Event {
  double time;
  int kind;
  int index;  // worker, or request for kJoin
  bool operator>(const Event& o) const { return time > o.time; }
};

class Sim {
 public:
  Sim(const CapacityProfile& profile, const std::vector<SimRequest>& requests,
      const SimOptions& options)
      : p_(profile), req_(requests), o_(options), state_(requests.size()) {}

  SimResult Run(const SimPolicy& policy) {
    span_ = 0;
    for (const SimRequest& r : req_) span_ = std::max(span_, r.arrival_s);
    span_ = std::ceil(span_ / o_.interval_s) * o_.interval_s;
    Scale(true, o_.prefill_only || !o_.decode_only ? o_.initial_prefill : 0,
          /*initial=*/true);
    Scale(false, o_.decode_only || !o_.prefill_only ? o_.initial_decode : 0,
          true);
    size_t next = 0;
    double tick = o_.interval_s;
    int64_t finished = 0;
    while (finished < int64_t(req_.size())) {
      const double t_arrival =
          next < req_.size() ? req_[next].arrival_s : kNever;
      const double t_event = events_.empty() ? kNever : events_.top().time;
      if (tick <= t_arrival && tick <= t_event) {
        now_ = tick;
        Tick(policy);
        tick += o_.interval_s;
        continue;
      }
      if (t_arrival <= t_event) {
        now_ = t_arrival;
        finished += Arrive(next++);
      } else {
        const Event e = events_.top();
        events_.pop();
        now_ = e.time;
        finished += Handle(e);
      }
    }
    return Finish();
  }

 private:
  // Returns the requests this event finished.
  int Handle(const Event& e) {
    switch (e.kind) {
      case kPrefillDone:
        return PrefillDone(e.index);
      case kStepDone:
        return StepDone(e.index);
      case kPrefillReady:
        if (!prefill_[e.index].gone) {
          std::deque<int> backlog;
          backlog.swap(prefill_backlog_);
          for (int r : backlog) RoutePrefill(r);
        }
        return 0;
      case kDecodeReady:
        if (!decode_[e.index].gone) {
          std::deque<int> backlog;
          backlog.swap(decode_backlog_);
          for (int r : backlog) RouteDecode(r);
        }
        return 0;
      case kJoin:
        RouteDecode(e.index);
        return 0;
    }
    return 0;
  }

  int Arrive(int r) {
    ++interval_arrivals_;
    interval_prompt_.Add(req_[r].prompt_tokens);
    if (o_.decode_only) {
      // Prefill is someone else's problem: the first token after the lone
      // TTFT.
      return FirstToken(r, now_ + p_.LoneTtftSeconds(req_[r].prompt_tokens));
    }
    RoutePrefill(r);
    return 0;
  }

  void RoutePrefill(int r) {
    int best = -1;
    for (int w : prefill_active_) {
      if (!prefill_[w].Ready(now_)) continue;
      if (best < 0 || prefill_[w].queued_work < prefill_[best].queued_work) {
        best = w;
      }
    }
    if (best < 0) {
      prefill_backlog_.push_back(r);
      return;
    }
    Worker& w = prefill_[best];
    w.queued_work += p_.PrefillSeconds(req_[r].prompt_tokens);
    w.queue.push_back(r);
    if (!w.busy) StartPrefill(best);
  }

  void StartPrefill(int wi) {
    Worker& w = prefill_[wi];
    w.busy = true;
    events_.push({now_ + p_.PrefillSeconds(req_[w.queue.front()].prompt_tokens),
                  kPrefillDone, wi});
  }

  int PrefillDone(int wi) {
    Worker& w = prefill_[wi];
    const int r = w.queue.front();
    w.queue.pop_front();
    const double busy = p_.PrefillSeconds(req_[r].prompt_tokens);
    w.queued_work = std::max(0.0, w.queued_work - busy);
    w.busy = false;
    if (!w.queue.empty()) {
      StartPrefill(wi);
    } else if (w.draining) {
      Leave(prefill_, prefill_active_, wi);
    }
    // The lone TTFT's part beyond the busy time (transfer, scheduling)
    // delays the token but not the worker.
    const double overhead =
        std::max(0.0, p_.LoneTtftSeconds(req_[r].prompt_tokens) - busy);
    return FirstToken(r, now_ + overhead);
  }

  int FirstToken(int r, double at) {
    RequestState& s = state_[r];
    s.first_token = s.last_token = at;
    const double ttft = at - req_[r].arrival_s;
    interval_ttft_.push_back(ttft);
    all_ttft_.push_back(ttft);
    s.ttft_met = o_.decode_only || ttft <= o_.ttft_target_s;
    if (o_.prefill_only || req_[r].output_tokens <= 1) {
      s.itl_met = true;
      return Complete(r);
    }
    if (at <= now_) {
      RouteDecode(r);
    } else {
      events_.push({at, kJoin, r});
    }
    return 0;
  }

  void RouteDecode(int r) {
    int best = -1;
    size_t best_load = 0;
    for (int w : decode_active_) {
      const Worker& d = decode_[w];
      if (!d.Ready(now_)) continue;
      const size_t load = d.running.size() + d.waiting.size();
      if (best < 0 || load < best_load) {
        best = w;
        best_load = load;
      }
    }
    if (best < 0) {
      decode_backlog_.push_back(r);
      return;
    }
    decode_[best].waiting.push_back(r);
    if (!decode_[best].stepping) StartStep(best);
  }

  void StartStep(int wi) {
    Worker& w = decode_[wi];
    // Streams join while the batch and the KV cache have room (one always
    // may, or a long prompt would wait for ever).
    while (!w.waiting.empty() && int(w.running.size()) < p_.max_batch()) {
      const int r = w.waiting.front();
      const double context = req_[r].prompt_tokens + state_[r].generated + 1;
      if (!w.running.empty() && w.context + context > p_.kv_capacity_tokens()) {
        break;
      }
      w.waiting.pop_front();
      w.running.push_back(r);
      w.context += context;
    }
    if (w.running.empty()) {
      w.stepping = false;
      return;
    }
    w.stepping = true;
    const double batch = w.running.size();
    events_.push(
        {now_ + p_.DecodeStepSeconds(batch, w.context / batch), kStepDone, wi});
  }

  int StepDone(int wi) {
    Worker& w = decode_[wi];
    int finished = 0;
    for (size_t i = 0; i < w.running.size();) {
      const int r = w.running[i];
      RequestState& s = state_[r];
      const double gap = now_ - s.last_token;
      interval_itl_.Add(gap);
      all_itl_.Add(gap);
      s.last_token = now_;
      ++s.generated;
      w.context += 1;
      if (s.generated >= req_[r].output_tokens - 1) {
        w.context -= req_[r].prompt_tokens + s.generated + 1;
        const double tpot = (now_ - s.first_token) / s.generated;
        all_tpot_.push_back(tpot);
        s.itl_met = o_.prefill_only || tpot <= o_.itl_target_s;
        finished += Complete(r);
        w.running[i] = w.running.back();
        w.running.pop_back();
      } else {
        ++i;
      }
    }
    StartStep(wi);
    if (!w.stepping && w.waiting.empty() && w.draining) {
      Leave(decode_, decode_active_, wi);
    }
    return finished;
  }

  int Complete(int r) {
    RequestState& s = state_[r];
    s.done = true;
    s.met = s.ttft_met && s.itl_met;
    interval_output_.Add(req_[r].output_tokens);
    return 1;
  }

  void Leave(std::vector<Worker>& pool, std::vector<int>& active, int wi) {
    pool[wi].gone = true;
    pool[wi].end = now_;
    active.erase(std::find(active.begin(), active.end(), wi));
  }

  void Scale(bool prefill, int want, bool initial = false) {
    std::vector<Worker>& pool = prefill ? prefill_ : decode_;
    std::vector<int>& active = prefill ? prefill_active_ : decode_active_;
    (prefill ? prefill_configured_ : decode_configured_) = want;
    std::vector<int> serving;  // not draining
    for (int w : active) {
      if (!pool[w].draining) serving.push_back(w);
    }
    const double load =
        prefill ? p_.prefill_load_time_s() : p_.decode_load_time_s();
    for (int n = serving.size(); n < want; ++n) {
      Worker w;
      w.start = now_;
      w.ready_at = initial ? now_ : now_ + load;
      pool.push_back(std::move(w));
      active.push_back(pool.size() - 1);
      if (!initial) {
        events_.push({now_ + load, prefill ? kPrefillReady : kDecodeReady,
                      int(pool.size() - 1)});
      }
    }
    if (int(serving.size()) > want) {
      // Loading workers first (newest first), then the least busy.
      auto work = [&](int w) {
        const Worker& x = pool[w];
        return prefill ? x.queued_work
                       : double(x.running.size() + x.waiting.size());
      };
      std::sort(serving.begin(), serving.end(), [&](int a, int b) {
        const bool la = pool[a].ready_at > now_, lb = pool[b].ready_at > now_;
        if (la != lb) return la;
        if (la) return pool[a].ready_at > pool[b].ready_at;
        return work(a) < work(b);
      });
      for (int i = 0; i < int(serving.size()) - want; ++i) {
        Worker& w = pool[serving[i]];
        w.draining = true;
        const bool idle = prefill ? !w.busy && w.queue.empty()
                                  : !w.stepping && w.waiting.empty();
        if (w.ready_at > now_ || idle) Leave(pool, active, serving[i]);
      }
    }
    int& peak = prefill ? peak_prefill_ : peak_decode_;
    peak = std::max<int>(peak, active.size());
  }

  void Tick(const SimPolicy& policy) {
    Observation o;
    o.time_s = now_;
    o.load.duration_s = o_.interval_s;
    o.load.requests = interval_arrivals_;
    o.load.prompt = interval_prompt_;
    o.load.output = interval_output_;
    if (!interval_ttft_.empty()) {
      o.ttft_s = Quantile(interval_ttft_, o_.quantile);
      o.ttft_samples = interval_ttft_.size();
    }
    if (interval_itl_.count() > 0) {
      o.itl_s = interval_itl_.Quantile(o_.quantile);
      o.itl_samples = interval_itl_.count();
      o.itl_mean_s = interval_itl_.Mean();
    }
    auto observe = [&](bool prefill) {
      const std::vector<Worker>& pool = prefill ? prefill_ : decode_;
      const std::vector<int>& active =
          prefill ? prefill_active_ : decode_active_;
      PoolObservation po;
      po.configured = prefill ? prefill_configured_ : decode_configured_;
      double kv = 0;
      for (int w : active) {
        const Worker& x = pool[w];
        if (!x.Ready(now_)) continue;
        ++po.ready;
        // Prefill: the prompts behind the one in service.
        po.queue_depth += prefill ? (x.queue.empty() ? 0 : x.queue.size() - 1)
                                  : x.waiting.size();
        kv += x.context / p_.kv_capacity_tokens();
      }
      po.queue_depth +=
          prefill ? prefill_backlog_.size() : decode_backlog_.size();
      po.kv_usage = !prefill && po.ready > 0 ? kv / po.ready : 0;
      return po;
    };
    o.prefill = observe(true);
    o.decode = observe(false);

    SimInterval iv;
    iv.start_s = now_ - o_.interval_s;
    iv.arrival_rate = interval_arrivals_ / o_.interval_s;
    iv.prefill_configured = prefill_configured_;
    iv.prefill_ready = o.prefill.ready;
    iv.prefill_alive = prefill_active_.size();
    iv.decode_configured = decode_configured_;
    iv.decode_ready = o.decode.ready;
    iv.decode_alive = decode_active_.size();
    iv.ttft_p99_s = o.ttft_s.value_or(0);
    iv.itl_p99_s = o.itl_s.value_or(0);
    timeline_.push_back(iv);

    interval_arrivals_ = 0;
    interval_prompt_ = LengthHistogram();
    interval_output_ = LengthHistogram();
    interval_ttft_.clear();
    interval_itl_.Clear();

    auto [want_prefill, want_decode] = policy(o);
    if (!o_.decode_only) Scale(true, std::max(1, want_prefill));
    if (!o_.prefill_only) Scale(false, std::max(1, want_decode));
  }

  SimResult Finish() {
    SimResult r;
    r.requests = req_.size();
    r.span_s = span_;
    int64_t met = 0, ttft_met = 0, itl_met = 0;
    for (const RequestState& s : state_) {
      met += s.met;
      ttft_met += s.ttft_met;
      itl_met += s.itl_met;
    }
    const double n = std::max<double>(1, req_.size());
    r.attainment = met / n;
    r.ttft_attainment = ttft_met / n;
    r.itl_attainment = itl_met / n;
    r.ttft_p50_s = Quantile(all_ttft_, 0.5);
    r.ttft_p99_s = Quantile(all_ttft_, 0.99);
    r.itl_p50_s = all_itl_.Quantile(0.5);
    r.itl_p99_s = all_itl_.Quantile(0.99);
    r.tpot_p99_s = Quantile(all_tpot_, 0.99);
    auto hours = [&](const std::vector<Worker>& pool) {
      double h = 0;
      for (const Worker& w : pool) {
        const double end = w.gone ? w.end : span_;
        h += std::max(0.0, std::min(end, span_) - std::min(w.start, span_));
      }
      return h / 3600;
    };
    r.prefill_worker_hours = hours(prefill_);
    r.decode_worker_hours = hours(decode_);
    r.cost_hours = r.prefill_worker_hours * p_.prefill_cost() +
                   r.decode_worker_hours * p_.decode_cost();
    r.peak_prefill = peak_prefill_;
    r.peak_decode = peak_decode_;
    // Attainment of the requests that arrived in each interval.
    std::vector<double> arrived(timeline_.size(), 0), ok(timeline_.size(), 0);
    for (size_t i = 0; i < req_.size(); ++i) {
      const size_t k =
          std::min<size_t>(timeline_.empty() ? 0 : timeline_.size() - 1,
                           size_t(req_[i].arrival_s / o_.interval_s));
      if (k < arrived.size()) {
        arrived[k] += 1;
        ok[k] += state_[i].met;
      }
    }
    for (size_t k = 0; k < timeline_.size(); ++k) {
      timeline_[k].attainment = arrived[k] > 0 ? ok[k] / arrived[k] : 1;
    }
    r.timeline = std::move(timeline_);
    return r;
  }

  const CapacityProfile& p_;
  const std::vector<SimRequest>& req_;
  const SimOptions o_;
  std::vector<RequestState> state_;
  double now_ = 0, span_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<Worker> prefill_, decode_;
  std::vector<int> prefill_active_, decode_active_;
  std::deque<int> prefill_backlog_, decode_backlog_;
  int prefill_configured_ = 0, decode_configured_ = 0;
  int peak_prefill_ = 0, peak_decode_ = 0;
  // This interval's observations.
  int64_t interval_arrivals_ = 0;
  LengthHistogram interval_prompt_, interval_output_;
  std::vector<double> interval_ttft_;
  LogHistogram interval_itl_;
  // The whole run's.
  std::vector<double> all_ttft_, all_tpot_;
  LogHistogram all_itl_;
  std::vector<SimInterval> timeline_;
};

}  // namespace

SimResult Simulate(const CapacityProfile& profile,
                   const std::vector<SimRequest>& requests,
                   const SimOptions& options, const SimPolicy& policy) {
  Sim sim(profile, requests, options);
  return sim.Run(policy);
}

SimPolicy FixedPolicy() {
  return [](const Observation& o) {
    return std::make_pair(o.prefill.configured, o.decode.configured);
  };
}

OracleSchedule MakeOracleSchedule(const CapacityProfile& profile,
                                  const std::vector<SimRequest>& requests,
                                  const SimOptions& options, int max_replicas) {
  double span = 0;
  for (const SimRequest& r : requests) span = std::max(span, r.arrival_s);
  const size_t intervals = size_t(span / options.interval_s) + 1;
  std::vector<LoadEstimate> loads(intervals);
  std::vector<double> counts(intervals, 0);
  for (const SimRequest& r : requests) {
    const size_t k = size_t(r.arrival_s / options.interval_s);
    loads[k].prompt.Add(r.prompt_tokens);
    loads[k].output.Add(r.output_tokens);
    counts[k] += 1;
  }
  OracleSchedule s;
  for (size_t k = 0; k < intervals; ++k) {
    loads[k].request_rate = counts[k] / options.interval_s;
    const int p = SizePrefill(profile, loads[k], options.ttft_target_s,
                              options.quantile, max_replicas)
                      .replicas;
    const int d = SizeDecode(profile, loads[k], options.itl_target_s,
                             options.quantile, max_replicas)
                      .replicas;
    s.need.emplace_back(std::max(1, p), std::max(1, d));
  }
  SimPolicy policy = OraclePolicy(profile, s, options);
  Observation at_zero;
  s.initial = policy(at_zero);
  return s;
}

SimPolicy OraclePolicy(const CapacityProfile& profile,
                       const OracleSchedule& schedule,
                       const SimOptions& options) {
  const int ahead_p =
      int(std::ceil(profile.prefill_load_time_s() / options.interval_s));
  const int ahead_d =
      int(std::ceil(profile.decode_load_time_s() / options.interval_s));
  std::vector<std::pair<int, int>> need = schedule.need;
  const double interval = options.interval_s;
  return [need, ahead_p, ahead_d, interval](const Observation& o) {
    const size_t k = size_t(std::llround(o.time_s / interval));
    int p = 1, d = 1;
    for (size_t j = k; j < need.size() && j <= k + ahead_p; ++j) {
      p = std::max(p, need[j].first);
    }
    for (size_t j = k; j < need.size() && j <= k + ahead_d; ++j) {
      d = std::max(d, need[j].second);
    }
    return std::make_pair(p, d);
  };
}

}  // namespace pdserve::planner
