// The CPU path of a float32 layer call: which build of the fused kernels
// runs its steps (their ISA), what runs its whole-batch GEMMs (the
// kernels' own GEMM or ATen's) and how its threads split a step. The CPU's
// microarchitecture class gives a default (cpu_identity.h); with
// PIPELSTM_CPU_BENCHMARK=1 each class of call shape is timed on every
// candidate path over its first calls and keeps the fastest, as
// torch.backends.cudnn.benchmark does on the GPU.
//
// A call's path is in force on its thread for the whole call (PathScope):
// the kernels' look-ups (step_kernels.h) and the GEMMs read it there. Code
// that hands a call's work to other threads re-installs it on them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pipelstm/kernels/cpu_recurrent.h"

namespace pipelstm {
namespace cpu {

// How the threads of a step share it (fused_loops_cpu.cpp): as the CPU
// class's bounds say, or over blocks of rows, or over panels.
enum class Split { kClass, kRows, kPanels };

struct CpuPath {
  const kernels::cpu::RecurrentKernels* kernels = nullptr;
  bool own_gemm = false;  // whole-batch GEMMs on the kernels' GEMM, else ATen's
  // The forward's input projection inside its steps (fused_loops_cpu.h),
  // not one GEMM before them: a candidate of forward calls only.
  bool input_in_steps = false;
  Split split = Split::kClass;

  // "avx2/own", "avx512/aten", "avx512/in-steps", "avx512/aten/panels", ...
  std::string name() const;
};

// The path of the call running on this thread, null outside one.
const CpuPath* scoped_path();

// Puts `path` in force on this thread until destroyed (null: none).
class PathScope {
 public:
  explicit PathScope(const CpuPath* path);
  ~PathScope();
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  const CpuPath* before_;
};

// The kernels the CPU's class runs best under the ISA cap `cap` (avx512,
// avx2, generic, native). Raises if `cap` names no known ISA.
const kernels::cpu::RecurrentKernels& kernels_for_cap(const std::string& cap);

// The kernels outside a call's path: kernels_for_cap of the ISA cap
// (PIPELSTM_CPU_ISA) read at the first call and kept for the process.
const kernels::cpu::RecurrentKernels& default_kernels();

// Whether the whole-batch GEMMs run on the kernels' GEMM by default with
// these kernels: their vector builds on CPUs that are not Intel's (on
// Intel's, MKL is at its best).
bool own_gemm_by_default(const kernels::cpu::RecurrentKernels& k);

// The facts of a layer call its path is chosen by.
struct CallShape {
  const char* pass = "";  // "forward", "backward" or "backward_data"
  int64_t steps = 0, batch = 0, rows = 0, input = 0, hidden = 0, out = 0;
  int64_t threads = 1;
  // Whether the input projection inside the steps is a candidate (forward
  // calls whose weights and rows allow it: input_in_steps_fit).
  bool in_steps = false;
  // The split of a step's threads that the class's bounds do not pick, where
  // both are possible (row_split_alternative): the default path with it is a
  // candidate too. kClass: only one is possible.
  Split other_split = Split::kClass;
  std::string key() const;
};

// The path a call of this shape runs on, and whether it is a trial to time.
// Null: the default path.
struct PathChoice {
  const CpuPath* path = nullptr;
  bool trial = false;
  std::string key;  // the shape and its candidates (a trial's)
};
PathChoice choose_path(const CallShape& shape);

// A trial's time, at the end of the call it was chosen for.
void record_trial(const PathChoice& trial, double seconds);

// Runs f() on the path for this call: the one in force on this thread (a
// call within a call), else the one chosen for its shape.
template <class F>
auto on_chosen_path(const CallShape& shape, F&& f) {
  if (scoped_path() != nullptr) return f();
  const PathChoice choice = choose_path(shape);
  const PathScope scope(choice.path);
  if (!choice.trial) return f();
  const auto start = std::chrono::steady_clock::now();
  auto result = f();
  record_trial(choice, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return result;
}

// What measurement has chosen so far, for reports (show_config, tests).
struct ChosenPath {
  std::string shape;  // CallShape::key() and the candidates
  std::string path;   // CpuPath::name()
  std::vector<std::pair<std::string, double>> seconds;  // each candidate's best trial
  std::vector<int> trials;  // each candidate's timed calls (fewer where it lost by far)
  bool from_cache = false;  // read from PIPELSTM_CPU_BENCHMARK_CACHE
};
std::vector<ChosenPath> chosen_paths();

// Forgets every choice and trial (tests; a cache file is read again).
void forget_chosen_paths();

}  // namespace cpu
}  // namespace pipelstm
