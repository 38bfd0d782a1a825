#include "cpu_path.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "../log_sink.h"
#include "../settings.h"
#include "cpu_identity.h"

namespace pipelstm {
namespace cpu {

namespace k = pipelstm::kernels::cpu;

namespace {

thread_local const CpuPath* t_path = nullptr;

// Timed calls per candidate path, after one untimed call of the shape (its
// first: buffers mapped, pages touched); the best of them counts. A
// candidate whose first trial took over kDropAbove times the best first
// trial is not tried again: it cannot win, and each of its trials costs a
// training run that much more (an avx2 build on an AVX-512 CPU).
constexpr int kTrials = 2;
constexpr double kDropAbove = 1.25;

// Every path a call may take here: each vector build the CPU runs, with
// each GEMM and with the forward's input projection in its steps (which
// leaves a forward no whole-batch GEMM: its GEMM is the default's), each
// of those also with the threads' split forced either way, then the
// portable build. Built once; their addresses are their identities.
const std::vector<CpuPath>& all_paths() {
  static const std::vector<CpuPath> paths = [] {
    std::vector<CpuPath> v;
    for (const char* isa : {"avx512", "avx2"}) {
      if (const k::RecurrentKernels* r = k::recurrent_kernels_for(isa)) {
        for (const Split split : {Split::kClass, Split::kRows, Split::kPanels}) {
          v.push_back({r, true, false, split});
          v.push_back({r, false, false, split});
          v.push_back({r, own_gemm_by_default(*r), true, split});
        }
      }
    }
    v.push_back({k::recurrent_kernels_for("generic"), false, false});  // under a generic cap
    return v;
  }();
  return paths;
}

int isa_rank(const char* isa) {
  return std::strcmp(isa, "avx512") == 0 ? 2 : std::strcmp(isa, "avx2") == 0 ? 1 : 0;
}

// The candidates of a call now: no wider than the ISA cap, with the GEMM
// the PIPELSTM_CPU_GEMM switch names if it names one, and the input
// projection in the steps where the call allows it and no
// PIPELSTM_INPUT_IN_STEPS forces it either way. A narrower vector build
// than the widest is a candidate only on a CPU whose FMA units are
// narrower than 512 bits (Zen 4 runs AVX-512 as two halves): on a
// full-width one it has half the FMA rate, and its trials only cost time.
// Where a step's threads may split rows or panels and PIPELSTM_ROW_SPLIT
// forces neither, the widest build with its default GEMM and the split the
// class's bounds do not pick is one more.
std::vector<const CpuPath*> candidates(const CallShape& shape) {
  const int widest = isa_rank(default_kernels().isa);
  const bool full_width = cpu_identity().vector_datapath_bits >= 512;
  const std::string gemm = settings::cpu_gemm();
  const bool in_steps = shape.in_steps && !settings::input_in_steps().has_value();
  const bool other_split = shape.other_split != Split::kClass && !settings::row_split().has_value();
  const bool own_by_default = gemm == "auto" ? own_gemm_by_default(default_kernels()) : gemm == "own";
  std::vector<const CpuPath*> out;
  for (const CpuPath& p : all_paths()) {
    if (p.split != Split::kClass) {
      if (other_split && p.split == shape.other_split && p.kernels == &default_kernels() &&
          !p.input_in_steps && p.own_gemm == own_by_default) {
        out.push_back(&p);
      }
      continue;
    }
    const int rank = isa_rank(p.kernels->isa);
    if (rank > widest || (rank == 0 && widest > 0)) continue;  // the portable build: only as the cap
    if (rank < widest && full_width) continue;  // rank > 0 here: the avx2 build under an avx512 one
    const bool gemm_named = gemm != "auto" && rank > 0;
    if (p.input_in_steps ? !in_steps : gemm_named && p.own_gemm != (gemm == "own")) continue;
    out.push_back(&p);
  }
  return out;
}

struct Trials {
  std::vector<const CpuPath*> paths;
  std::vector<double> best;
  std::vector<int> runs;
  int calls = 0;
  const CpuPath* winner = nullptr;
  bool from_cache = false;

  // Whether candidate i needs no more trials: it has them all, or its one
  // trial lost by too much once every candidate has one.
  bool settled(size_t i) const {
    if (runs[i] >= kTrials) return true;
    if (runs[i] == 0 || *std::min_element(runs.begin(), runs.end()) == 0) return false;
    return best[i] > kDropAbove * *std::min_element(best.begin(), best.end());
  }
  // The next candidate to try (the first of the fewest trials among the
  // unsettled), or npos when every one is settled.
  size_t next() const {
    size_t pick = std::string::npos;
    for (size_t i = 0; i < paths.size(); ++i) {
      if (!settled(i) && (pick == std::string::npos || runs[i] < runs[pick])) pick = i;
    }
    return pick;
  }
};

struct Chooser {
  std::mutex mutex;
  std::map<std::string, Trials> shapes;
  bool cache_read = false;
  std::string cache_path;
};

Chooser& chooser() {
  static auto* c = new Chooser();  // never destroyed: calls may run until the process ends
  return *c;
}

std::string candidates_key(const std::vector<const CpuPath*>& paths) {
  std::string s;
  for (const CpuPath* p : paths) s += (s.empty() ? "" : ",") + p->name();
  return s;
}

const CpuPath* path_named(const std::vector<const CpuPath*>& paths, const std::string& name) {
  for (const CpuPath* p : paths) {
    if (p->name() == name) return p;
  }
  return nullptr;
}

// The cache file's lines: microarchitecture TAB shape TAB path. Lines of
// another CPU class, or naming a path not among a shape's candidates, are
// passed over.
void read_cache(Chooser& c) {
  const std::string path = settings::cpu_benchmark_cache();
  if (c.cache_read && path == c.cache_path) return;
  c.cache_read = true;
  c.cache_path = path;
  if (path.empty()) return;
  std::ifstream in(path);
  std::string line;
  const std::string& cls = cpu_identity().microarchitecture;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string microarchitecture, shape, name;
    if (!std::getline(fields, microarchitecture, '\t') || !std::getline(fields, shape, '\t') ||
        !std::getline(fields, name) || microarchitecture != cls) {
      continue;
    }
    c.shapes[shape].from_cache = true;
    c.shapes[shape].paths.clear();
    c.shapes[shape].winner = nullptr;
    for (const CpuPath& p : all_paths()) {
      if (p.name() == name) c.shapes[shape].winner = &p;
    }
  }
}

void append_to_cache(const std::string& file, const std::string& shape, const CpuPath& winner) {
  if (file.empty()) return;
  std::ofstream out(file, std::ios::app);
  out << cpu_identity().microarchitecture << '\t' << shape << '\t' << winner.name() << '\n';
  if (!out) {
    log_message(LogLevel::kWarning, "pipelstm: could not append to PIPELSTM_CPU_BENCHMARK_CACHE=" + file);
  }
}

std::string seconds_text(const Trials& t) {
  std::ostringstream s;
  for (size_t i = 0; i < t.paths.size(); ++i) {
    s << (i ? ", " : "") << t.paths[i]->name() << " " << t.best[i] * 1e3 << " ms";
  }
  return s.str();
}

}  // namespace

std::string CpuPath::name() const {
  return std::string(kernels->isa) + (input_in_steps ? "/in-steps" : own_gemm ? "/own" : "/aten") +
         (split == Split::kRows ? "/rows" : split == Split::kPanels ? "/panels" : "");
}

const CpuPath* scoped_path() { return t_path; }

PathScope::PathScope(const CpuPath* path) : before_(t_path) { t_path = path; }

PathScope::~PathScope() { t_path = before_; }

// The widest build under the cap: what each class measured is in
// docs/cpu.md, "The CPU's class".
const k::RecurrentKernels& kernels_for_cap(const std::string& cap) {
  std::string error;
  const k::RecurrentKernels* r = k::widest_kernels(cap, &error);
  TORCH_CHECK(r != nullptr, "pipelstm: ", error);
  return *r;
}

const k::RecurrentKernels& default_kernels() {
  static const k::RecurrentKernels& chosen = kernels_for_cap(settings::freeze_cpu_isa());
  return chosen;
}

bool own_gemm_by_default(const k::RecurrentKernels& r) {
  return isa_rank(r.isa) > 0 && cpu_identity().vendor != "Intel";
}

std::string CallShape::key() const {
  std::ostringstream s;
  s << pass << " T=" << steps << " B=" << batch << " rows=" << rows << " I=" << input << " H=" << hidden
    << " P=" << out << " threads=" << threads;
  return s.str();
}

PathChoice choose_path(const CallShape& shape) {
  if (!settings::cpu_benchmark()) return {};
  const std::vector<const CpuPath*> paths = candidates(shape);
  if (paths.size() == 1) return {paths[0], false, {}};
  const std::string key = shape.key() + " paths=" + candidates_key(paths);
  Chooser& c = chooser();
  std::lock_guard<std::mutex> lock(c.mutex);
  read_cache(c);
  Trials& t = c.shapes[key];
  if (t.winner != nullptr) return {t.winner, false, {}};
  if (t.paths.empty()) {
    t.paths = paths;
    t.best.assign(paths.size(), std::numeric_limits<double>::infinity());
    t.runs.assign(paths.size(), 0);
  }
  // The first call warms up, untimed, on the default path.
  if (t.calls++ == 0) return {};
  const size_t next = t.next();
  // Every candidate settled, the last trial not yet recorded (another thread's): the default path.
  if (next == std::string::npos) return {};
  return {t.paths[next], true, key};
}

void record_trial(const PathChoice& trial, double seconds) {
  std::string chosen;
  {
    Chooser& c = chooser();
    std::lock_guard<std::mutex> lock(c.mutex);
    const auto found = c.shapes.find(trial.key);
    if (found == c.shapes.end()) return;  // forgotten meanwhile
    Trials& t = found->second;
    const auto it = std::find(t.paths.begin(), t.paths.end(), trial.path);
    if (t.winner != nullptr || it == t.paths.end()) return;
    const size_t i = it - t.paths.begin();
    t.best[i] = std::min(t.best[i], seconds);
    ++t.runs[i];
    if (t.next() != std::string::npos) return;
    t.winner = t.paths[std::min_element(t.best.begin(), t.best.end()) - t.best.begin()];
    append_to_cache(c.cache_path, trial.key, *t.winner);
    chosen = "CPU path for " + trial.key + ": " + t.winner->name() + " (best trials: " + seconds_text(t) + ")";
  }
  log_message(LogLevel::kInfo, chosen);  // outside the lock: the sink takes the GIL
}

std::vector<ChosenPath> chosen_paths() {
  Chooser& c = chooser();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<ChosenPath> out;
  for (const auto& [key, t] : c.shapes) {
    if (t.winner == nullptr) continue;
    ChosenPath p{key, t.winner->name(), {}, {}, t.from_cache};
    for (size_t i = 0; i < t.paths.size(); ++i) {
      p.seconds.emplace_back(t.paths[i]->name(), t.best[i]);
      p.trials.push_back(t.runs[i]);
    }
    out.push_back(std::move(p));
  }
  return out;
}

void forget_chosen_paths() {
  Chooser& c = chooser();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.shapes.clear();
  c.cache_read = false;
}

}  // namespace cpu
}  // namespace pipelstm
