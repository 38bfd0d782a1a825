// A pipelstm op as a typed dispatcher handle, for C++ that calls the ops
// through the dispatcher (lstm_ops.cpp, the autograd formulas).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace pipelstm {

// `name` ("pipelstm::lstm_layer_forward") with C++ signature `Signature`;
// throws where no such schema is registered.
template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace pipelstm
