// The studies at their tiny size: each table's numbers against the raw rows and against an
// independent computation of some of them, and the folder's files.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/inputs.hpp"
#include "helpers.hpp"
#include "models/transformer.hpp"
#include "npy_helpers.hpp"
#include "studies/study.hpp"

using namespace attnlab;
using namespace attnlab::studies;
using attnlab::test::read_text;
using attnlab::test::TempDir;

namespace {

StudyResult tiny(const std::string& name, const TempDir& dir) {
  StudyOptions o;
  o.out_dir = dir.file(name);
  o.size = Size::tiny;
  o.progress = false;
  return run_study(name, o);
}

// The leading number of a table cell ("0.681 (0.678..0.685)" -> 0.681).
double number(const std::string& cell) {
  std::istringstream in(cell);
  double x = NAN;
  in >> x;
  return x;
}

// The value of `column` in the first raw row whose cells match every (column, value) pair.
double raw_value(const Csv& csv, std::initializer_list<std::pair<std::string, std::string>> match,
                 const std::string& column) {
  auto index = [&](const std::string& name) {
    const auto it = std::find(csv.columns.begin(), csv.columns.end(), name);
    if (it == csv.columns.end()) FAIL("rows.csv has no column " << name);
    return std::size_t(it - csv.columns.begin());
  };
  std::vector<std::pair<std::size_t, std::string>> wanted;
  for (const auto& [c, v] : match) wanted.emplace_back(index(c), v);
  for (const auto& row : csv.rows) {
    bool ok = true;
    for (const auto& [i, v] : wanted) ok = ok && row[i] == v;
    if (ok) return std::stod(row[index(column)]);
  }
  FAIL("no raw row matches");
  return NAN;
}

// The folder a study wrote: report.md holds the table, rows.csv the rows, meta.json the context.
void check_files(const StudyResult& r, const TempDir& dir) {
  const std::string folder = dir.file(r.name);
  const std::string report = read_text(folder + "/report.md");
  CHECK(report.find(r.table.markdown()) != std::string::npos);
  CHECK(report.find("## Context") != std::string::npos);
  CHECK(read_text(folder + "/rows.csv") == r.rows.text());
  const auto meta = nlohmann::json::parse(read_text(folder + "/meta.json"));
  CHECK(meta.value("study", "") == r.name);
  CHECK(meta.contains("git_commit"));
  CHECK(meta.contains("load_average"));
  CHECK(meta.contains("load_after"));
  if (std::system("gnuplot -V >/dev/null 2>&1") == 0) {
    CHECK_FALSE(r.plots.pngs.empty());
    for (const auto& png : r.plots.pngs) CHECK(std::filesystem::file_size(png) > 1000);
  } else {
    WARN("gnuplot not found: PNGs not checked");
  }
}

std::string row_with(const Table& t, const std::string& first) {
  for (const auto& row : t.rows)
    if (row[0] == first) return row[1];
  FAIL("no table row " << first);
  return "";
}

}  // namespace

TEST_CASE("study names and errors", "[studies]") {
  CHECK(study_names().front() == "spectrum");
  test::require_error([] { run_study("spectra", {}); }, {"'spectra'", "spectrum"});
  test::require_error([] { parse_size("huge"); }, {"'huge'", "tiny"});
}

TEST_CASE("spectrum: shares of the singular values, checked by an independent SVD", "[studies]") {
  TempDir dir("studies");
  const StudyResult r = tiny("spectrum", dir);
  check_files(r, dir);
  REQUIRE(r.table.rows.size() == 4 + 2 + 1);  // 4 inputs, 2 model layers, the paper's row
  CHECK(r.table.header[1].find("first 16") != std::string::npos);  // N/4 at N = 64
  for (const std::string source : {"gaussian:temp=1", "local:width=32", "layer 2"}) {
    INFO(source);
    // The table shows the rows' mean at k = 16; every curve rises to 1 at k = N.
    CHECK(number(row_with(r.table, source)) ==
          Approx(raw_value(r.rows, {{"source", source}, {"k", "16"}}, "cumulative_mean")).margin(5e-4));
    CHECK(raw_value(r.rows, {{"source", source}, {"k", "64"}}, "cumulative_mean") == Approx(1.0));
  }
  // Independently: P of the local input as the fp64 reference's output for v = identity, one
  // float64 SVD per head, the share of the first 16 singular values averaged over the heads.
  const QKV in = make_inputs("local:width=32", 1, 2, 64, 16, 1);
  Tensor identity = xt::zeros<float>({1ul, 2ul, 64ul, 64ul});
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 64; ++i) identity(0, h, i, i) = 1;
  const Tensor64 p = reference_attention(in.q, in.k, identity, Mask{});
  double share = 0;
  for (std::size_t h = 0; h < 2; ++h) {
    const xt::xtensor<double, 2> ph = xt::view(p, 0, h, xt::all(), xt::all());
    const auto s = std::get<1>(xt::linalg::svd(ph, false, false));
    share += xt::sum(xt::view(s, xt::range(0, 16)))() / xt::sum(s)() / 2;
  }
  // float32 P (ours) against float64 P: singular values agree to about 1e-6.
  CHECK(number(row_with(r.table, "local:width=32")) == Approx(share).margin(6e-4));
}
