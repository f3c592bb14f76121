// ctest-label: run
// ctest-links: ZLIB::ZLIB
// --plot-dir of `dualpath sim` and `dualpath run` as real processes: every
// plot renders into a directory whose name has a quote and a space (gnuplot
// runs without a shell), every PNG decodes (signature, IHDR, IDAT inflated and
// unfiltered) and shows coloured data, not just axes; two modes' plots differ;
// the storage-NIC plot of a mode that reads nothing is still drawn.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>

#include <zlib.h>

#include "tests/support/support.hpp"

using dualpath::test::dualpath_binary;
using dualpath::test::run_process;
using dualpath::test::temp_dir;

namespace {

struct image {
  uint32_t width = 0;
  uint32_t height = 0;
  std::vector<std::array<uint8_t, 3>> rgb; // row-major
  std::string error;                       // "" when it decoded
};

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24)
         | (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16)
         | (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8)
         | uint32_t{static_cast<uint8_t>(s[at + 3])};
}

uint8_t paeth(int a, int b, int c) {
  auto p = a + b - c;
  auto pa = std::abs(p - a);
  auto pb = std::abs(p - b);
  auto pc = std::abs(p - c);
  if (pa <= pb && pa <= pc)
    return static_cast<uint8_t>(a);
  return static_cast<uint8_t>(pb <= pc ? b : c);
}

// Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what pngcairo writes),
// checking every chunk's CRC.
image decode_png(const std::string& path) {
  image img;
  std::ifstream in{path, std::ios::binary};
  std::string data{std::istreambuf_iterator<char>{in}, {}};
  if (data.size() < 8 || data.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    img.error = "no PNG signature";
    return img;
  }
  std::string idat;
  uint8_t depth = 0;
  uint8_t colour = 0;
  uint8_t interlace = 0;
  bool ended = false;
  for (size_t at = 8; at + 12 <= data.size() && !ended;) {
    auto len = be32(data, at);
    if (at + 12 + len > data.size()) {
      img.error = "truncated chunk";
      return img;
    }
    auto type = data.substr(at + 4, 4);
    auto crc =
        crc32(0, reinterpret_cast<const Bytef*>(data.data() + at + 4), len + 4);
    if (crc != be32(data, at + 8 + len)) {
      img.error = "bad CRC in " + type;
      return img;
    }
    auto body = data.substr(at + 8, len);
    if (type == "IHDR") {
      img.width = be32(body, 0);
      img.height = be32(body, 4);
      depth = static_cast<uint8_t>(body[8]);
      colour = static_cast<uint8_t>(body[9]);
      interlace = static_cast<uint8_t>(body[12]);
    } else if (type == "IDAT") {
      idat += body;
    } else if (type == "IEND") {
      ended = true;
    }
    at += 12 + len;
  }
  if (!ended || img.width == 0 || img.height == 0 || depth != 8
      || (colour != 2 && colour != 6) || interlace != 0) {
    img.error = "unexpected PNG layout";
    return img;
  }
  size_t bpp = colour == 6 ? 4 : 3;
  size_t stride = img.width * bpp;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len,
                 reinterpret_cast<const Bytef*>(idat.data()), idat.size())
          != Z_OK
      || raw_len != raw.size()) {
    img.error = "IDAT does not inflate to the image's size";
    return img;
  }
  std::vector<uint8_t> prev(stride, 0);
  std::vector<uint8_t> row(stride);
  for (uint32_t y = 0; y < img.height; ++y) {
    auto* line = raw.data() + y * (stride + 1);
    auto filter = line[0];
    for (size_t x = 0; x < stride; ++x) {
      int a = x >= bpp ? row[x - bpp] : 0;
      int b = prev[x];
      int c = x >= bpp ? prev[x - bpp] : 0;
      int v = line[1 + x];
      switch (filter) {
        case 0:
          break;
        case 1:
          v += a;
          break;
        case 2:
          v += b;
          break;
        case 3:
          v += (a + b) / 2;
          break;
        case 4:
          v += paeth(a, b, c);
          break;
        default:
          img.error = "bad filter type";
          return img;
      }
      row[x] = static_cast<uint8_t>(v);
    }
    for (uint32_t x = 0; x < img.width; ++x)
      img.rgb.push_back({row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]});
    prev = row;
  }
  return img;
}

// Pixels of a data colour: axes, frame and text are grey to black on white.
bool coloured(const std::array<uint8_t, 3>& p) {
  auto [lo, hi] = std::minmax({p[0], p[1], p[2]});
  return hi - lo > 60;
}

size_t coloured_pixels(const image& img) {
  return static_cast<size_t>(
      std::count_if(img.rgb.begin(), img.rgb.end(), coloured));
}

// Where the data colours are: two plots of the same kind that draw other
// data differ here (titles are black, so they do not count).
std::vector<bool> colour_mask(const image& img) {
  std::vector<bool> out;
  for (auto& p : img.rgb)
    out.push_back(coloured(p));
  return out;
}

void check_plots(const std::string& dir,
                 const std::vector<std::string>& names) {
  for (auto& name : names) {
    CAPTURE(name);
    auto img = decode_png(dir + "/" + name);
    REQUIRE_MESSAGE(img.error.empty(), img.error);
    CHECK(img.width >= 400);
    CHECK(img.height >= 300);
    // Non-blank: data drawn in colour, not just axes and labels.
    CHECK(coloured_pixels(img) > 500);
  }
}

} // namespace

TEST_CASE("sim --plot-dir renders every plot, into any directory name") {
  temp_dir tmp;
  auto dir = tmp.file("plots 'of' \"sim\"");
  auto res =
      run_process({dualpath_binary(), "sim", "--quiet", "--agents", "48",
                   "--turns", "2", "--aps-sweep", "2,8", "--plot-dir", dir});
  REQUIRE_MESSAGE(res.status == 0, res.err);
  check_plots(dir, {"jct.png", "agents_done.png", "snic_basic.png",
                    "snic_dualpath.png", "snic_oracle.png", "ttft_cdf.png",
                    "ttft_aps.png"});
  // Two modes' storage-NIC plots draw different data: Basic reads on the
  // prefill side only, DualPath on both.
  auto basic = decode_png(dir + "/snic_basic.png");
  auto dual = decode_png(dir + "/snic_dualpath.png");
  REQUIRE(basic.rgb.size() == dual.rgb.size());
  CHECK(colour_mask(basic) != colour_mask(dual));
  // The script renders again by hand, in the directory, as documented.
  std::ifstream script{dir + "/plots.gnuplot"};
  std::string text{std::istreambuf_iterator<char>{script}, {}};
  CHECK(text.find(dir) == std::string::npos);
  CHECK(text.find("'snic_oracle.dat'") != std::string::npos);
}

TEST_CASE("run --plot-dir: the sampled storage-NIC timelines are drawn") {
  temp_dir tmp;
  auto dir = tmp.file("run plots");
  auto res = run_process({dualpath_binary(),
                          "run",
                          "--quiet",
                          "--agents",
                          "6",
                          "--turns",
                          "1",
                          "--prefill-nodes",
                          "1",
                          "--decode-nodes",
                          "1",
                          "--hardware",
                          "paper-hopper",
                          "--model",
                          "ds-660b",
                          "--set",
                          "hardware.gpus_per_node=2",
                          "--set",
                          "model.total_params=37e9",
                          "--byte-scale",
                          "656",
                          "--time-scale",
                          "20",
                          "--mode",
                          "basic,dualpath",
                          "--plot-dir",
                          dir});
  REQUIRE_MESSAGE(res.status == 0, res.err);
  check_plots(dir, {"jct.png", "agents_done.png", "snic_basic.png",
                    "snic_dualpath.png", "ttft_cdf.png"});
  auto basic = decode_png(dir + "/snic_basic.png");
  auto dual = decode_png(dir + "/snic_dualpath.png");
  REQUIRE(basic.rgb.size() == dual.rgb.size());
  CHECK(colour_mask(basic) != colour_mask(dual));
}

TEST_CASE("--plot-dir problems are reported before any work") {
  temp_dir tmp;
  auto file = tmp.file("not-a-dir");
  dualpath::test::write_file(file, "x");
  for (auto cmd : {"run", "sim"}) {
    CAPTURE(cmd);
    auto res =
        run_process({dualpath_binary(), cmd, "--quiet", "--plot-dir", file});
    CHECK(res.status == 2);
    CHECK(res.out.empty());
    CHECK(res.err.find("--plot-dir: cannot write '" + file + "'")
          != std::string::npos);
    // Without gnuplot on PATH the run does not start either.
    auto nognu =
        run_process({"/usr/bin/env", "PATH=/nonexistent", dualpath_binary(),
                     cmd, "--quiet", "--plot-dir", tmp.file("p")});
    CHECK(nognu.status == 2);
    CHECK(nognu.err.find("gnuplot") != std::string::npos);
  }
}
