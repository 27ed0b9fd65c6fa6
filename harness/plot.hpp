// gnuplot plots for reports and studies: each plot is NAME.dat (the data, one block per series)
// and NAME.gp (the script, to restyle and rerun by hand) in a folder, and NAME.png when gnuplot
// runs. Without gnuplot the .dat and .gp files are still written and a note says why no PNG.
// Every file is written under a temporary name and renamed when complete (gnuplot draws into
// NAME.png.tmp), so a failure leaves no truncated file; a failed .dat or .gp write throws Error.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace attnlab::harness {

/// One line of a plot: its legend title and its (x, y) points.
struct Series {
  std::string title;                          ///< legend entry
  std::vector<std::pair<double, double>> xy;  ///< points in drawing order
};

/// How series `index` of a plot is drawn: a colour and a point type no other series of the plot
/// shares. Colours: 20 of high contrast, then hues spread by the golden ratio; markers: gnuplot's
/// 15 point shapes (filled ones first), then the letters A-Z and a-z.
struct SeriesStyle {
  std::string colour;  ///< "#rrggbb"
  std::string marker;  ///< a gnuplot point type: "7", or a quoted letter "'A'"

  /// "lc rgb '#rrggbb' pt 7": what a plot command appends to a series.
  std::string gnuplot() const;
};
/// The style of series `index` (0-based); distinct for every index below 67, colours for all.
SeriesStyle series_style(std::size_t index);

/// What a Plotter wrote.
struct PlotFiles {
  std::vector<std::string> data_files;  ///< .dat and .gp, always written
  std::vector<std::string> pngs;        ///< only when gnuplot ran
  std::string plot_note;                ///< why there are no PNGs, when there are none
};

/// Writes plots into one folder (created) and records the files in `output`.
class Plotter {
 public:
  /// `gnuplot` is the program to run (probed once: pngcairo when it has it, else png).
  Plotter(std::filesystem::path dir, std::string gnuplot, PlotFiles& output);

  /// NAME.dat with one block per series and NAME.gp: `setup` (set commands) and `extra`, then
  /// one `plot` of every series with `style_all` ("using 1:2 with linespoints lw 2"), each series
  /// in its own colour and marker (series_style: `style_all` names neither).
  void plot(const std::string& name, const std::vector<Series>& series, const std::string& setup,
            const std::string& style_all, const std::string& extra = "");

  /// NAME.dat = `data` and NAME.gp = the terminal lines followed by `body`, for plots that
  /// need several styles.
  void raw(const std::string& name, const std::string& data, const std::string& body);

 private:
  void write_script(const std::string& name, const std::string& body);
  void render(const std::string& name);

  std::filesystem::path dir_;
  std::string gnuplot_;
  PlotFiles& output_;
  bool available_ = false;
  std::string terminal_;
};

/// A gnuplot string literal for `s` (quotes and backslashes escaped; backquotes, which gnuplot
/// would run as shell commands, replaced).
std::string gp_quote(const std::string& s);

}  // namespace attnlab::harness
