#include "harness/plot.hpp"

#include <cstdio>
#include <cstdlib>

#include "harness/meta.hpp"

namespace attnlab::harness {
namespace fs = std::filesystem;
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

std::string gp_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '`') c = '\'';  // gnuplot runs `...` as a shell command, even inside strings
    out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  }
  return out + "\"";
}

Plotter::Plotter(fs::path dir, std::string gnuplot, PlotFiles& output)
    : dir_(std::move(dir)), gnuplot_(std::move(gnuplot)), output_(output) {
  fs::create_directories(dir_);
  const std::string probe =
      shell_quote(gnuplot_) + " -e " + shell_quote("set terminal pngcairo") + " >/dev/null 2>&1";
  const std::string exists = shell_quote(gnuplot_) + " -V >/dev/null 2>&1";
  available_ = std::system(exists.c_str()) == 0;
  terminal_ = available_ && std::system(probe.c_str()) == 0 ? "pngcairo size 1100,800 font ',11'"
                                                            : "png size 1100,800";
  if (!available_)
    output_.plot_note = "gnuplot ('" + gnuplot_ +
                        "') could not be run: the .dat and .gp files "
                        "are written, run `gnuplot NAME.gp` in their folder to draw them";
}

void Plotter::plot(const std::string& name, const std::vector<Series>& series,
                   const std::string& setup, const std::string& style_all,
                   const std::string& extra) {
  std::string data, body = setup + extra + "plot ";
  for (std::size_t s = 0; s < series.size(); ++s) {
    data += "# " + series[s].title + "\n";
    for (const auto& [x, y] : series[s].xy) data += number(x) + " " + number(y) + "\n";
    data += "\n\n";
    body += (s ? ", \\\n     '" : "'") + name + ".dat' index " + std::to_string(s) + " " +
            style_all + " title " + gp_quote(series[s].title);
  }
  if (series.empty()) body += "NaN notitle";
  raw(name, data, body + "\n");
}

void Plotter::raw(const std::string& name, const std::string& data, const std::string& body) {
  write_atomically((dir_ / (name + ".dat")).string(), data);  // each throws Error saying why
  write_script(name, body);
  output_.data_files.push_back((dir_ / (name + ".dat")).string());
  output_.data_files.push_back((dir_ / (name + ".gp")).string());
  if (available_) render(name);
}

void Plotter::write_script(const std::string& name, const std::string& body) {
  // `output` may be set from outside (gnuplot -e): render() draws into a temporary name.
  write_atomically((dir_ / (name + ".gp")).string(),
                   "# Restyle freely and rerun: gnuplot " + name + ".gp (data in " + name +
                       ".dat)\nset terminal " + terminal_ +
                       "\nif (!exists(\"output\")) output = '" + name +
                       ".png'\nset output output\n" + body);
}

void Plotter::render(const std::string& name) {
  // gnuplot draws into NAME.png.tmp, renamed over NAME.png only when it succeeded: a full disk
  // or a crash leaves no truncated PNG.
  const fs::path png = dir_ / (name + ".png"), tmp = dir_ / (name + ".png.tmp");
  const std::string cmd = "cd " + shell_quote(dir_.string()) + " && " + shell_quote(gnuplot_) +
                          " -e " + shell_quote("output='" + name + ".png.tmp'") + " " +
                          shell_quote(name + ".gp") + " >" + shell_quote(name + ".log") + " 2>&1";
  std::error_code ec;
  if (std::system(cmd.c_str()) == 0 && fs::file_size(tmp, ec) > 0 && !ec) {
    fs::rename(tmp, png, ec);
    if (!ec) {
      output_.pngs.push_back(png.string());
      return;
    }
  }
  fs::remove(tmp, ec);
  output_.plot_note = "gnuplot failed on " + name + ".gp (see " + name + ".log beside it)";
}

}  // namespace attnlab::harness
