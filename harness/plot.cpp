#include "harness/plot.hpp"

#include <cmath>
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

std::string SeriesStyle::gnuplot() const {
  return "lc rgb '" + colour + "' pt " + marker;
}

SeriesStyle series_style(std::size_t index) {
  // High-contrast colours, told apart on white and by most colour-blind readers pairwise with
  // the marker; then hues spread by the golden ratio, alternately dark and light.
  static const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                         "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
                                         "#000080", "#800000", "#008080", "#ff1493", "#556b2f",
                                         "#daa520", "#4b0082", "#00bfff", "#a0522d", "#32cd32"};
  // gnuplot's point types: filled circle, square, triangle, diamond, inverted triangle,
  // pentagon, then the open ones, then +, x, *.
  static const int kShapes[] = {7, 5, 9, 13, 11, 15, 6, 4, 8, 12, 10, 14, 1, 2, 3};
  SeriesStyle s;
  const std::size_t colours = std::size(kColours), shapes = std::size(kShapes);
  if (index < colours) {
    s.colour = kColours[index];
  } else {
    const double hue = std::fmod(0.137 + 0.6180339887 * double(index - colours), 1.0);
    const double value = index % 2 ? 0.55 : 0.85, sat = 0.9;
    const double h6 = hue * 6, f = h6 - std::floor(h6);
    const double p = value * (1 - sat), q = value * (1 - sat * f), t = value * (1 - sat * (1 - f));
    double r = value, g = t, b = p;
    switch (static_cast<int>(h6) % 6) {
      case 1:
        r = q, g = value, b = p;
        break;
      case 2:
        r = p, g = value, b = t;
        break;
      case 3:
        r = p, g = q, b = value;
        break;
      case 4:
        r = t, g = p, b = value;
        break;
      case 5:
        r = value, g = p, b = q;
        break;
      default:
        break;
    }
    char buf[8];
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", int(r * 255 + 0.5), int(g * 255 + 0.5),
                  int(b * 255 + 0.5));
    s.colour = buf;
  }
  if (index < shapes) {
    s.marker = std::to_string(kShapes[index]);
  } else {
    const std::size_t letter = (index - shapes) % 52;
    s.marker = std::string("'") + char(letter < 26 ? 'A' + letter : 'a' + letter - 26) + "'";
  }
  return s;
}

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
            style_all + " " + series_style(s).gnuplot() + " title " + gp_quote(series[s].title);
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
