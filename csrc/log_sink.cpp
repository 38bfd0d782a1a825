#include "log_sink.h"

#include <atomic>

namespace pipelstm {
namespace {

std::atomic<LogSink> sink{nullptr};

}  // namespace

void log_message(LogLevel level, const std::string& message) {
  if (const LogSink s = sink.load()) s(level, message);
}

void set_log_sink(LogSink s) { sink.store(s); }

}  // namespace pipelstm
