#include "settings.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace pipelstm {
namespace settings {
namespace {

using Canonical = std::optional<std::string> (*)(const std::string& raw);

struct Switch {
  const char* name;           // its environment variable
  const char* default_value;  // canonical
  const char* allowed;        // completes "... is not <allowed>"
  Canonical canonical;        // the canonical spelling of a value, nullopt if not one it takes
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool digits(const std::string& s, size_t max_length) {
  return !s.empty() && s.size() <= max_length &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string without_leading_zeros(const std::string& s) {
  const size_t first = s.find_first_not_of('0');
  return first == std::string::npos ? "0" : s.substr(first);
}

std::optional<std::string> one_of(const std::string& raw, std::initializer_list<const char*> values) {
  const std::string v = lower(raw);
  for (const char* ok : values) {
    if (v == ok) return v;
  }
  return std::nullopt;
}

std::optional<std::string> isa(const std::string& raw) {
  return one_of(raw, {"native", "avx512", "avx2", "generic"});
}
std::optional<std::string> gemm(const std::string& raw) { return one_of(raw, {"auto", "own", "aten"}); }
std::optional<std::string> on_off_auto(const std::string& raw) { return one_of(raw, {"0", "1", "auto"}); }
std::optional<std::string> on_off(const std::string& raw) { return one_of(raw, {"0", "1"}); }
std::optional<std::string> any_text(const std::string& raw) { return raw; }
std::optional<std::string> persistent_kernel(const std::string& raw) {
  return one_of(raw, {"grid", "cluster", "cluster_async"});
}

// MiB: up to 2^40 (12 digits), far past any machine, short of overflowing bytes.
std::optional<std::string> mebibytes(const std::string& raw) {
  if (!digits(raw, 12)) return std::nullopt;
  return without_leading_zeros(raw);
}

// A whole number of time chunks up to 4096: its digits without leading
// zeros, and its value.
std::optional<std::pair<std::string, int>> time_chunks(const std::string& raw) {
  if (!digits(raw, 4)) return std::nullopt;
  const std::string v = without_leading_zeros(raw);
  const int n = std::stoi(v);
  if (n > 4096) return std::nullopt;
  return std::pair{v, n};
}

// A chunk count: 0 (off) or 2..4096.
std::optional<std::string> chunk_count(const std::string& raw) {
  const auto c = time_chunks(raw);
  if (!c || c->second == 1) return std::nullopt;
  return c->first;
}

// The stack graph's time chunks: 0 (off), 1 (the layers one after
// another) or 2..4096 (a wavefront of that many).
std::optional<std::string> stack_chunks(const std::string& raw) {
  const auto c = time_chunks(raw);
  if (!c) return std::nullopt;
  return c->first;
}

std::optional<std::string> microseconds_or_off(const std::string& raw) {
  if (lower(raw) == "off") return std::string("off");
  if (!digits(raw, 12)) return std::nullopt;
  return without_leading_zeros(raw);
}

enum Index { kCpuIsa, kCpuGemm, kCpuBenchmark, kCpuBenchmarkCache, kBufferCacheMb, kCudaGraphs, kPersistent, kPersistentKernel, kLayerWavefront,
             kStackGraph, kSplitDepth, kRowSplit, kInputInSteps, kHostCopyStream, kCount };

constexpr std::array<Switch, kCount> kSwitches{{
    {"PIPELSTM_CPU_ISA", "native",
     "one of avx512, avx2, generic (or native, the default: the widest this CPU runs)", &isa},
    {"PIPELSTM_CPU_GEMM", "auto", "one of aten, own, auto (the default)", &gemm},
    {"PIPELSTM_CPU_BENCHMARK", "0",
     "one of 0 (the default: the CPU's default path), 1 (each call shape's path chosen by timing)", &on_off},
    {"PIPELSTM_CPU_BENCHMARK_CACHE", "", "a file path, or empty (the default: no file)", &any_text},
    {"PIPELSTM_BUFFER_CACHE_MB", "1024",
     "a whole number of MiB, 0 or more (the default 1024; 0 keeps no freed buffer)", &mebibytes},
    {"PIPELSTM_CUDA_GRAPHS", "auto",
     "one of 0 (never), 1 (every call), auto (the default: where the launches set the time)",
     &on_off_auto},
    {"PIPELSTM_PERSISTENT", "auto",
     "one of 0 (never), 1 (wherever it fits), auto (the default: where it was measured faster)",
     &on_off_auto},
    {"PIPELSTM_PERSISTENT_KERNEL", "grid",
     "one of grid (the default: over the whole GPU), cluster, cluster_async (one thread-block cluster, "
     "Hopper; the grid kernel where it does not fit)",
     &persistent_kernel},
    {"PIPELSTM_LAYER_WAVEFRONT", "0",
     "a whole number of time chunks: 0 (the default: off) or 2 to 4096", &chunk_count},
    {"PIPELSTM_STACK_GRAPH", "0",
     "a whole number of time chunks: 0 (the default: off), 1 (the layers one after another) or 2 to "
     "4096 (a wavefront)",
     &stack_chunks},
    {"PIPELSTM_SPLIT_DEPTH", "auto", "one of 0 (never), 1 (always), auto (the default)", &on_off_auto},
    {"PIPELSTM_ROW_SPLIT", "auto", "one of 0 (never), 1 (always), auto (the default)", &on_off_auto},
    {"PIPELSTM_INPUT_IN_STEPS", "auto", "one of 0 (never), 1 (always), auto (the default)", &on_off_auto},
    {"PIPELSTM_HOST_COPY_STREAM", "off", "a number of microseconds (0 or more), or off (the default)",
     &microseconds_or_off},
}};

// Values set from Python. `overridden` is read on every look-up without the
// lock: most processes never set one.
struct Overrides {
  std::mutex mutex;
  std::array<std::atomic<bool>, kCount> overridden{};
  std::array<std::optional<std::string>, kCount> values;
  std::optional<Reading> frozen_isa;  // PIPELSTM_CPU_ISA once read for good
};

Overrides& overrides() {
  static auto* o = new Overrides();  // never destroyed: read until the process ends
  return *o;
}

Index index_of(const std::string& name) {
  int i = 0;
  while (i < kCount && name != kSwitches[i].name) ++i;
  if (i == kCount) {
    std::string known;
    for (const auto& s : kSwitches) known += (known.empty() ? "" : ", ") + std::string(s.name);
    TORCH_CHECK_VALUE(false, "pipelstm: no switch named '", name, "'; the switches are ", known);
  }
  return static_cast<Index>(i);
}

// The variable (checked), else the default.
Reading from_environment(Index i) {
  const Switch& s = kSwitches[i];
  const char* env = std::getenv(s.name);
  if (env != nullptr && *env != '\0') {
    const std::optional<std::string> v = s.canonical(env);
    TORCH_CHECK(v.has_value(), "pipelstm: ", s.name, "=", env, " is not ", s.allowed);
    return {*v, Source::kEnvironment};
  }
  return {s.default_value, Source::kDefault};
}

// The value from Python, else the variable, else the default.
Reading lookup(Index i) {
  Overrides& o = overrides();
  if (o.overridden[i].load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(o.mutex);
    if (o.values[i].has_value()) return {*o.values[i], Source::kPython};
  }
  return from_environment(i);
}

std::optional<bool> tristate(Index i) {
  const std::string v = lookup(i).value;
  if (v == "auto") return std::nullopt;
  return v == "1";
}

Reading isa_reading() {
  Overrides& o = overrides();
  {
    std::lock_guard<std::mutex> lock(o.mutex);
    if (o.frozen_isa.has_value()) return *o.frozen_isa;
  }
  return lookup(kCpuIsa);
}

}  // namespace

const std::vector<std::string>& names() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v;
    for (const auto& s : kSwitches) v.emplace_back(s.name);
    return v;
  }();
  return all;
}

Reading read(const std::string& name) {
  const Index i = index_of(name);
  return i == kCpuIsa ? isa_reading() : lookup(i);
}

std::string allowed(const std::string& name) { return kSwitches[index_of(name)].allowed; }

void set(const std::string& name, const std::optional<std::string>& value) {
  const Index i = index_of(name);
  const Switch& s = kSwitches[i];
  std::optional<std::string> v;
  if (value.has_value()) {
    v = s.canonical(*value);
    TORCH_CHECK_VALUE(v.has_value(), "pipelstm: cannot set ", s.name, " to '", *value, "': it takes ", s.allowed);
  }
  Overrides& o = overrides();
  std::lock_guard<std::mutex> lock(o.mutex);
  if (i == kCpuIsa && o.frozen_isa.has_value()) {
    // What the switch would read after the change (the variable may be bad:
    // then nothing changes, and nothing is raised for it here).
    std::optional<std::string> after = v;
    if (!after.has_value()) {
      const char* env = std::getenv(s.name);
      after = env != nullptr && *env != '\0' ? s.canonical(env) : std::optional<std::string>(s.default_value);
    }
    TORCH_CHECK(!after.has_value() || *after == o.frozen_isa->value, "pipelstm: ", s.name,
                " is read once, by the first call that runs the CPU kernels, and was '",
                o.frozen_isa->value, "'; it cannot change in this process (set it before the first "
                "call, or set the variable for a new process)");
  }
  o.values[i] = v;
  o.overridden[i].store(v.has_value(), std::memory_order_release);
}

std::string cpu_isa() { return isa_reading().value; }

std::string freeze_cpu_isa() {
  Overrides& o = overrides();
  // Under the lock throughout: a value set from Python meanwhile is either
  // the one kept, or refused by set().
  std::lock_guard<std::mutex> lock(o.mutex);
  if (!o.frozen_isa.has_value()) {
    o.frozen_isa = o.values[kCpuIsa].has_value() ? Reading{*o.values[kCpuIsa], Source::kPython}
                                                 : from_environment(kCpuIsa);  // raises on a bad variable: nothing kept
  }
  return o.frozen_isa->value;
}

bool cpu_isa_frozen() {
  Overrides& o = overrides();
  std::lock_guard<std::mutex> lock(o.mutex);
  return o.frozen_isa.has_value();
}

std::string cpu_gemm() { return lookup(kCpuGemm).value; }

bool cpu_benchmark() { return lookup(kCpuBenchmark).value == "1"; }

std::string cpu_benchmark_cache() { return lookup(kCpuBenchmarkCache).value; }

size_t buffer_cache_bytes() { return static_cast<size_t>(std::stoull(lookup(kBufferCacheMb).value)) << 20; }

size_t buffer_cache_bytes_or_none() noexcept {
  try {
    return buffer_cache_bytes();
  } catch (...) {
    return 0;
  }
}

std::optional<bool> cuda_graphs() { return tristate(kCudaGraphs); }

std::optional<bool> persistent() { return tristate(kPersistent); }

std::string persistent_kernel() { return lookup(kPersistentKernel).value; }

std::optional<bool> split_depth() { return tristate(kSplitDepth); }
std::optional<bool> row_split() { return tristate(kRowSplit); }
std::optional<bool> input_in_steps() { return tristate(kInputInSteps); }

std::optional<std::chrono::microseconds> host_copy_stream() {
  const std::string v = lookup(kHostCopyStream).value;
  if (v == "off") return std::nullopt;
  return std::chrono::microseconds(std::stoll(v));
}

}  // namespace settings
}  // namespace pipelstm
