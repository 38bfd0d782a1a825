// Messages from the C++ side for Python's logging.getLogger("pipelstm"):
// the extension module installs a sink at import (module.cpp). Only for
// rare decisions (a CUDA graph captured, or given up on): the sink takes
// the GIL, so it must never be called where a thread holding the GIL waits
// for this one.
#pragma once

#include <string>

namespace pipelstm {

// Python's logging levels.
enum class LogLevel : int { kDebug = 10, kInfo = 20, kWarning = 30 };

using LogSink = void (*)(LogLevel level, const std::string& message);

// Sends `message` to the sink; dropped when none is installed (C++ only).
void log_message(LogLevel level, const std::string& message);

void set_log_sink(LogSink sink);

}  // namespace pipelstm
