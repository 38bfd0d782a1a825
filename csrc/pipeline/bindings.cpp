// pipelstm._C.pipeline: the engine for Python (python/pipelstm/pipeline/core.py).
// Every call that runs the engine releases the GIL: the stage workers never
// need it, and other Python threads keep running meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "engine.h"
#include "fault_hook.h"
#include "items.h"
#include "schedule.h"
#include "units/kinds.h"
#include "units/zoneout_keeps.h"

namespace py = pybind11;

namespace pipelstm::pipeline {

namespace {

// The description of a pipeline: unit kinds, units, stages, remote links.
void bind_specs(py::module_& m) {
  // One value per kind of unit, from the table its files register into
  // (units/kinds.h), and per kind (by its Python name): its parameter
  // slots, its UnitSpec options, whether it carries a recurrent state and
  // whether it is the loss, for pipelstm/pipeline/units.py.
  py::enum_<UnitKind> unit_kind(m, "UnitKind");
  py::dict kinds;
  const auto& table = unit_kinds();
  for (size_t i = 0; i < table.size(); ++i) {
    const UnitKindOps* kind = table[i];
    unit_kind.value(kind->py_name, UnitKind{static_cast<int32_t>(i)});
    py::dict k;
    k["slots"] = py::tuple(py::cast(kind->slots));
    k["options"] = py::tuple(py::cast(kind->options));
    k["has_state"] = kind->has_state;
    k["is_loss"] = kind->is_loss;
    kinds[kind->py_name] = k;
  }
  m.attr("UNIT_KINDS") = kinds;

  // The activations' names, from their table (units/activation.cpp).
  m.attr("ACTIVATIONS") = py::tuple(py::cast(activation_names()));

  py::enum_<Checkpoint>(m, "Checkpoint")
      .value("never", Checkpoint::Never)
      .value("except_last", Checkpoint::ExceptLast)
      .value("always", Checkpoint::Always);

  py::class_<UnitSpec>(m, "UnitSpec")
      .def(py::init([](UnitKind kind, std::string name, int64_t padding_idx,
                       bool scale_grad_by_freq, double p, int64_t state_index,
                       int64_t ignore_index, bool mean, const std::string& activation, double eps,
                       double zoneout_c, double zoneout_h) {
             UnitSpec u;
             u.kind = kind;
             u.name = std::move(name);
             u.padding_idx = padding_idx;
             u.scale_grad_by_freq = scale_grad_by_freq;
             u.p = p;
             u.state_index = state_index;
             u.ignore_index = ignore_index;
             u.mean = mean;
             u.activation = activation_index(activation);
             u.eps = eps;
             u.zoneout_c = zoneout_c;
             u.zoneout_h = zoneout_h;
             return u;
           }),
           py::arg("kind"), py::arg("name"), py::arg("padding_idx") = -1,
           py::arg("scale_grad_by_freq") = false, py::arg("p") = 0.0,
           py::arg("state_index") = -1, py::arg("ignore_index") = -100, py::arg("mean") = true,
           py::arg("activation") = "relu", py::arg("eps") = 1e-5, py::arg("zoneout_c") = 0.0,
           py::arg("zoneout_h") = 0.0)
      .def_readonly("name", &UnitSpec::name);

  py::class_<StageSpec>(m, "StageSpec")
      .def(py::init([](const std::string& device, std::vector<UnitSpec> units, int threads) {
             StageSpec s;
             s.device = c10::Device(device);
             s.units = std::move(units);
             s.threads = threads;
             return s;
           }),
           py::arg("device"), py::arg("units"), py::arg("threads") = 0)
      .def_readonly("units", &StageSpec::units);

  py::class_<RemoteSpec>(m, "RemoteSpec")
      .def(py::init([](std::string group_name, int peer, std::string peer_name) {
             return RemoteSpec{std::move(group_name), peer, std::move(peer_name)};
           }),
           py::arg("group_name"), py::arg("peer"), py::arg("peer_name"));
}

// The engine and one run of it.
void bind_engine(py::module_& m) {
  py::class_<TraceEvent>(m, "TraceEvent")
      .def_readonly("stage", &TraceEvent::stage)
      .def_readonly("phase", &TraceEvent::phase)
      .def_readonly("micro_batch", &TraceEvent::micro_batch)
      .def_readonly("chunk", &TraceEvent::chunk)
      .def_readonly("start_ns", &TraceEvent::start_ns)
      .def_readonly("end_ns", &TraceEvent::end_ns);

  py::class_<Run, std::shared_ptr<Run>>(m, "Run")
      .def(
          "take_outputs",
          [](Run& run) {
            RunOutputs o = run.take_outputs();
            return py::make_tuple(o.output, o.h_n, o.c_n);
          },
          "-> (output, h_n per layer, c_n per layer), once: the run keeps no reference to them")
      .def_property_readonly("saved_bytes", &Run::saved_bytes)
      .def(
          "backward",
          [](Run& run, const OptTensor& grad_output, const std::vector<OptTensor>& grad_h_n,
             const std::vector<OptTensor>& grad_c_n) {
            BackwardResult r;
            {
              py::gil_scoped_release no_gil;
              r = run.backward(grad_output, grad_h_n, grad_c_n);
            }
            return py::make_tuple(r.grad_input, r.grad_h0, r.grad_c0, r.grad_params);
          },
          py::arg("grad_output"), py::arg("grad_h_n"), py::arg("grad_c_n"),
          "-> (grad_input, grad_h0 per layer, grad_c0 per layer, grads per unit)");

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine")
      .def(py::init([](std::vector<StageSpec> stages) {
        return std::make_shared<Engine>(std::move(stages));
      }))
      .def(
          "forward",
          [](Engine& e, const at::Tensor& input, const std::vector<OptTensor>& h0,
             const std::vector<OptTensor>& c0, const std::vector<UnitParams>& params,
             int64_t chunks, int64_t micro_batches, bool training, bool keep_for_backward,
             Checkpoint checkpoint, const OptTensor& target, const OptTensor& batch_sizes,
             std::optional<uint64_t> pass_seed) {
            py::gil_scoped_release no_gil;
            return e.forward(input, h0, c0, params, chunks, micro_batches, training,
                             keep_for_backward, checkpoint, target, batch_sizes, pass_seed);
          },
          py::arg("input"), py::arg("h0"), py::arg("c0"), py::arg("params"), py::arg("chunks"),
          py::arg("micro_batches"), py::arg("training"), py::arg("keep_for_backward"),
          py::arg("checkpoint") = Checkpoint::Never, py::arg("target") = std::nullopt,
          py::arg("batch_sizes") = std::nullopt, py::arg("pass_seed") = std::nullopt)
      .def("connect", &Engine::connect, py::arg("prev"), py::arg("next"), py::arg("timeout_s"),
           py::arg("first_stage"), py::arg("first_unit"), py::arg("process"))
      .def("trace", &Engine::trace)
      .def_property_readonly("num_units", &Engine::num_units)
      .def_property_readonly("num_lstm_layers", &Engine::num_lstm_layers);
}

void bind_schedule(py::module_& m) {
  // The schedule as the simulator plays it (pipelstm/simulator/schedule.py):
  // the engine's own item order, recomputation rule and item sizes.
  auto direction_of = [](const std::string& d) {
    TORCH_CHECK(d == "forward" || d == "backward",
                "pipeline schedule: expected direction 'forward' or 'backward', got '", d, "'");
    return d == "forward" ? Direction::Forward : Direction::Backward;
  };
  m.def(
      "item_order",
      [direction_of](const std::string& direction, int64_t K, int64_t M) {
        TORCH_CHECK(K >= 1 && M >= 1, "item_order: expected K >= 1 and M >= 1, got ", K, ", ", M);
        std::vector<std::pair<int64_t, int64_t>> out;
        for (const Item it : item_order(direction_of(direction), K, M)) out.emplace_back(it.m, it.k);
        return out;
      },
      py::arg("direction"), py::arg("K"), py::arg("M"),
      "-> [(m, k)]: the items of a pass in the order every stage runs them (schedule.h)");
  m.def(
      "recomputes",
      [](Checkpoint policy, int64_t micro_batch, int64_t chunk, int64_t K, int64_t M) {
        return recomputes(policy, Item{micro_batch, chunk}, K, M);
      },
      py::arg("checkpoint"), py::arg("micro_batch"), py::arg("chunk"), py::arg("K"), py::arg("M"),
      "Whether item (m, k) is replayed before its backward under `checkpoint` (schedule.h)");
  m.def(
      "ends_recurrence",
      [direction_of](const std::string& direction, int64_t micro_batch, int64_t chunk, int64_t K) {
        return ends_recurrence(direction_of(direction), Item{micro_batch, chunk}, K);
      },
      py::arg("direction"), py::arg("micro_batch"), py::arg("chunk"), py::arg("K"),
      "Whether micro-batch m's recurrence ends at item (m, k) in this pass (schedule.h)");
  m.def(
      "item_grid",
      [](int64_t T, int64_t B, int64_t chunks, int64_t micro_batches) {
        TORCH_CHECK(T >= 1 && B >= 1 && chunks >= 1 && micro_batches >= 1,
                    "item_grid: expected T, B, chunks, micro_batches >= 1");
        const ItemGrid g(T, B, chunks, micro_batches);
        return py::make_tuple(g.K, g.M, g.t_sizes, g.b_sizes);
      },
      py::arg("T"), py::arg("B"), py::arg("chunks"), py::arg("micro_batches"),
      "-> (K, M, t_sizes, b_sizes): how a pass cuts [T, B] into items (items.h)");
  m.def(
      "packed_item_grid",
      [](const Tensor& batch_sizes, int64_t chunks, int64_t micro_batches) {
        TORCH_CHECK(batch_sizes.dim() == 1 && batch_sizes.numel() >= 1 && chunks >= 1 && micro_batches >= 1,
                    "packed_item_grid: expected 1-D batch_sizes and chunks, micro_batches >= 1");
        const ItemGrid g = ItemGrid::packed_grid(batch_sizes.to(at::kLong), chunks, micro_batches);
        return py::make_tuple(g.K, g.M, g.t_sizes, g.b_sizes);
      },
      py::arg("batch_sizes"), py::arg("chunks"), py::arg("micro_batches"),
      "-> (K, M, t_sizes, b_sizes): how a pass cuts a packed batch into items, its steps by tokens (items.h)");

  m.def("join_runs", &join_runs, py::arg("rows"),
        "-> [(begin, end)]: the runs of chunks an LSTM unit's weight task joins, from each chunk's rows "
        "(-1: none) (items.h)");
  m.attr("JOIN_ROWS") = kJoinRows;

  m.def("draw_pass_seed", &draw_pass_seed,
        "-> a training pass's seed: one draw from the default CPU generator, as every pass takes it (units.h)");
  m.def("dropout_seed", &dropout_seed, py::arg("pass_seed"), py::arg("unit"), py::arg("micro_batch"),
        py::arg("chunk"),
        "-> the seed of unit `unit`'s masks for item (micro_batch, chunk) of a pass (units.h); -1 for both: "
        "the unit's once a pass (its weight masks)");
  m.def(
      "zoneout_masks",
      [](uint64_t pass_seed, int64_t unit, int64_t micro_batch, int64_t chunk, int64_t rows, int64_t H,
         double p_c, double p_h, const Tensor& like) {
        auto [keep_c, keep_h] =
            zoneout_masks(dropout_seed(pass_seed, unit, micro_batch, chunk), rows, H, p_c, p_h, like);
        return py::make_tuple(keep_c, keep_h);
      },
      py::arg("pass_seed"), py::arg("unit"), py::arg("micro_batch"), py::arg("chunk"), py::arg("rows"),
      py::arg("H"), py::arg("p_c"), py::arg("p_h"), py::arg("like"),
      "-> (keep_c, keep_h), each [rows, H]: the zoneout masks LSTM unit `unit` draws for item (m, k) of "
      "a pass (units/zoneout_keeps.h)");
}

void bind_testing(py::module_& m) {
  // Make unit `unit` (global index in its engine) of every engine
  // in this process raise in `phase` ("forward" or "backward") at (m, k).
  m.def(
      "inject_fault",
      [](int64_t unit, const std::string& phase, int64_t micro_batch, int64_t chunk) {
        testing::inject_fault(unit, phase.c_str(), micro_batch, chunk);
      },
      py::arg("unit"), py::arg("phase"), py::arg("micro_batch"), py::arg("chunk"));
  m.def("clear_faults", &testing::clear_faults);
}

}  // namespace

void init_bindings(py::module_& parent) {
  auto m = parent.def_submodule("pipeline", "The pipeline engine (see pipelstm.Pipeline).");
  bind_specs(m);
  bind_engine(m);
  bind_schedule(m);
  bind_testing(m);
}

}  // namespace pipelstm::pipeline
