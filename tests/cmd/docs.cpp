// ctest-label: foundation
// Docs cannot drift: every command block of README.md and docs/*.md marked
// runnable (a fence opening with "```sh runnable") runs with bash in a fresh
// directory, the built `dualpath` first on PATH, and must exit 0. When an
// output block follows it ("```text output"), the command's output must have
// its shape: each line of the block, numbers aside, is a line of the output,
// in order; a line "..." stands for any lines. A block gets PORT, the first
// of three ports unlikely to be in use. A block whose fence also says
// "needs-python-module" runs only where the Python module `dualpath` was built
// (<build>/python/; not in sanitizer builds, nor without pybind11).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <unistd.h>

#include "tests/support/support.hpp"

using dualpath::test::run_process;
using dualpath::test::temp_dir;

namespace {

struct block {
  std::string file;
  int line = 0;
  bool needs_python_module = false;
  std::string script;
  std::vector<std::string> expected; // empty: no output block
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in{text};
  std::string l;
  while (std::getline(in, l))
    out.push_back(l);
  return out;
}

std::vector<block> runnable_blocks(const std::string& path,
                                   const std::string& name) {
  std::ifstream in{path};
  std::string text{std::istreambuf_iterator<char>{in}, {}};
  auto lines = lines_of(text);
  std::vector<block> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("```sh runnable", 0) != 0)
      continue;
    block b;
    b.file = name;
    b.line = static_cast<int>(i + 1);
    b.needs_python_module =
        lines[i].find("needs-python-module") != std::string::npos;
    size_t j = i + 1;
    for (; j < lines.size() && lines[j].rfind("```", 0) != 0; ++j)
      b.script += lines[j] + "\n";
    // An output block right after it (blank lines between allowed).
    size_t k = j + 1;
    while (k < lines.size() && lines[k].empty())
      ++k;
    if (k < lines.size() && lines[k].rfind("```text output", 0) == 0)
      for (++k; k < lines.size() && lines[k].rfind("```", 0) != 0; ++k)
        b.expected.push_back(lines[k]);
    out.push_back(std::move(b));
    i = j;
  }
  return out;
}

// Numbers become '#', runs of blanks one blank: the shape of a line.
std::string shape(const std::string& line) {
  static const std::regex number{R"([-+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?)"};
  static const std::regex blanks{R"([ \t]+)"};
  auto s = std::regex_replace(line, number, "#");
  s = std::regex_replace(s, blanks, " ");
  while (!s.empty() && s.back() == ' ')
    s.pop_back();
  return s;
}

} // namespace

TEST_CASE("every runnable command block of the docs runs and keeps its shape") {
  namespace fs = std::filesystem;
  std::string src = DUALPATH_SOURCE_DIR;
  std::vector<block> blocks = runnable_blocks(src + "/README.md", "README.md");
  std::vector<fs::path> docs;
  for (auto& entry : fs::directory_iterator(src + "/docs"))
    if (entry.path().extension() == ".md")
      docs.push_back(entry.path());
  std::sort(docs.begin(), docs.end());
  for (auto& p : docs) {
    auto more = runnable_blocks(p.string(), "docs/" + p.filename().string());
    blocks.insert(blocks.end(), more.begin(), more.end());
  }
  // The docs have runnable blocks (tuning.md's example at least).
  REQUIRE(!blocks.empty());
  std::string bin = std::string{DUALPATH_BINARY_DIR} + "/bin";
  auto python_module = false;
  auto py_dir = fs::path{DUALPATH_BINARY_DIR} / "python";
  if (fs::is_directory(py_dir))
    for (auto& entry : fs::directory_iterator(py_dir))
      python_module =
          python_module
          || entry.path().filename().string().rfind("dualpath.", 0) == 0;
  for (auto& b : blocks) {
    CAPTURE(b.file);
    CAPTURE(b.line);
    CAPTURE(b.script);
    if (b.needs_python_module && !python_module) {
      MESSAGE(b.file << ":" << b.line
                     << " not run: this build has no Python module in "
                     << py_dir.string());
      continue;
    }
    temp_dir dir;
    // Blocks that start processes on ports take three from PORT: a range
    // unlikely to be taken by a parallel run.
    auto port = 20000 + (static_cast<int>(::getpid()) % 4000) * 3;
    auto res = run_process(
        {"/usr/bin/env", "PATH=" + bin + ":/usr/local/bin:/usr/bin:/bin",
         "PORT=" + std::to_string(port), "/bin/bash", "-euo", "pipefail", "-c",
         "cd '" + dir.path() + "' && " + b.script});
    CAPTURE(res.err);
    CHECK(res.status == 0);
    if (b.expected.empty())
      continue;
    auto got = lines_of(res.out);
    size_t at = 0;
    for (auto& want : b.expected) {
      if (want == "...")
        continue;
      auto target = shape(want);
      while (at < got.size() && shape(got[at]) != target)
        ++at;
      CHECK_MESSAGE(at < got.size(), "no output line has the shape of '"
                                         << want << "':\n"
                                         << res.out);
      if (at == got.size())
        break;
      ++at;
    }
  }
}
