#include "stages.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <utility>

namespace pipelstm::pipeline {

Stages::Stages(std::vector<StageSpec> specs)
    : specs_(std::move(specs)), streams_(std::make_shared<StageStreams>(specs_.size())) {
  TORCH_CHECK(!specs_.empty(), "pipelstm.Pipeline: at least one stage is needed");
  for (size_t s = 0; s < specs_.size(); ++s) {
    const StageSpec& st = specs_[s];
    TORCH_CHECK(!st.units.empty(), "pipelstm.Pipeline: every stage needs at least one unit");
    first_unit_.push_back(num_units());
    for (size_t j = 0; j < st.units.size(); ++j) {
      const UnitSpec& u = st.units[j];
      TORCH_CHECK(!has_loss_, "pipelstm.Pipeline: the loss must be the last unit");
      has_loss_ = unit_kind_is_loss(u.kind);
      unit_at_.emplace_back(static_cast<int64_t>(s), static_cast<int64_t>(j));
      if (unit_kind_has_state(u.kind)) {
        TORCH_CHECK(u.state_index == num_lstm_layers(),
                    "pipelstm.Pipeline: LSTM layers must be numbered in order");
        layer_stage_.push_back(static_cast<int64_t>(s));
      }
    }
  }
}

std::optional<c10::Stream> Stages::stream(int64_t s) const {
  return streams_->get(static_cast<size_t>(s), specs_[s].device);
}

const UnitSpec& Stages::unit(int64_t gu) const {
  const auto& [s, j] = unit_at_[gu];
  return specs_[s].units[j];
}

void Stages::place(int64_t first_stage, int64_t first_unit, std::string process) {
  first_stage_ = first_stage;
  units_before_ = first_unit;
  process_ = std::move(process);
}

std::string Stages::label(int64_t s) const {
  std::ostringstream os;
  os << "stage " << first_stage_ + s << " (" << specs_[s].device;
  if (!process_.empty()) os << ", " << process_;
  os << ")";
  return os.str();
}

}  // namespace pipelstm::pipeline
