// libFuzzer target: the trace file loader
// (scheduler/workload/trace_file.hpp). Whatever the text, parse_trace
// returns a trace or an error; a trace it accepts writes back to text that
// loads to the same trace.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "scheduler/workload/trace_file.hpp"

using namespace dualpath::scheduler::workload;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string(reinterpret_cast<const char*>(data), size)};
  auto t = parse_trace(in, 1 << 20, "fuzz");
  if (!t)
    return 0;
  std::ostringstream out;
  write_trace(out, *t);
  std::istringstream again{out.str()};
  auto back = parse_trace(again, 1 << 20, "fuzz-again");
  if (!back) // what it wrote itself must load
    __builtin_trap();
  std::ostringstream out2;
  write_trace(out2, *back);
  if (out2.str() != out.str())
    __builtin_trap();
  return 0;
}
