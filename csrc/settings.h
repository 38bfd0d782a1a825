// The run-time switches (docs/configuration.md): each is a value set from
// Python (pipelstm.backends), else its environment variable, else its
// default. The variable is read at each look-up, so a process that changes
// its environment (a test's monkeypatch) sees the change at the next call,
// as before there was a Python API; a value set from Python wins over it
// until it is cleared.
//
// Every value is checked where it is read (the variable) or set (Python):
// a bad one raises, naming the switch and the values it takes.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace pipelstm {
namespace settings {

// Where a switch's value came from.
enum class Source { kDefault, kEnvironment, kPython };

// A switch's value, in its canonical spelling, and where it came from.
struct Reading {
  std::string value;
  Source source;
};

// The names of every switch (their environment variables), in the order
// docs/configuration.md lists them.
const std::vector<std::string>& names();

// The value of switch `name`. Raises if `name` is no switch, or its value
// is not one it takes.
Reading read(const std::string& name);

// Sets switch `name` from Python (nullopt: clears that, so the variable or
// the default applies again). Raises if `name` is no switch, the value is
// not one it takes, or the switch is read once and was (PIPELSTM_CPU_ISA)
// and the change would give it another value.
void set(const std::string& name, const std::optional<std::string>& value);

// A sentence on the values switch `name` takes (docs, errors).
std::string allowed(const std::string& name);

// The typed look-ups of the code that acts on them. std::optional<bool>:
// nullopt when the library decides (the switch is `auto`).

// PIPELSTM_CPU_ISA: the widest ISA the CPU kernels may use (avx512, avx2,
// generic, or native: no cap). The kernels pack weights in the layout of
// their ISA, so the cap is read once, by the first call that needs them:
// freeze_cpu_isa() reads it and keeps it for the rest of the process;
// cpu_isa() reads it without keeping it (what the first call would take).
std::string cpu_isa();
std::string freeze_cpu_isa();
bool cpu_isa_frozen();

// PIPELSTM_CPU_GEMM: "auto", "own" or "aten".
std::string cpu_gemm();

// PIPELSTM_CPU_BENCHMARK: each float32 call shape's CPU path chosen by
// timing its first calls (cpu/cpu_path.h); PIPELSTM_CPU_BENCHMARK_CACHE: a
// file that keeps those choices between processes (empty: none).
bool cpu_benchmark();
std::string cpu_benchmark_cache();

// PIPELSTM_BUFFER_CACHE_MB in bytes: at most this much of freed buffers is
// kept. buffer_cache_bytes_or_none() never raises (a free cannot): a bad
// value keeps none.
size_t buffer_cache_bytes();
size_t buffer_cache_bytes_or_none() noexcept;

// PIPELSTM_CUDA_GRAPHS: graph every layer op's call (true), none (false).
std::optional<bool> cuda_graphs();

// PIPELSTM_PERSISTENT: the persistent recurrent kernels wherever they fit
// (true), never (false), or where they pay (nullopt: the layer op decides).
std::optional<bool> persistent();

// PIPELSTM_PERSISTENT_KERNEL: which persistent kernels run where the
// persistent kernels do: "grid" (over the whole GPU), "cluster" or
// "cluster_async" (one thread-block cluster on Hopper, the forward's steps
// separated by a cluster barrier or by st.async stores; the grid kernel
// where the cluster does not fit).
std::string persistent_kernel();

// Measurement and test knobs (environment only in the Python API's public
// part): the depth split of a weight gradient's GEMM, the row split of
// the time loops, the input projection inside the steps, and the delay of
// the CPU's stand-in for a copy stream (nullopt: off).
std::optional<bool> split_depth();
std::optional<bool> row_split();
std::optional<bool> input_in_steps();
std::optional<std::chrono::microseconds> host_copy_stream();

}  // namespace settings
}  // namespace pipelstm
